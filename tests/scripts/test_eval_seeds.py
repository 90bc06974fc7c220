"""eval.py's two seeds: for --task mdp the eval records come from pipeline.json's seed unless --seed is given, and
the sampler has a seed of its own (--sample-seed, default 0), so choosing other records does not also change the
sampling, nor the reverse. For the other tasks --seed stays the sampling seed."""

import pytest

import eval as ev
from minigrpo import evals
from minigrpo.seeds import derive_seed
from minigrpo.tasks.mdp.task import MDPTask
import mdp_runs


@pytest.fixture(scope="module")
def mdp_run(tmp_path_factory):
    return mdp_runs.mdp_run(tmp_path_factory.mktemp("mdp") / "run", eval_per_cell=1)


@pytest.fixture
def spy(monkeypatch):
    """The seeds the evaluation passes to the sampler, and the records the mdp task is built with."""
    seen = {"sample": [], "records": []}
    real_sample, real_init = evals.common.sample, MDPTask.__init__

    def sample(*a, **k):
        seen["sample"].append(k["seed"])
        return real_sample(*a, **k)

    def init(self, *a, **k):
        real_init(self, *a, **k)
        seen["records"].append(k.get("seed"))
    monkeypatch.setattr(evals.common, "sample", sample)
    monkeypatch.setattr(MDPTask, "__init__", init)
    return seen


def batch_seed(sample_seed, k=0):
    """The sampler's seed for eval batch k (minigrpo/evals/common.py)."""
    return derive_seed(sample_seed, "eval batch", k)


def run_mdp(mdp_run, tmp_path, *flags):
    return ev.main(["--task", "mdp", "--model", str(mdp_run / "sft"), "--max-new-tokens", "2", "--temperature",
                    "1.0", "--out", str(tmp_path / "out"), "--quiet", *flags])


def test_records_from_pipeline_json_sampling_from_its_own_seed(mdp_run, tmp_path, spy):
    run_mdp(mdp_run, tmp_path)
    assert spy["records"] == [3]                                      # pipeline.json's records
    assert spy["sample"] and set(spy["sample"]) == {batch_seed(0)}    # the sampler's own default seed: 0, not 3
    report = (tmp_path / "out" / "report.md").read_text()
    assert "seed 3 (sampling seed 0)" in report and "sampling seed 0" in report


def test_seed_flag_picks_records_only(mdp_run, tmp_path, spy):
    run_mdp(mdp_run, tmp_path, "--seed", "1")
    assert spy["records"] == [1] and set(spy["sample"]) == {batch_seed(0)}


def test_sample_seed_flag_picks_sampling_only(mdp_run, tmp_path, spy):
    run_mdp(mdp_run, tmp_path, "--sample-seed", "7")
    assert spy["records"] == [3] and set(spy["sample"]) == {batch_seed(7)}


def test_sampling_seed_changes_sampled_answers_not_records(mdp_run, tmp_path):
    a = run_mdp(mdp_run, tmp_path, "--sample-seed", "1")["results"]
    b = run_mdp(mdp_run, tmp_path, "--sample-seed", "2")["results"]
    for policy in ("random", "minimax", "max-split", "oracle"):   # the baselines see only the records
        assert a[policy] == b[policy]


def test_other_tasks_sample_with_seed(tmp_path, spy):
    ev.main(["--task", "synthetic", "--model", "tiny", "--limit", "2", "--max-new-tokens", "2", "--seed", "4",
             "--out", str(tmp_path / "out"), "--quiet"])
    assert set(spy["sample"]) == {batch_seed(4)}
