"""A second golden run: the configuration every GPU preset runs (LoRA, a KL term to the LoRA-disabled reference,
several inner epochs so the ratio leaves 1 and clipping acts), pinned on the tiny model.

The numbers below change when the math, the sampler, the model, LoRA or the seed derivation changes. To
regenerate them after a deliberate change: `python tests/test_golden_lora.py` prints a new GOLDEN_LORA dict;
paste it here in the same commit and say why they moved."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ARGS = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "8", "--group-size", "4", "--micro-batch", "12",
        "--lora-r", "4", "--lora-alpha", "8", "--beta", "0.04", "--kl", "k3", "--mu", "2", "--lr", "5e-2",
        "--eps-low", "0.1", "--eps-high", "0.15", "--temperature", "0.9", "--max-grad-norm", "0.015", "--steps", "3", "--seed", "2", "--quiet"]

# ---- GOLDEN_LORA: regenerate with `python tests/test_golden_lora.py` (OMP_NUM_THREADS=1) ----------------------
GOLDEN_LORA = {
    "reward_mean": [0.0078125, 0.0, 0.0],
    "completion_len": [7.78125, 7.78125, 7.90625],
    "truncated": [0.96875, 0.90625, 0.96875],
    "kl": [0.007488338527340726, 0.01498292959351317, 0.023371829239011047],
    "clip_low": [0.04819277162293354, 0.0, 0.0],
    "clip_high": [0.028112449589742714, 0.0, 0.0],
    "ratio_mean": [1.0044671850032116, 1.0034062038942513, 1.006358109679618],
    "grad_norm": [0.05367450416088104, 0.004945914726704359, 0.0032920129597187042],  # before the 0.015 clip
    "pg": [-0.0025758865536246673, 0.0, 0.0],
    "loss": [-0.002477260556139321, 0.00020352276331973243, 0.0003110822018124568],
    "entropy": [5.547674171417114, 5.547499986058737, 5.547136629051842],
    "sampler_logp_diff": [0.06780677917132956, 0.09057005695310497, 0.10572928599571423],   # mu=2: pass 2 is off-policy
    "adapter": {"numel": 16384, "abs_sum": 1357.781657577958, "weighted_sum": 59.012603331764694},
}
# ----------------------------------------------------------------------------------------------------------------
EXACT = ("reward_mean", "completion_len", "truncated")   # counts of sampled tokens: equal or the rollouts differ


def run_golden(runs_dir):
    cmd = [sys.executable, "train.py", *ARGS, "--runs-dir", str(runs_dir), "--run-name", "golden-lora"]
    subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, check=True, timeout=600)
    run = os.path.join(str(runs_dir), "golden-lora")
    with open(os.path.join(run, "metrics.jsonl")) as f:
        metrics = [json.loads(ln) for ln in f]
    adapter = load_file(os.path.join(run, "checkpoints", "step-3", "adapter", "adapter_model.safetensors"))
    got = {k: [m[k] for m in metrics] for k in GOLDEN_LORA if k != "adapter"}
    got["adapter"] = adapter_checksum(adapter)
    return got


def adapter_checksum(tensors):
    """Three numbers that move with any change of the adapter's values or layout: the count of values, the sum of
    their magnitudes and a position-weighted sum (weights -6..6 cycling over the values, keys in sorted order)."""
    flat = torch.cat([tensors[k].double().reshape(-1) for k in sorted(tensors)])
    w = (torch.arange(flat.numel(), dtype=torch.float64) % 13) - 6
    return {"numel": flat.numel(), "abs_sum": float(flat.abs().sum()), "weighted_sum": float((flat * w).sum())}


def test_golden_lora_kl_clip_run(tmp_path):
    got = run_golden(tmp_path)
    # what this configuration must show whatever the exact numbers
    assert all(k > 0 for k in got["kl"])                 # mu=2: the second pass of step 1 already follows an update
    assert any(c > 0 for c in got["clip_low"]) and any(c > 0 for c in got["clip_high"])
    assert all(g > 0 for g in got["grad_norm"])          # KL alone gives a gradient when every group has zero spread
    assert any(g > 0.015 for g in got["grad_norm"])      # the clip acts
    # the exact numbers
    for key in EXACT:
        assert got[key] == GOLDEN_LORA[key], (key, got[key])
    for key in GOLDEN_LORA:
        if key not in EXACT and key != "adapter":
            assert got[key] == pytest.approx(GOLDEN_LORA[key], rel=1e-5, abs=1e-7), (key, got[key])
    assert got["adapter"]["numel"] == GOLDEN_LORA["adapter"]["numel"]
    for key in ("abs_sum", "weighted_sum"):
        assert got["adapter"][key] == pytest.approx(GOLDEN_LORA["adapter"][key], rel=1e-5, abs=1e-7), key


if __name__ == "__main__":
    import pprint
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        pprint.pprint(run_golden(d), sort_dicts=False, width=118)
