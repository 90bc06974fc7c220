"""What every task's evaluation shares: the model and its report columns, batched greedy generation, and the
report files (results.json, report.md, examples.jsonl, plots). eval.py is the command line; minigrpo/evals/<task>.py
hold each task's metrics and tables. Why one model serves both the "base" and the "adapter" column: eval.py's
docstring.
"""
import contextlib
import json
import os
import shlex
import sys
import time

from minigrpo.run import checkpoints
from minigrpo.errors import UsageError, first_line
from minigrpo.machine import pick_device, pick_dtype
from minigrpo.metrics import mean
from minigrpo.seeds import derive_seed
from minigrpo.evals import report
from minigrpo.lora import adapters_disabled, fold_lora
from minigrpo.run.lora_files import load_adapter
from minigrpo.pretrained import load_pretrained
from minigrpo.run import plots
from minigrpo.sampler import Settings, sample
from minigrpo.tokenizer import Tokenizer


def run_checkpoint(path: str, flag: str = "") -> str:
    """A run folder (runs/<name>, holding checkpoints/) -> its latest checkpoint; any other path as it is."""
    ckpts = os.path.join(path, "checkpoints")
    if not os.path.isdir(ckpts):
        return path
    latest = checkpoints.latest(ckpts)
    if latest is None:
        raise UsageError(f"{flag} {path}: the run has no checkpoints yet".lstrip())
    return latest


def adapter_folder(path: str) -> str | None:
    """The LoRA adapter folder at `path`: the folder itself, or a checkpoint's adapter/; None if neither."""
    for folder in (path, os.path.join(path, "adapter")):
        if os.path.exists(os.path.join(folder, "adapter_config.json")):
            return folder
    return None


def resolve_model(path: str | None) -> str | None:
    """--model: a hub id, 'tiny', a model folder, a full fine-tune checkpoint (train.py writes config.json and the
    tokenizer beside its weights) or a run folder (its latest checkpoint)."""
    if path is None or not os.path.isdir(path):
        return path
    folder = run_checkpoint(path, "--model")
    if adapter_folder(folder):
        raise UsageError(f"--model {path}: a LoRA adapter, not a model; pass it as --adapter (its base model is "
                         "then --model by default)")
    if not os.path.exists(os.path.join(folder, "config.json")) and \
            os.path.exists(os.path.join(folder, "trainer_state.pt")):
        raise UsageError(f"--model {path}: a full fine-tune checkpoint without config.json (an older minigrpo "
                         "wrote it): copy its base model's config.json and tokenizer files into it")
    return folder


def resolve_adapter(path: str) -> str:
    """An adapter folder; a checkpoint folder (train.py's checkpoints/step-N holds adapter/); or a run folder
    (its latest checkpoint)."""
    path = run_checkpoint(path, "--adapter")
    folder = adapter_folder(path)
    if folder is not None:
        return folder
    if os.path.exists(os.path.join(path, "model.safetensors")):
        raise UsageError(f"--adapter {path}: a full fine-tune (model.safetensors, no adapter); pass it as --model")
    raise UsageError(f"--adapter {path}: no adapter_config.json there (pass a LoRA adapter folder, a checkpoint "
                     "folder, or a run folder; a full fine-tune is evaluated with --model)")


def adapter_base(adapter: str, flag: str = "--adapter") -> str | None:
    """The base model an adapter names (adapter_config.json's base_model_name_or_path), if it names one."""
    try:
        with open(os.path.join(adapter, "adapter_config.json")) as f:
            base = json.load(f).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {adapter}: unreadable adapter_config.json ({first_line(e)})".lstrip()) from None
    return base if isinstance(base, str) and base else None


# -----------------------------------------------------------------------------------------------------------------
# The model, its columns, and batched generation

def load_model(args, tokenizer=None, fold=None):
    """(model, tokenizer, columns): columns are (label, context manager factory) pairs, one per report column.
    `tokenizer`: load it from there instead of --model (a from-scratch model's folder has no tokenizer.json).
    `fold`: a LoRA adapter folded into the weights before --adapter goes on (see evals/mdp.mdp_stage_base)."""
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    try:
        model = load_pretrained(args.model, dtype=dtype, device=device)
        tok = Tokenizer.from_pretrained(tokenizer or args.model)
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {args.model}: {first_line(e)}") from None
    if fold is not None:
        try:
            load_adapter(model, fold, dropout=0.0)
            fold_lora(model)
        except (OSError, ValueError) as e:
            raise UsageError(f"--adapter {args.adapter} sits on {fold}: {first_line(e)}") from None
    if args.adapter is None:
        return model.eval(), tok, [("model", contextlib.nullcontext)]
    try:
        load_adapter(model, args.adapter, dropout=0.0)  # no dropout at eval, whatever the adapter trained with
    except (OSError, ValueError) as e:
        raise UsageError(f"--adapter {args.adapter}: {first_line(e)}") from None
    return model.eval(), tok, [("base", lambda: adapters_disabled(model)), ("adapter", contextlib.nullcontext)]


def progress(items, desc, args, total=None):
    from tqdm import tqdm
    total = len(items) if total is None else total
    return tqdm(items, desc=desc, total=total, disable=args.quiet or total < 2, dynamic_ncols=True, file=sys.stderr)


def complete(model, tok, args, conversations, stop_strings=(), desc="generate") -> list:
    """One completion (text) per chat conversation, in the given order. Prompts are sorted longest first so each
    batch holds similar lengths (less left padding); pads are masked, so a greedy answer does not depend on its
    batch (up to float rounding)."""
    prompts = [tok.chat(c, enable_thinking=args.enable_thinking) for c in conversations]
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    batches = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    texts = [None] * len(prompts)
    settings = Settings(n=1, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                        stop_strings=tuple(stop_strings), compile=args.compile)
    for k, rows in enumerate(progress(batches, desc, args)):
        samples = sample(model, [prompts[i] for i in rows], settings, tokenizer=tok,
                         seed=derive_seed(args.sample_seed, "eval batch", k))
        for i, s in zip(rows, samples):
            texts[i] = s.text
    return texts


def write_jsonl(rows, path):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, default=float) + "\n")


# -----------------------------------------------------------------------------------------------------------------
# Report files

def run_curves(args, out) -> list:
    """Training curves of --run: reward from metrics.jsonl, and for gsm8k the per-step accuracy and format
    compliance of the training samples (samples.jsonl's reward details), which metrics.jsonl does not hold."""
    if args.run is None:
        return []
    rows = plots.read_metrics(os.path.join(args.run, "metrics.jsonl"))
    samples = os.path.join(args.run, "samples.jsonl")
    if os.path.exists(samples):
        by_step = per_step_accuracy(plots.read_metrics(samples))
        rows = [{**r, **by_step.get(r.get("step"), {})} for r in rows]
    keys = [k for k in ("reward_mean", "train_accuracy", "train_lenient_accuracy", "train_format_compliance",
                        "score_turn0", "recovery", "bad_start_share", "kl", "completion_len")
            if any(r.get(k) is not None for r in rows)]
    path = report.plot_curves(rows, os.path.join(out, "training_curves.png"), keys, smooth=max(1, len(rows) // 50))
    return [path] if path else []


def per_step_accuracy(samples: list) -> dict:
    """{step: {train_accuracy, train_lenient_accuracy, train_format_compliance}} from gsm8k sample details."""
    steps = {}
    for s in samples:
        info = s.get("info") or {}
        if "correct" in info:
            steps.setdefault(s["step"], []).append(info)
    return {step: {"train_accuracy": mean([float(i["correct"]) for i in infos]),
                   "train_lenient_accuracy": mean([float(i.get("lenient_correct", False)) for i in infos]),
                   "train_format_compliance": mean([float(i.get("format_kind") == "well") for i in infos])}
            for step, infos in steps.items()}


def write_outputs(args, out, payload: dict, tables: list, plots: list, notes: list):
    settings = {k: v for k, v in vars(args).items() if k != "argv"}
    report.write_json({"task": args.task, "command": command(args), "settings": settings, **payload},
                      os.path.join(out, "results.json"))
    decoding = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top-p {args.top_p}"
    lines = [f"# Evaluation: {args.task}", "",
             f"- model: `{args.model}`" + (f", adapter: `{args.adapter}` (base = the same weights with the "
                                           "adapter disabled)" if args.adapter else ""),
             f"- decoding: {decoding}, max {args.max_new_tokens} new tokens; sampling seed {args.sample_seed}",
             f"- command: `{command(args)}`", f"- date: {time.strftime('%Y-%m-%d %H:%M:%S')}", ""]
    for title, table in tables:
        lines += [f"## {title}", "", table.rstrip(), ""]
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots if p] + [""]
    if notes:
        lines += ["## Notes", ""] + notes + [""]
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def command(args) -> str:
    return "python eval.py " + " ".join(shlex.quote(a) for a in args.argv)
