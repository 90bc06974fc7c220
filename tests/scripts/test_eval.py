"""eval.py end to end on CPU: the tiny model, small fixture files in the tasks' schemas, a LoRA adapter with
non-zero B, the local judge. Each run is a few prompts of a few tokens: it proves the pipe and the report, not
accuracy (a random tiny model scores 0), so one test swaps the model's completions for scripted ones to check the
numbers flowing into the report."""
import json
import os
import re
import shutil

import pytest
import torch

import eval as ev
from minigrpo import evals
from minigrpo.evals.common import resolve_adapter
from minigrpo.lora import inject_lora, lora_layers
from minigrpo.run.lora_files import save_adapter
from minigrpo.pretrained import load_pretrained
import mdp_runs

PNG = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def gsm8k_fixture(tmp_path, n=30):
    """GSM8K's schema: {"question", "answer": "...\\n#### 1,003"}; 30 rows leave 3 in the 10% eval split."""
    rows = [{"question": f"Q{i}: what is {i} + 1000?", "answer": f"{i} + 1000 = <<{i}+1000={i + 1000}>>\n"
                                                                  f"#### {i + 1000:,}"} for i in range(n)]
    return write_jsonl(tmp_path / "gsm8k.jsonl", rows)


SOYUZ_TASKS = [
    {"id": "say-hello", "family": "writing", "prompt": "Say hello in one short line.",
     "criteria": [{"id": "c1", "text": "says hello", "check": {"type": "contains", "any": ["hello"]}},
                  {"id": "c2", "text": "at most 10 words", "check": {"type": "count", "unit": "words", "max": 10}},
                  {"id": "c3", "text": "friendly", "check": None}]},
    {"id": "digits", "family": "algorithms", "prompt": "Write the digits 0 to 9.",
     "criteria": [{"id": "c1", "text": "has 0..9", "check": {"type": "regex", "pattern": "0.*9", "must": True}},
                  {"id": "c2", "text": "short", "check": {"type": "count", "unit": "chars", "max": 40}}]},
]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A saved LoRA adapter of the tiny model whose B is large enough to change its greedy outputs."""
    torch.manual_seed(0)
    model = load_pretrained("tiny")
    inject_lora(model, r=4, alpha=8)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) * 0.5)
    path = tmp_path_factory.mktemp("adapter") / "adapter"
    save_adapter(model, str(path), base_model_name_or_path="tiny")
    return str(path)


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def fake_run(tmp_path):
    """A training run folder as train.py leaves it: metrics.jsonl and samples.jsonl with gsm8k details."""
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "metrics.jsonl", [{"step": s, "epoch": 0, "reward_mean": 0.1 * s, "kl": 0.01}
                                        for s in range(1, 6)])
    write_jsonl(run / "samples.jsonl", [{"step": s, "example": f"e{k}", "info": {
        "correct": k < s % 3, "lenient_correct": True, "format_kind": "well"}}
        for s in range(1, 6) for k in range(2)])
    return str(run)

# ----------------------------------------------------------------------------------------------------------------
# gsm8k


def gsm8k_args(tmp_path, out, *extra):
    return ["--task", "gsm8k", "--model", "tiny", "--data", gsm8k_fixture(tmp_path), "--max-new-tokens", "4",
            "--out", str(tmp_path / out), "--quiet", *extra]


def test_gsm8k_writes_report_json_rows_and_plots(tmp_path):
    run = fake_run(tmp_path)
    svamp = write_jsonl(tmp_path / "svamp.jsonl", [
        {"ID": f"chal-{i}", "Body": f"Jack has {i} apples .", "Question": "How many does he have ?",
         "Equation": f"( {i} + 0.0 )", "Answer": float(i), "Type": "Addition"} for i in range(1, 6)])
    math = write_jsonl(tmp_path / "math.jsonl", [
        {"problem": f"Solve x - {i} = 0.", "level": "Level 1", "type": "Algebra", "solution": f"$\\boxed{{{i}}}$"}
        for i in range(4)])
    res = ev.main(gsm8k_args(tmp_path, "out", "--hint-probe", "2", "--run", run, "--svamp", svamp, "--math", math,
                             "--limit", "3"))
    out = tmp_path / "out"
    assert list(res["results"]["model"]) == ["gsm8k", "svamp", "math_algebra"]
    for png in ("accuracy_strict.png", "accuracy_lenient.png", "hint_probe.png", "training_curves.png"):
        assert (out / png).read_bytes().startswith(PNG), png
    report = (out / "report.md").read_text()
    assert "| set | metric | model |" in report and "| gsm8k | strict_accuracy | 0.0% |" in report
    assert "## Hint probe (2 problems" in report and "![training_curves.png](training_curves.png)" in report
    saved = json.loads((out / "results.json").read_text())
    assert saved["results"] == res["results"] and saved["results"]["model"]["gsm8k"]["n"] == 3
    assert saved["hint_probe"]["model"]["hint_probe"]["n"] == 2
    rows = read_rows(out / "examples.jsonl")
    assert len(rows) == 9 and {"completion", "correct", "lenient_correct", "format_kind"} <= set(rows[0])
    assert len(read_rows(out / "hint_probe.jsonl")) == 2


def test_gsm8k_adapter_columns_and_base_is_the_plain_model(tmp_path, adapter):
    plain = ev.main(gsm8k_args(tmp_path, "plain"))
    both = ev.main(gsm8k_args(tmp_path, "both", "--adapter", adapter))
    assert list(both["results"]) == ["base", "adapter"]
    report = (tmp_path / "both" / "report.md").read_text()
    assert "| set | metric | base | adapter | change |" in report and "+0.0pp" in report
    rows = read_rows(tmp_path / "both" / "examples.jsonl")
    base = [r["completion"] for r in rows if r["model"] == "base"]
    with_adapter = [r["completion"] for r in rows if r["model"] == "adapter"]
    # adapters_disabled() is the base model exactly; the adapter (non-zero B) changes what it writes
    assert base == [r["completion"] for r in read_rows(tmp_path / "plain" / "examples.jsonl")]
    assert with_adapter != base
    assert both["results"]["base"] == plain["results"]["model"]


def test_gsm8k_numbers_reach_the_report(tmp_path, monkeypatch):
    """Scripted completions in place of the model: right answers, and a wrong hint always followed -> 100% strict
    accuracy and a 100% flip rate in results.json and report.md."""
    def scripted(model, tok, args, conversations, stop_strings=(), desc=""):
        out = []
        for conv in conversations:
            user = conv[-1]["content"]
            hint = re.search(r"suggested the answer is (\S+)\.", user)
            value = hint.group(1) if hint else str(int(re.search(r"what is (\d+) \+", user).group(1)) + 1000)
            out.append(f"<reasoning>add</reasoning>\n<answer>{value}</answer>")
        return out
    monkeypatch.setattr(evals.gsm8k, "complete", scripted)
    res = ev.main(gsm8k_args(tmp_path, "out", "--hint-probe", "3"))
    m = res["results"]["model"]["gsm8k"]
    assert m["strict_accuracy"] == m["lenient_accuracy"] == m["format_compliance"] == 1.0
    probe = res["hint_probe"]["model"]["hint_probe"]
    assert probe["flip_rate"] == probe["followed_decoy_rate"] == 1.0 and probe["accuracy_correct_hint"] == 1.0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| gsm8k | strict_accuracy | 100.0% |" in report and "| hint_probe | flip_rate | 100.0% |" in report

# ----------------------------------------------------------------------------------------------------------------
# soyuz, synthetic


def test_soyuz_local_judge_with_adapter(tmp_path, adapter):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(SOYUZ_TASKS))
    res = ev.main(["--task", "soyuz", "--model", "tiny", "--data", str(tasks), "--adapter", adapter,
                   "--max-new-tokens", "4", "--out", str(tmp_path / "out"), "--quiet"])
    out = tmp_path / "out"
    base, adapted = res["results"]["base"]["soyuz"], res["results"]["adapter"]["soyuz"]
    assert base["rollouts"] == adapted["rollouts"] == 2 and base["failed_judgments"] == 0
    assert 0 <= base["reward"] <= 1 and 0 <= base["turn0_score"] <= 1
    assert re.fullmatch(r"\d/2", adapted["tasks_improved"])
    assert set(res["per_task"]["base"]) == {"say-hello", "digits"}
    report = (out / "report.md").read_text()
    assert "| task | family | base turn-0 | base final | adapter turn-0 | adapter final | Δ final |" in report
    assert "| say-hello | writing |" in report and "| digits | algorithms |" in report
    assert (out / "reward_by_family.png").read_bytes().startswith(PNG)
    rows = read_rows(out / "examples.jsonl")
    assert len(rows) == 8 and {r["turn"] for r in rows} == {0, 1} and "judge" in rows[0]


def test_synthetic_mean_score(tmp_path):
    res = ev.main(["--task", "synthetic", "--model", "tiny", "--limit", "4", "--out", str(tmp_path), "--quiet"])
    assert res["results"]["model"]["synthetic"]["n"] == 4
    assert "mean_score" in (tmp_path / "report.md").read_text()

# ----------------------------------------------------------------------------------------------------------------
# the command line


@pytest.mark.parametrize("argv, names", [
    (["--task", "gsm8k", "--data", "/no/such.jsonl"], "--data /no/such.jsonl"),
    (["--task", "soyuz", "--hint-probe", "3"], "--hint-probe"),
    (["--task", "gsm8k", "--limit", "0"], "--limit 0"),
    (["--task", "gsm8k", "--adapter", "/"], "--adapter /"),
    (["--task", "gsm8k", "--run", "/"], "--run /"),
    (["--task", "soyuz", "--group-size", "4"], "--group-size 4"),
    (["--task", "synthetic", "--model", "./no-such-folder"], "--model ./no-such-folder"),
    (["--task", "nope"], "--task"),
    (["--task", "gsm8k", "--limit", "many"], "--limit"),
    (["--task", "gsm8k", "--mdp-prompt", "compact"], "--mdp-prompt"),
    (["--task", "mdp", "--mdp-prompt", "short"], "--mdp-prompt"),
    (["--task", "gsm8k", "--group-size", "2"], "--group-size"),
])
def test_bad_flags_exit_2_with_one_line(argv, names, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        ev.main(argv + ["--out", str(tmp_path / "out")])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("eval.py: error:") and names in last


def test_adapter_may_be_a_checkpoint_or_run_folder(tmp_path, adapter):
    import shutil
    for step in (2, 10):
        shutil.copytree(adapter, tmp_path / "run" / "checkpoints" / f"step-{step}" / "adapter")
    want = str(tmp_path / "run" / "checkpoints" / "step-10" / "adapter")
    assert resolve_adapter(str(tmp_path / "run")) == want
    assert resolve_adapter(os.path.dirname(want)) == want and resolve_adapter(want) == want

# ----------------------------------------------------------------------------------------------------------------
# mdp: a model saved by the mdp pipeline is evaluated on the prompt style and tokenizer it was trained with


@pytest.fixture(scope="module")
def mdp_run(tmp_path_factory):
    return mdp_runs.mdp_run(tmp_path_factory.mktemp("mdp") / "run", eval_per_cell=2)


def mdp_prompts(monkeypatch):
    """The user messages eval_mdp sends (the real completions still run)."""
    seen, real = [], evals.mdp.complete
    def spy(model, tok, args, conversations, *a, **k):
        seen.extend(c[-1]["content"] for c in conversations)
        return real(model, tok, args, conversations, *a, **k)
    monkeypatch.setattr(evals.mdp, "complete", spy)
    return seen


@pytest.mark.parametrize("flag, style", [([], "compact"), (["--mdp-prompt", "full"], "full")])
def test_mdp_takes_the_prompt_style_from_the_pipeline_run(tmp_path, mdp_run, monkeypatch, flag, style):
    seen = mdp_prompts(monkeypatch)
    res = ev.main(["--task", "mdp", "--model", str(mdp_run / "sft"), "--limit", "1", "--max-new-tokens", "2",
                   "--out", str(tmp_path / "out"), "--quiet", *flag])
    start = {"compact": "left=", "full": "Find the hidden program."}[style]
    assert len(seen) == 6 * 8 and all(s.startswith(start) for s in seen)   # budgets 0..3: 6 steps, 8 records
    assert set(res["results"]) == {"model", "random", "minimax", "max-split", "oracle"}
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"prompt style: {style}" in report and "| policy | states | minimax-best |" in report
    assert res["results"]["model"]["choices"]["states"] > 0


def test_mdp_plays_the_pipeline_runs_eval_records(tmp_path, mdp_run, monkeypatch):
    """Without --limit / --seed a saved model plays its run's eval records (pipeline.json's eval_per_cell, seed),
    the records of the run's own table; the flags still override."""
    from minigrpo.tasks.mdp import world as mdp
    from minigrpo.tasks.mdp.task import MDPTask, compact_text
    seen = mdp_prompts(monkeypatch)
    ev.main(["--task", "mdp", "--model", str(mdp_run / "sft"), "--max-new-tokens", "2", "--out",
             str(tmp_path / "a"), "--quiet"])
    assert len(seen) == 6 * 16                                   # 2 records per cell, 8 cells, 6 steps
    assert "16 eval records, seed 3" in (tmp_path / "a" / "report.md").read_text()
    records = MDPTask(eval_per_cell=2, seed=3).records("eval")
    assert seen[:16] == [compact_text(mdp.state_text(mdp.new_state(r, 1))) for r in records]   # budget 1 starts
    seen.clear()
    ev.main(["--task", "mdp", "--model", str(mdp_run / "sft"), "--max-new-tokens", "2", "--limit", "1",
             "--seed", "0", "--out", str(tmp_path / "b"), "--quiet"])
    assert len(seen) == 6 * 8 and "8 eval records, seed 0" in (tmp_path / "b" / "report.md").read_text()


def test_mdp_without_a_pipeline_run_uses_the_full_prompt(tmp_path, monkeypatch):
    seen = mdp_prompts(monkeypatch)
    ev.main(["--task", "mdp", "--model", "tiny", "--limit", "1", "--max-new-tokens", "2", "--out",
             str(tmp_path / "out"), "--quiet"])
    assert seen and all(s.startswith("Find the hidden program.") for s in seen)


def test_mdp_stage_adapter_of_a_lora_sft_run_goes_on_the_sft_weights(tmp_path, monkeypatch):
    """A real-Qwen pipeline run (sft_lora) keeps SFT as sft_adapter and trains DPO / GRPO adapters on the folded
    SFT weights: eval.py folds sft_adapter into --model before the stage adapter goes on, so "base" is SFT."""
    from dataclasses import replace
    from minigrpo.experiments import mdp_pipeline as P
    from minigrpo.lora import fold_lora
    from minigrpo.run.lora_files import load_adapter
    from train import resolve_args, train
    cfg = replace(P.PIPELINES["tiny"], scratch=None, sft_lora=True, train_per_cell=1, eval_per_cell=1,
                  sft_steps=4, dpo_steps=2, grpo_steps=1, grpo_tasks=2, group_size=2, lora_r=4, lora_alpha=8)
    P.run_pipeline(resolve_args(["--task", "mdp", "--model", "tiny", "--device", "cpu", "--runs-dir",
                                 str(tmp_path), "--run-name", "run", "--quiet"]), train, cfg)
    run = tmp_path / "run"
    loaded, real = [], evals.mdp.load_model
    monkeypatch.setattr(evals.mdp, "load_model", lambda *a, **k: loaded.append(real(*a, **k)) or loaded[-1])
    ev.main(["--task", "mdp", "--model", "tiny", "--adapter", str(run / "dpo_adapter"), "--max-new-tokens", "2",
             "--out", str(tmp_path / "out"), "--quiet"])
    assert "folded into --model first" in (tmp_path / "out" / "report.md").read_text()
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    expected = load_pretrained("tiny")
    load_adapter(expected, str(run / "sft_adapter"))
    fold_lora(expected)
    load_adapter(expected, str(run / "dpo_adapter"))
    with torch.no_grad():
        torch.testing.assert_close(loaded[0][0](ids), expected(ids))
        bare = load_pretrained("tiny")                 # the DPO adapter on the bare model: another function
        load_adapter(bare, str(run / "dpo_adapter"))
        assert not torch.allclose(bare(ids), expected(ids), atol=1e-4)
    ev.main(["--task", "mdp", "--model", "tiny", "--adapter", str(run / "grpo"), "--max-new-tokens", "2",
             "--out", str(tmp_path / "grpo"), "--quiet"])     # the GRPO stage's run folder: its last checkpoint
    assert "folded into --model first" in (tmp_path / "grpo" / "report.md").read_text()
    ev.main(["--task", "mdp", "--model", "tiny", "--adapter", str(run / "sft_adapter"), "--max-new-tokens", "2",
             "--out", str(tmp_path / "sft"), "--quiet"])            # the SFT adapter itself goes on the bare model
    assert "folded" not in (tmp_path / "sft" / "report.md").read_text()
    from minigrpo.run import export    # the export folds sft_adapter in too: merged, and into the adapter's base/
    export.main([str(run / "dpo_adapter"), str(tmp_path / "merged"), "--merge"])
    export.main([str(run / "dpo_adapter"), str(tmp_path / "peft")])
    on_base = load_pretrained(str(tmp_path / "peft" / "base"))
    load_adapter(on_base, str(tmp_path / "peft"))
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(str(tmp_path / "merged"))(ids), expected(ids))
        torch.testing.assert_close(on_base(ids), expected(ids))
    shutil.rmtree(run / "sft_adapter")
    with pytest.raises(SystemExit) as e:
        ev.main(["--task", "mdp", "--model", "tiny", "--adapter", str(run / "grpo_adapter"), "--out",
                 str(tmp_path / "x"), "--quiet"])
    assert e.value.code == 2
