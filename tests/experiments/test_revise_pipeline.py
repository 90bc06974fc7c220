"""The revise experiment (minigrpo/experiments/revise_pipeline.py), shrunk to under a minute: a base pretrained from
scratch, the soyuz run's arm (coef 0.5 + guard) through train.py's loop, and the report. GRPO must beat the base it
started from, on held-out prompts, by more than the noise (the paired bootstrap interval of the difference)."""
import csv
import os
from dataclasses import replace

import pytest
import torch

from minigrpo.evals.report import REVISE_METRICS
from minigrpo.experiments import revise_pipeline as P
from train import resolve_args, train


def test_shrunk_experiment_trained_beats_base(tmp_path):
    arms = ("coef 0.5 + guard",)
    cfg = replace(P.ExperimentConfig(), seeds=1, arms=arms, base_steps=250, eval_limit=32, eval_samples=4)
    args = resolve_args(["--task", "revise", "--model", "tiny", "--experiment", "--steps", "25", "--device", "cpu",
                         "--runs-dir", str(tmp_path), "--run-name", "x", "--quiet"])
    out = P.run_experiment(args, train, cfg)
    res = out["results"][0]
    assert list(res) == ["base", *arms]
    base, seeds_recipe = res["base"], res["coef 0.5 + guard"]
    print({k: (round(v["turn0_score"], 3), round(v["final_score"], 3)) for k, v in res.items()})
    # Trained minus base, held out (OMP_NUM_THREADS 1 and 2, ATen's default and avx2 kernels): final +0.13 to +0.18,
    # turn-0 +0.22 to +0.24 (base 0.58 and 0.61). The bounds keep 2.6x and 2.2x of the smallest: another CPU samples
    # other tokens and so trains on others; an update that moves nothing gives 0.
    assert seeds_recipe["final_score"] > base["final_score"] + 0.05
    assert seeds_recipe["turn0_score"] > base["turn0_score"] + 0.1
    assert all(len(m["pairs"]) == 32 * 4 for m in res.values())        # every policy, the same eval rollouts
    assert [c["step"] for c in seeds_recipe["curve"]] == list(range(1, 26))
    run = tmp_path / "x"
    for name in ("revise_table.md", "revise_table.csv", "revise_differences.md", "revise.png", "results.json",
                 "seed0-base/model.safetensors", "seed0-coef05-guard/metrics.jsonl"):
        assert os.path.exists(run / name), name
    table = open(run / "revise_table.md").read()
    assert all(label in table for label, _ in REVISE_METRICS)
    rows = list(csv.DictReader(open(run / "revise_table.csv")))
    assert [(r["policy"], r["seed"]) for r in rows] == [(p, s) for p in ["base", *arms] for s in ("0", "mean")]
    diffs = list(csv.DictReader(open(run / "revise_differences.csv")))
    assert [(d["difference"], d["score"], d["reading"]) for d in diffs] == [
        ("coef 0.5 + guard - base", "final", "above"), ("coef 0.5 + guard - base", "turn-0", "above")]



SMALL = replace(P.ExperimentConfig(), seeds=1, arms=("coef 0", "coef 0.5 + guard"), base_steps=3, eval_limit=4,
                eval_samples=2)


def small_args(root):
    return resolve_args(["--task", "revise", "--model", "tiny", "--experiment", "--steps", "2", "--device", "cpu",
                         "--runs-dir", str(root), "--run-name", "x", "--quiet"])


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A two-step experiment of one seed and two arms: (args, its result)."""
    args = small_args(tmp_path_factory.mktemp("revise"))
    return args, P.run_experiment(args, train, SMALL)


def test_a_rerun_skips_the_finished_base_and_arms(small_run, capsys):
    """The base and each arm are stages whose output is their folder: a rerun skips them with one line each and
    gives the same results; an arm whose folder is incomplete (killed mid-run: no stage.pt) trains again from the
    saved base and ends with the same weights."""
    from safetensors.torch import load_file
    args, first = small_run
    arm = os.path.join(first["run"], "seed0-coef0")
    weights = load_file(os.path.join(arm, "checkpoints", "step-2", "model.safetensors"))
    capsys.readouterr()
    again = P.run_experiment(args, train, SMALL)
    skipped = [ln for ln in capsys.readouterr().err.splitlines() if "skipped" in ln]
    assert [ln.split(":")[1].strip() for ln in skipped] == ["seed 0 base", "seed 0 coef 0", "seed 0 coef 0.5 + guard"]
    assert again["results"] == first["results"]

    os.remove(os.path.join(arm, "stage.pt"))
    third = P.run_experiment(args, train, SMALL)
    err = capsys.readouterr().err
    assert f"seed 0 coef 0: {arm} is incomplete" in err and err.count("skipped") == 1
    assert third["results"] == first["results"]
    rerun = load_file(os.path.join(arm, "checkpoints", "step-2", "model.safetensors"))
    assert all(torch.equal(weights[k], rerun[k]) for k in weights)


def test_eval_py_reproduces_the_experiments_numbers(small_run, tmp_path):
    """eval.py --task revise on the saved base folder and on an arm's run folder (its last checkpoint, a model
    folder), with the experiment's sampling (temperature 1, its rollouts per prompt, its seed), gives the
    experiment's own numbers for them."""
    import eval as eval_py
    _, first = small_run
    for folder, policy in (("seed0-base", "base"), ("seed0-coef0", "coef 0")):
        out = eval_py.main(["--task", "revise", "--model", os.path.join(first["run"], folder), "--temperature", "1",
                            "--group-size", "2", "--limit", "4", "--seed", "0", "--quiet", "--device", "cpu",
                            "--out", str(tmp_path / folder)])
        want = {k: v for k, v in first["results"][0][policy].items() if k not in ("pairs", "curve")}
        assert out["results"]["model"]["revise"] == want, folder
        assert len(open(tmp_path / folder / "examples.jsonl").readlines()) == 4 * 2
