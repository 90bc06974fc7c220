"""Export what train.py trained to a folder transformers loads:

    python -m minigrpo.run.export runs/synthetic-X exported/            # a run: its latest checkpoint
    python -m minigrpo.run.export runs/gsm8k-X/checkpoints/step-500 out/ --merge

SOURCE is a run folder (its latest checkpoint), a checkpoint folder (checkpoints/step-N), a LoRA adapter folder or a
model folder. What lands in OUT:

    full fine-tune    config.json, model.safetensors (transformers' tensor names), the tokenizer's files:
                      AutoModelForCausalLM.from_pretrained(OUT) and AutoTokenizer.from_pretrained(OUT)
    LoRA, --merge     the same, with the adapter folded into the base weights
    LoRA              the PEFT adapter (adapter_config.json, adapter_model.safetensors) and the tokenizer's files;
                      adapter_config.json's base_model_name_or_path points to the base model (a hub id or an
                      absolute folder); a base transformers cannot load by a name (tiny, tiny-qwen3.5; an mdp
                      pipeline's stage adapter, which sits on its run's sft_adapter folded in) is written to OUT/base
                      and pointed to there: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), OUT)

OUT must not exist or be empty: the export is built in a temporary folder and moved into place, so it never
overwrites a file and a failed export leaves nothing behind (beside a new OUT and renamed onto it; inside an empty
one, which may be a mounted volume that cannot be renamed onto, and its files moved up). Every stop is one line
with train.py's exit codes (docs/training.md, "How a run ends"): 2 for bad input or an OUT that cannot be written,
4 for a full disk.
"""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors import SafetensorError

from minigrpo.errors import StopRun
from minigrpo.evals.common import UsageError as ExportError, adapter_base, adapter_folder, first_line, run_checkpoint
from minigrpo.evals.mdp import mdp_pipeline_run, mdp_stage_base
from minigrpo.files import disk_full, full_disk_line
from minigrpo.lora import fold_lora
from minigrpo.run import checkpoints, cli, lock
from minigrpo.run.lora_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS, export_merged, load_adapter
from minigrpo.model import Qwen
from minigrpo.pretrained import load_pretrained, parse_dtype
from minigrpo.tokenizer import TINY, Tokenizer


# -----------------------------------------------------------------------------------------------------------------
# What the source is

def resolve_source(path: str) -> tuple[str, str]:
    """("lora", adapter folder) or ("full", model folder) for a run, checkpoint, adapter or model folder."""
    if not os.path.isdir(path):
        raise ExportError(f"{path}: no such folder (pass a run folder, a checkpoint folder, an adapter or a model)")
    path = run_checkpoint(path)
    adapter = adapter_folder(path)
    if adapter is not None:
        return "lora", adapter
    if os.path.isfile(os.path.join(path, "config.json")):
        return "full", path
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        raise ExportError(f"{path}: model.safetensors without config.json (a checkpoint of an older minigrpo): "
                          "copy its base model's config.json into it")
    raise ExportError(f"{path}: neither a checkpoint, a run, an adapter ({ADAPTER_CONFIG}) nor a model "
                      "(config.json)")


def load_tokenizer(name: str, flag_hint: str) -> Tokenizer:
    try:
        return Tokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ExportError(f"{name}: no usable tokenizer ({first_line(e)}); {flag_hint}") from None


# -----------------------------------------------------------------------------------------------------------------
# Writing the folder

STAGE = ".tmp-export-"     # the temporary folder's name: STAGE + OUT's name + "-" + the exporting pid


def write_model(model, tok, out: str):
    """config.json, model.safetensors in transformers' names (a LoRA model merged), the tokenizer's files."""
    export_merged(model, None, out)
    tok.save_files(out)


def write_adapter(adapter: str, base: str, tok, out: str):
    """The PEFT adapter with base_model_name_or_path = `base`, and the tokenizer's files."""
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(adapter, ADAPTER_WEIGHTS), os.path.join(out, ADAPTER_WEIGHTS))
    with open(os.path.join(adapter, ADAPTER_CONFIG)) as f:
        config = json.load(f)
    with open(os.path.join(out, ADAPTER_CONFIG), "w") as f:
        json.dump({**config, "base_model_name_or_path": base}, f, indent=2)
    tok.save_files(out)


def export(source: str, out: str, merge: bool = False, base: str | None = None, tokenizer: str | None = None,
           dtype=None) -> str:
    """Export `source` to the new folder `out`; returns what was written, in words. `base` overrides the base
    model an adapter names; `tokenizer` the tokenizer (default: the model folder's, or the adapter's base's)."""
    kind, folder = resolve_source(source)
    check_out(out)
    dtype = parse_dtype(dtype)
    inside = os.path.isdir(out)
    where = os.path.abspath(out) if inside else os.path.dirname(os.path.abspath(out))
    tmp = os.path.join(where, f"{STAGE}{os.path.basename(os.path.abspath(out))}-{os.getpid()}")
    try:
        os.makedirs(tmp)
        what = fill(kind, folder, tmp, os.path.abspath(out), merge, base, tokenizer, dtype)
        if inside:             # renames within one folder's disk: none can fail for room
            for name in os.listdir(tmp):
                os.replace(os.path.join(tmp, name), os.path.join(out, name))
        else:
            os.replace(tmp, out)
    except (OSError, RuntimeError, SafetensorError) as e:    # a read-only or full disk: the folder and the OS's cause
        if not checkpoints.write_error(e):
            raise
        if disk_full(e):                                     # a runtime stop, as a full disk is in train.py
            raise StopRun(full_disk_line(f"the export {out}", where)) from None
        raise ExportError(f"{out}: cannot write the export in {where} ({checkpoints.write_error(e)}); "
                          "pass an OUT on a disk you can write, with room for it (nothing was written)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return what


def check_out(out: str):
    if os.path.isdir(out):
        remove_dead_stages(out)
    if os.path.isdir(out) and os.listdir(out):
        raise ExportError(f"{out}: the folder exists and is not empty; pass a new or empty folder (nothing was "
                          "overwritten)")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"{out}: a file of that name exists; pass a new folder")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ExportError(f"{out}: its parent folder {parent} does not exist")


def remove_dead_stages(out: str):
    """What an export killed outright (SIGKILL; every other stop removes its own) left in OUT: its temporary folder,
    named for its pid, which no running process has now."""
    for name in os.listdir(out):
        pid = name.rpartition("-")[2]
        if name.startswith(STAGE) and pid.isdigit() and not lock.running(int(pid)):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)


def fill(kind, folder, tmp, final, merge, base, tokenizer, dtype) -> str:
    """Write the export into `tmp`, which will be renamed to `final` (the absolute path a pointer names)."""
    if kind == "full":
        if base is not None:
            raise ExportError(f"--base {base}: {folder} is a full model, not an adapter; drop --base")
        tok = load_tokenizer(tokenizer or folder, "pass --tokenizer (a hub id, a folder, or 'tiny')")
        write_model(load_model(folder, dtype), tok, tmp)
        return f"the model of {folder}"
    base = base or adapter_base(folder, flag="")
    if base is None:
        raise ExportError(f"{folder}/{ADAPTER_CONFIG} names no base model; pass --base (the --model it was "
                          "trained on)")
    tok = load_tokenizer(tokenizer or base, "pass --tokenizer (a hub id, a folder, or 'tiny')")
    # a stage adapter of a LoRA-SFT mdp pipeline run sits on the SFT weights: its run's sft_adapter folded in
    fold = mdp_stage_base(argparse.Namespace(adapter=folder),
                          mdp_pipeline_run(argparse.Namespace(model=None, adapter=folder)))
    on = f"{base}" + (f" with {fold} folded in" if fold else "")
    if merge:
        model = load_model(base, dtype, fold)
        try:
            load_adapter(model, folder, dropout=0.0)
        except (OSError, ValueError) as e:
            raise ExportError(f"{folder}: does not fit its base {base} ({first_line(e)}); pass --base") from None
        write_model(model, tok, tmp)
        return f"{folder} merged into {on}"
    if base in TINY or fold:   # a base transformers cannot load by a name: written beside the adapter
        write_model(load_model(base, dtype, fold), tok, os.path.join(tmp, "base"))
        base = os.path.join(final, "base")
    elif os.path.isdir(base):
        base = os.path.abspath(base)
    write_adapter(folder, base, tok, tmp)
    return f"the adapter {folder} on {on}"


def load_model(name: str, dtype, fold: str | None = None) -> Qwen:
    """The model `name`, with the LoRA adapter `fold` (if any) folded into its weights."""
    try:
        model = load_pretrained(name, dtype=dtype)
        if fold is not None:
            load_adapter(model, fold, dropout=0.0)
            fold_lora(model)
        return model
    except (OSError, ValueError) as e:
        raise ExportError(f"{name}: cannot load the model ({first_line(e)})") from None


# -----------------------------------------------------------------------------------------------------------------
# The command line

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minigrpo.run.export",
                                description="Export a run or checkpoint to a folder transformers (and peft) load.")
    p.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                   help="run folder (its latest checkpoint), checkpoint folder, LoRA adapter or model folder")
    p.add_argument("out", metavar="OUT", help="new (or empty) output folder")
    p.add_argument("--merge", action="store_true", help="LoRA: fold the adapter into the base weights (one "
                   "model folder) instead of writing a PEFT adapter")
    p.add_argument("--base", help="LoRA: the base model (default: the one adapter_config.json names)")
    p.add_argument("--tokenizer", help="where the tokenizer comes from (default: the model folder, or the base)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the exported weights' dtype (default float32, as trained)")
    return p


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    with cli.ending("export", lambda e: "nothing was written"):    # one line and the exit code of its cause
        what = export(args.source, args.out, merge=args.merge, base=args.base, tokenizer=args.tokenizer,
                      dtype=args.dtype)
    print(f"export: wrote {what} to {args.out}: {', '.join(sorted(os.listdir(args.out)))}")
    return args.out


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
