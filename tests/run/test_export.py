"""What train.py trained leaves it: a full fine-tune's checkpoint is a model folder (config.json and the tokenizer
beside the weights) that pretrained.load_pretrained and eval.py --model load, a LoRA checkpoint's adapter names its base
for eval.py --adapter, and `python -m minigrpo.run.export` writes folders transformers (and peft) load with our logits
(fp32, 1e-5). The runs are the quickstart's (--task synthetic --model tiny, full fine-tune) and a LoRA one, two
steps each; transformers and peft are the test's oracles only."""
import errno
import json
import os
import subprocess

import pytest
from safetensors import SafetensorError
import torch
from hf_oracle import hf_logits, ids

import eval as eval_py
from minigrpo.pretrained import load_pretrained
from minigrpo.run import export
from minigrpo.tokenizer import Tokenizer
from train import resolve_args, train

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"full" | "lora": (run folder, the trained model)}: the quickstart preset for two steps, and a LoRA run at a
    high learning rate so that its adapter is far from zero (B starts at zero)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, flags in (("full", ["--lora-r", "0"]), ("lora", ["--lora-r", "4", "--lr", "0.05"])):
        args = resolve_args(["--task", "synthetic", "--model", "tiny", "--steps", "2", "--device", "cpu", "--quiet",
                             "--runs-dir", str(root), "--run-name", name, *flags])
        r = train(args)
        out[name] = (r["run"], r["model"].eval())
    return out


def ckpt(run):
    return os.path.join(run, "checkpoints", "step-2")


def trained_logits(model, x):
    with torch.no_grad():
        return model(x)


def test_a_full_finetune_checkpoint_is_a_model_folder(runs):
    run, model = runs["full"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "trainer_state.pt"} <= set(os.listdir(ckpt(run)))
    x = ids()
    base = load_pretrained("tiny")
    assert (trained_logits(base, x) - trained_logits(model, x)).abs().max() > 1e-4      # the run trained
    assert torch.equal(trained_logits(load_pretrained(ckpt(run)), x), trained_logits(model, x))
    tok, byte = Tokenizer.from_pretrained(ckpt(run)), Tokenizer.from_pretrained("tiny")
    text = "<|im_start|>user\nhé ☃ 𝄞 ÿ<|im_end|>\n<think>\n</think>"
    assert tok.encode(text) == byte.encode(text) and tok.decode(byte.encode(text)) == text
    assert (tok.family, tok.vocab_size, tok.eos_ids) == (byte.family, byte.vocab_size, byte.eos_ids)


def run_eval(argv, tmp_path, capsys):
    capsys.readouterr()
    try:
        eval_py.main(["--task", "synthetic", "--limit", "2", "--max-new-tokens", "2", "--quiet", "--device", "cpu",
                      "--out", str(tmp_path / "eval"), *argv])
    except SystemExit as e:
        err = capsys.readouterr().err.strip().splitlines()
        assert e.code == 2 and len(err) == 1, err
        return err[0]
    return json.load(open(tmp_path / "eval" / "results.json"))


def test_eval_py_takes_each_checkpoint_by_its_flag(runs, tmp_path, capsys):
    full, lora = runs["full"][0], runs["lora"][0]
    done = run_eval(["--model", full], tmp_path / "a", capsys)              # a run folder: its latest checkpoint
    assert done["settings"]["model"] == ckpt(full) and "model" in done["results"]
    done = run_eval(["--adapter", lora], tmp_path / "b", capsys)            # the base: what the adapter names
    assert done["settings"]["model"] == "tiny" and set(done["results"]) == {"base", "adapter"}
    named = tmp_path / "named"                                              # an adapter naming another base
    os.makedirs(named)
    src = os.path.join(ckpt(lora), "adapter")
    config = json.load(open(os.path.join(src, "adapter_config.json")))
    (named / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": ckpt(full)}))
    os.link(os.path.join(src, "adapter_model.safetensors"), named / "adapter_model.safetensors")
    assert run_eval(["--adapter", str(named)], tmp_path / "e", capsys)["settings"]["model"] == ckpt(full)
    line = run_eval(["--adapter", full], tmp_path / "c", capsys)
    assert line.startswith("eval.py: error: --adapter") and "pass it as --model" in line
    line = run_eval(["--model", ckpt(lora)], tmp_path / "d", capsys)
    assert line.startswith("eval.py: error: --model") and "pass it as --adapter" in line


def hf_model(folder):
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info     # transformers' names, all of them
    return model.eval()


def test_the_quickstart_run_exports_to_transformers(runs, tmp_path, capsys):
    from transformers import AutoTokenizer
    run, model = runs["full"]
    export.main([run, str(tmp_path / "out")])
    assert capsys.readouterr().out.startswith(f"export: wrote the model of {ckpt(run)} to {tmp_path / 'out'}")
    x = ids()
    assert (hf_logits(hf_model(tmp_path / "out"), x) - trained_logits(model, x)).abs().max() <= 1e-5
    text = "<|im_start|>user\nhé ☃<|im_end|>"
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert hf_tok(text, add_special_tokens=False).input_ids == Tokenizer.from_pretrained("tiny").encode(text)
    assert (hf_tok.eos_token, hf_tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_a_lora_run_exports_merged_and_as_a_peft_adapter(runs, tmp_path):
    from peft import PeftModel
    run, model = runs["lora"]
    x = ids()
    ours = trained_logits(model, x)
    assert (trained_logits(load_pretrained("tiny"), x) - ours).abs().max() > 1e-4    # the adapter matters
    export.main([run, str(tmp_path / "merged"), "--merge"])
    assert "adapter_config.json" not in os.listdir(tmp_path / "merged")
    assert (hf_logits(hf_model(tmp_path / "merged"), x) - ours).abs().max() <= 1e-5

    export.main([run, str(tmp_path / "peft")])
    config = json.load(open(tmp_path / "peft" / "adapter_config.json"))
    assert config["base_model_name_or_path"] == str(tmp_path / "peft" / "base")    # "tiny" is minigrpo's own name
    peft = PeftModel.from_pretrained(hf_model(config["base_model_name_or_path"]), tmp_path / "peft")
    assert (hf_logits(peft, x) - ours).abs().max() <= 1e-5


def test_an_adapter_on_a_hub_or_folder_base_points_there(runs, tmp_path):
    """A base transformers can load by itself is named, not copied: a folder by its absolute path."""
    run, _ = runs["full"]
    adapter = os.path.join(ckpt(runs["lora"][0]), "adapter")
    export.main([adapter, str(tmp_path / "out"), "--base", os.path.relpath(ckpt(run))])
    assert "base" not in os.listdir(tmp_path / "out")
    config = json.load(open(tmp_path / "out" / "adapter_config.json"))
    assert config["base_model_name_or_path"] == os.path.abspath(ckpt(run))


def export_error(argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        export.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("export: error: "), err
    return err[0]


def test_bad_input_is_one_line_and_nothing_is_overwritten(runs, tmp_path, capsys):
    run, _ = runs["full"]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert "not empty" in export_error([run, str(taken)], capsys)
    assert os.listdir(taken) == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    export.main([run, str(tmp_path / "empty")])                   # an empty folder is filled
    assert "config.json" in os.listdir(tmp_path / "empty")
    assert "no such folder" in export_error([str(tmp_path / "nope"), str(tmp_path / "o1")], capsys)
    (tmp_path / "run0" / "checkpoints").mkdir(parents=True)
    assert "no checkpoints yet" in export_error([str(tmp_path / "run0"), str(tmp_path / "o2")], capsys)
    assert "parent folder" in export_error([run, str(tmp_path / "a" / "b")], capsys)
    adapter = tmp_path / "anon"
    os.makedirs(adapter)
    src = os.path.join(ckpt(runs["lora"][0]), "adapter")
    config = json.load(open(os.path.join(src, "adapter_config.json")))
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    assert "pass --base" in export_error([str(adapter), str(tmp_path / "o3")], capsys)
    sft = tmp_path / "no-tokenizer"                               # a model folder without a tokenizer
    os.makedirs(sft)
    for f in ("config.json", "model.safetensors"):
        os.link(os.path.join(ckpt(run), f), sft / f)
    assert "pass --tokenizer" in export_error([str(sft), str(tmp_path / "o4")], capsys)
    export.main([str(sft), str(tmp_path / "o4"), "--tokenizer", "tiny"])
    assert not [f for f in os.listdir(tmp_path) if f.startswith((".tmp", "o1", "o2", "o3"))]



def test_an_empty_out_that_cannot_be_renamed_onto_is_filled_in_place(runs, tmp_path, monkeypatch):
    """An empty OUT that is a mount point (a container's volume): the kernel refuses to remove or rename onto it
    (EBUSY, played here: a mount needs root). The export is staged inside it and its files moved up, nothing else
    left there."""
    run, _ = runs["lora"]
    out = tmp_path / "volume"
    out.mkdir()
    rmdir, replace = os.rmdir, os.replace

    def busy(call):
        def refuse(a, b=None, **k):
            if str(out) in (os.path.abspath(a), b and os.path.abspath(b)):
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(out))
            return call(a, **k) if b is None else call(a, b, **k)
        return refuse
    monkeypatch.setattr(os, "rmdir", busy(rmdir))
    monkeypatch.setattr(os, "replace", busy(replace))
    export.main([run, str(out)])
    assert sorted(os.listdir(out)) == ["adapter_config.json", "adapter_model.safetensors", "base", "tokenizer.json",
                                       "tokenizer_config.json"]
    config = json.load(open(out / "adapter_config.json"))
    assert config["base_model_name_or_path"] == str(out / "base") and os.listdir(tmp_path) == ["volume"]


def test_what_a_killed_export_left_in_out_is_removed_a_live_ones_is_not(runs, tmp_path, capsys):
    """A SIGKILL leaves the stage in OUT; the next export removes it when no process has its pid. A stage whose
    exporter still runs (this process) makes OUT not empty: nothing of it is touched."""
    run, _ = runs["full"]
    out = tmp_path / "out"
    dead = _dead_pid()
    (out / f"{export.STAGE}out-{dead}").mkdir(parents=True)
    export.main([run, str(out)])
    assert "config.json" in os.listdir(out) and not [f for f in os.listdir(out) if f.startswith(export.STAGE)]
    live = tmp_path / "live"
    (live / f"{export.STAGE}live-{os.getpid()}").mkdir(parents=True)
    assert "not empty" in export_error([run, str(live)], capsys)
    assert os.listdir(live) == [f"{export.STAGE}live-{os.getpid()}"]


def _dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid

FULL = "stopping: the export {out} could not be written (No space left on device; "


@pytest.mark.parametrize("err, code, line", [
    (OSError(30, "Read-only file system"), 2, "error: {out}: cannot write the export in {dir} (Read-only file "
                                              "system); pass an OUT on a disk you can write, with room for it "
                                              "(nothing was written)"),
    (OSError(28, "No space left on device"), 4, FULL),
    (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"), 4, FULL)],
    ids=["read-only", "full", "full-safetensors"])
@pytest.mark.parametrize("there", [False, True], ids=["new-out", "empty-out"])
def test_an_export_to_a_full_or_read_only_disk_is_one_line(runs, tmp_path, capsys, monkeypatch, err, code, line,
                                                           there):
    """The OS refuses the weights file (root writes through mode bits, so the kernel's answer is played here; the
    safetensors writer's own words for a full disk too): one line naming the folder and the cause, nothing left
    behind. A read-only OUT is the user's to change (exit 2); a full disk is a runtime stop (exit 4), as in
    train.py, and says so in errno's words."""
    run, _ = runs["full"]

    def refused(*a, **k):
        raise err
    monkeypatch.setattr(export, "write_model", refused)
    out = tmp_path / "out"
    if there:                  # staged inside it: the folder named is OUT itself
        out.mkdir()
    with pytest.raises(SystemExit) as e:
        export.main([run, str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == code and len(lines) == 1, lines
    assert lines[0].startswith("export: " + line.format(out=out, dir=out if there else tmp_path)), lines
    assert lines[0].endswith("nothing was written)" if code == 2 else "free some space; nothing was written")
    assert os.listdir(tmp_path) == (["out"] if there else []) and (not there or os.listdir(out) == [])


def test_the_exported_weights_are_readable_as_the_umask_allows(runs, tmp_path):
    """model.safetensors is a model to share: its mode follows the umask (0644 under 022), not a private 0600; so
    does a full fine-tune checkpoint's, a model folder too (the run folder around it is what is private)."""
    old = os.umask(0o022)
    try:
        export.main([runs["full"][0], str(tmp_path / "out")])
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "out" / "model.safetensors").st_mode & 0o777) == oct(0o644)
    ckpt = os.path.join(runs["full"][0], "checkpoints", "step-2", "model.safetensors")
    assert oct(os.stat(ckpt).st_mode & 0o777) == oct(0o666 & ~old)
