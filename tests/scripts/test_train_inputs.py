"""Bad input to train.py is one line naming the flag, file or key and what to do, exit code 2, and nothing written:
every flag's range and the rules between flags are checked before any model or data is loaded; a model folder, a
config.json value, a data file or the hub that cannot be used is named with the file (and line). The CPU thread
count is chosen, said and recorded; the final table goes to stdout."""
import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
from safetensors.torch import save_file

import train
from minigrpo import machine
from minigrpo.pretrained import load_pretrained
from minigrpo.tasks.base import DataState, next_examples

from repo_root import ROOT

SYN = ["--task", "synthetic", "--model", "tiny", "--quiet", "--steps", "1"]


@contextmanager
def deadline(seconds):
    """Fail, rather than hang, when the code under test loops forever (an empty train split did)."""
    def expire(*_):
        raise AssertionError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line_error(argv, runs, capsys, code=2):
    """Run train.main(argv) with --runs-dir runs: it must exit with `code` and print exactly one stderr line."""
    with deadline(120), pytest.raises(SystemExit) as e:
        train.main([*argv, "--runs-dir", str(runs)])
    assert e.value.code == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error: "), err
    return err[0]


# -----------------------------------------------------------------------------------------------------------------
# Flags: refused before any work. The model loader is poisoned, so a flag error that got past the checks fails.

FLAG_ERRORS = [
    (["--steps", "-5"], "--steps -5"), (["--steps", "0"], "--steps 0"),
    (["--micro-batch", "0"], "--micro-batch 0"), (["--save-every", "0"], "--save-every 0"),
    (["--group-size", "0"], "--group-size 0"), (["--group-size", "1"], "--group-size 1"),
    (["--tasks-per-step", "0"], "--tasks-per-step 0"), (["--lora-r", "-1"], "--lora-r -1"),
    (["--algo", "sft"], "--algo sft"), (["--temperature", "0"], "--temperature 0"),
    (["--temperature", "nan"], "--temperature nan"), (["--lr", "0"], "--lr 0"), (["--lr", "inf"], "--lr inf"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0"), (["--top-p", "0"], "--top-p 0"),
    (["--top-p", "1.5"], "--top-p 1.5"), (["--top-k", "-1"], "--top-k -1"), (["--warmup", "-1"], "--warmup -1"),
    (["--beta", "-0.1"], "--beta -0.1"), (["--weight-decay", "-1"], "--weight-decay -1"),
    (["--max-grad-norm", "-1"], "--max-grad-norm -1"), (["--adam-beta2", "1"], "--adam-beta2 1"),
    (["--mu", "0"], "--mu 0"), (["--eval-every", "-1"], "--eval-every -1"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints -1"), (["--seed", "-1"], "--seed -1"),
    (["--threads", "0"], "--threads 0"), (["--eval-every", "1", "--eval-limit", "0"], "--eval-limit 0"),
    (["--lora-r", "4", "--lora-alpha", "0"], "--lora-alpha 0"),
    (["--lora-r", "4", "--lora-dropout", "1"], "--lora-dropout 1"),
    (["--mu", "2", "--eps-low", "1"], "--eps-low 1"), (["--mu", "2", "--eps-high", "0"], "--eps-high 0"),
    # options the run would not read
    (["--data", "x.jsonl"], "--data"),                                       # synthetic has no data file
    (["--lora-alpha", "8"], "--lora-alpha 8"),                               # the preset is a full fine-tune
    (["--lora-targets", "q_proj"], "--lora-targets"),
    (["--lora-r", "4", "--lora-targets", "q_proj,qproj"], "--lora-targets"),  # a typo of a projection
    (["--lora-experts"], "--lora-experts"),                                  # LoRA on the experts, none elsewhere
    (["--lora-r", "4", "--lora-router", "--lora-dropout", "0.1"], "--lora-router"),   # PEFT's ParamWrapper: no dropout
    (["--epochs", "2"], "--epochs"),                                         # --steps sets the length
    (["--eval-limit", "8"], "--eval-limit"),                                 # the eval is off
    (["--kl", "k1"], "--kl k1"),                                             # --beta 0: no KL term
    (["--eps-high", "0.3"], "--eps-high 0.3"),                               # --mu 1: the ratio is exactly 1
    (["--judge", "claude"], "--judge claude"), (["--judge-workers", "2"], "--judge-workers 2"),
]


@pytest.mark.parametrize("extra,flag", FLAG_ERRORS, ids=[" ".join(a) for a, _ in FLAG_ERRORS])
def test_a_bad_flag_is_one_line_before_any_work(extra, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("train() ran"))
    line = one_line_error([*SYN, *extra], tmp_path / "runs", capsys)
    assert flag in line
    assert not (tmp_path / "runs").exists()          # no run folder, nothing written


@pytest.mark.parametrize("argv,flag", [
    (["--task", "revise", "--data", "x.jsonl"], "--data"),                    # revise builds its own examples
    (["--task", "gsm8k", "--data", "missing.jsonl"], "--data missing.jsonl"),
    (["--task", "soyuz", "--judge-model", "m"], "--judge-model m"),           # the local judge has no model
    (["--task", "soyuz", "--judge", "http://x", "--judge-max-turns", "2"], "--judge-max-turns 2"),
    (["--task", "soyuz", "--judge-mode", "llm"], "--judge-mode llm"),
    (["--task", "soyuz", "--judge-retries", "0"], "--judge-retries 0"),        # the local judge does not retry
    (["--task", "soyuz", "--judge", "cmd:x", "--judge-retries", "-1"], "--judge-retries -1"),
    (["--task", "soyuz", "--judge", "cmd:x", "--judge-timeout", "0"], "--judge-timeout 0"),
])
def test_task_specific_flags_are_refused_where_unread(argv, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # missing.jsonl is relative: it must not exist
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("train() ran"))
    line = one_line_error([*argv, "--model", "tiny", "--quiet"], tmp_path / "runs", capsys)
    assert flag in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_device_that_is_not_there_is_refused(tmp_path, capsys):
    assert "--device cuda" in one_line_error([*SYN, "--device", "cuda"], tmp_path / "runs", capsys)
    assert "--device gpu" in one_line_error([*SYN, "--device", "gpu"], tmp_path / "runs", capsys)


# -----------------------------------------------------------------------------------------------------------------
# Model folders and config.json

def model_folder(path, config=None, tokenizer=False, cut=False):
    """The tiny model as a checkpoint folder: config.json (optionally replaced) and model.safetensors (cut in
    half with cut=True); no tokenizer.json, which every error below comes before."""
    m = load_pretrained("tiny")
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(m.config.raw if config is None else config(dict(m.config.raw)), f)
    weights = os.path.join(path, "model.safetensors")
    save_file({k: v.contiguous() for k, v in m.state_dict().items() if k != "lm_head.weight"}, weights)
    if cut:
        data = open(weights, "rb").read()
        open(weights, "wb").write(data[:len(data) // 2])
    return str(path)


def set_key(key, value):
    return lambda cfg: {**cfg, key: value}


@pytest.mark.parametrize("kind,build,named", [
    ("missing folder", lambda p: str(p / "nothing-here"), "nothing-here: no such checkpoint folder"),
    ("no config.json", lambda p: (os.makedirs(p / "empty"), str(p / "empty"))[1], "config.json: not found"),
    ("config a string", lambda p: model_folder(p / "m", set_key("num_hidden_layers", "four")),
     'num_hidden_layers: "four" is not an integer >= 1'),
    ("config a float", lambda p: model_folder(p / "m", set_key("hidden_size", 64.5)), "hidden_size: 64.5"),
    ("config a bool", lambda p: model_folder(p / "m", set_key("vocab_size", True)), "vocab_size: true"),
    ("config a zero", lambda p: model_folder(p / "m", set_key("num_attention_heads", 0)), "num_attention_heads: 0"),
    ("config a list", lambda p: model_folder(p / "m", lambda cfg: [cfg]), "expected a JSON object"),
    ("config heads", lambda p: model_folder(p / "m", set_key("num_key_value_heads", 3)), "not a multiple"),
    ("config tie", lambda p: model_folder(p / "m", set_key("tie_word_embeddings", "yes")), "tie_word_embeddings"),
    ("truncated weights", lambda p: model_folder(p / "m", cut=True), "model.safetensors: unreadable"),
    ("no tokenizer.json", lambda p: model_folder(p / "m"), "tokenizer.json: not found"),
])
def test_a_model_folder_that_cannot_be_used_is_one_line(kind, build, named, tmp_path, capsys):
    folder = build(tmp_path)
    line = one_line_error(["--task", "synthetic", "--model", folder, "--quiet", "--steps", "1"],
                          tmp_path / "runs", capsys)
    assert f"--model {folder}" in line and named in line, line
    assert not os.path.exists(tmp_path / "runs")     # the run folder made for it is gone, the --runs-dir too


def test_lora_targets_this_model_lacks_are_one_line(tmp_path, capsys):
    """in_proj_qkv is a projection of Qwen3.5's linear-attention layers; the tiny Qwen3 model has none."""
    line = one_line_error([*SYN, "--lora-r", "2", "--lora-targets", "in_proj_qkv"], tmp_path / "runs", capsys)
    assert "--lora-targets in_proj_qkv" in line and "no nn.Linear" in line


def test_expert_lora_on_a_dense_model_is_one_line(tmp_path, capsys):
    line = one_line_error([*SYN, "--lora-r", "2", "--lora-experts"], tmp_path / "runs", capsys)
    assert line.startswith("train.py: error: --lora-experts: LoRA on the experts: the model has no routed experts")


# -----------------------------------------------------------------------------------------------------------------
# Data files

GOOD = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}


def jsonl(path, *lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


@pytest.mark.parametrize("kind,lines,named", [
    ("empty", [], "no examples in it"),
    ("blank lines only", ["", "  "], "no examples in it"),
    ("a row without answer", [GOOD, {"question": "q"}], "line 2: no 'answer' field"),
    ("an answer not a string", [GOOD, GOOD, {"question": "q", "answer": 4}], "line 3: 'answer' is 4, not a str"),
    ("not JSON", [GOOD, "{question: 1}"], "line 2: not valid JSON"),
    ("a row not an object", [GOOD, "[1, 2]"], "line 2: expected a JSON object"),
    ("no final answer", [{"question": "q", "answer": "two"}], "line 1: answer has no '#### <number>' line"),
    ("too few for a train split", [GOOD], "no training examples"),
])
def test_a_gsm8k_data_file_that_cannot_be_used_is_one_line(kind, lines, named, tmp_path, capsys):
    data = jsonl(tmp_path / "data.jsonl", *lines)
    line = one_line_error(["--task", "gsm8k", "--model", "tiny", "--data", data, "--quiet", "--steps", "1"],
                          tmp_path / "runs", capsys)
    assert "--data" in line and named in line, line
    if kind not in ("empty", "blank lines only", "too few for a train split"):
        assert f"{data} line" in line                 # the file and the line to fix
    assert not os.path.exists(tmp_path / "runs")


def test_a_gsm8k_folder_without_its_files_is_one_line(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    line = one_line_error(["--task", "gsm8k", "--model", "tiny", "--data", str(tmp_path / "data"), "--quiet"],
                          tmp_path / "runs", capsys)
    assert "lacks train.jsonl, test.jsonl" in line


def test_an_empty_train_split_never_reaches_the_loop():
    """next_examples on an empty split: a clear error, not a loop that never ends."""
    with deadline(10), pytest.raises(ValueError, match="empty"):
        next_examples([], 4, DataState(), 0)


@pytest.mark.parametrize("content,named", [
    ("", "not valid JSON"),
    ("[]", "non-empty list of tasks"),
    ('{"tasks": 3}', "non-empty list of tasks"),
    ('[{"prompt": "p"}]', "task 1 needs a string 'id'"),
    ('[{"id": "a", "prompt": "p"}]', "task a: needs a non-empty 'criteria' list"),
    ('[{"id": "a", "prompt": "p", "criteria": [{"id": "c1"}]}]', "criterion c1: needs a string 'text'"),
])
def test_a_soyuz_tasks_file_that_cannot_be_used_is_one_line(content, named, tmp_path, capsys):
    (tmp_path / "tasks.json").write_text(content)
    line = one_line_error(["--task", "soyuz", "--model", "tiny", "--data", str(tmp_path / "tasks.json"),
                           "--quiet", "--steps", "1"], tmp_path / "runs", capsys)
    assert f"{tmp_path / 'tasks.json'}" in line and named in line, line
    assert not os.path.exists(tmp_path / "runs")


def test_gsm8k_without_data_offline_says_to_pass_data(tmp_path):
    """The hub out of reach without HF_HUB_OFFLINE (an endpoint whose port is closed, an empty cache): one line that
    says what to pass instead, and none of the hub client's retry warnings before it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "train.py", "--task", "gsm8k", "--model", "tiny", "--quiet",
                          "--runs-dir", str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error: --task gsm8k: openai/gsm8k"), err
    assert "pass --data FILE.jsonl or a folder" in err[0] and "http://127.0.0.1:9 did not answer" in err[0]
    assert not os.path.exists(tmp_path / "runs")


# -----------------------------------------------------------------------------------------------------------------
# CPU threads and where the output goes

def test_threads_come_from_the_flag_then_the_variable_then_the_idle_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert machine.pick_threads(5) == (5, "set by --threads")
    assert machine.pick_threads(None) == (3, "set by OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(machine, "usable_cpus", lambda: 4)
    monkeypatch.setattr(machine, "TORCH_THREADS", 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    for load, want in ((0.2, 4), (1.4, 3), (3.0, 1), (9.0, 1)):     # never more threads than idle cores, >= 1
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert machine.pick_threads(None)[0] == want, load
    monkeypatch.setattr(os, "cpu_count", lambda: 64)                 # 4 cores of a 64-core host: its share
    monkeypatch.setattr(os, "getloadavg", lambda: (32.0, 32.0, 32.0))
    assert machine.pick_threads(None) == (2, "4 usable cores, load 2.0")
    monkeypatch.setattr(machine, "TORCH_THREADS", 2)                  # never past torch's physical-core default
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert machine.pick_threads(None)[0] == 2


def test_more_threads_than_usable_cores_warn(monkeypatch, capsys):
    monkeypatch.setattr(machine, "usable_cpus", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    old = torch.get_num_threads()
    try:
        assert machine.set_cpu_threads(None) == 64
        assert machine.set_cpu_threads(2) == 2                        # as many as the cores: no warning
    finally:
        torch.set_num_threads(old)
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: 64 CPU threads (set by OMP_NUM_THREADS) on 2 usable cores: the threads wait for each other at "
        "every parallel op; use --threads 2 or fewer"]


def frames_to_the_sampler(monkeypatch) -> list:
    """train.sample wrapped: at its first call, the names of the frames from train.main down to its caller."""
    chain, real = [], train.sample

    def sample(*a, **kw):
        f = None if chain else sys._getframe(1)
        while f is not None:
            chain.insert(0, f.f_code.co_name)
            f = None if f.f_code is train.main.__code__ else f.f_back
        return real(*a, **kw)
    monkeypatch.setattr(train, "sample", sample)
    return chain


def test_a_run_says_its_threads_records_them_and_prints_its_table_to_stdout(tmp_path, capsys, monkeypatch):
    """... and the reader's route is short: from train.py's main to sampler.sample in at most 8 frames (main ->
    command -> train -> sample_step -> rollout_step -> task_rollout -> task.rollout -> generate)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    route = frames_to_the_sampler(monkeypatch)
    train.main([*SYN, "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "2",
                "--runs-dir", str(tmp_path), "--run-name", "r"])
    out, err = capsys.readouterr()
    start = [ln for ln in err.splitlines() if ln.startswith("minigrpo: ")]
    assert len(start) == 1 and "threads=1 (set by OMP_NUM_THREADS; --threads N or OMP_NUM_THREADS=N" in start[0]
    assert "| epoch | steps |" in out and "mean reward: first step" in out        # the result: stdout
    assert "| epoch |" not in err and "mean reward" not in err
    assert json.loads((tmp_path / "r" / "config.json").read_text())["threads"] == 1   # a resume reuses it
    assert route[0] == "main" and len(route) <= 8, " -> ".join(route)


def test_the_pipelines_take_threads_too(tmp_path, capsys):
    """--threads is a machine setting: the mdp pipeline, which takes few flags, takes it and checks its range."""
    from minigrpo.run.flags import resolve_args
    assert resolve_args(["--task", "mdp", "--threads", "1", "--runs-dir", str(tmp_path)]).threads == 1
    assert "--threads 0" in one_line_error(["--task", "mdp", "--threads", "0"], tmp_path / "runs", capsys)
