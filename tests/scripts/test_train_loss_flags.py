"""
train.py's side of the loss menu (minigrpo/losses.py, tested in tests/core/test_losses.py): DAPO's overlong
penalty in the reward before the advantages, the refusal to train on top-p / top-k truncated samples, the loss
flags' ranges, and policy_update on the tiny model using the flags it is given.
"""
import argparse
import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import train
from minigrpo.grpo import LossSettings
from minigrpo.run.flags import loss_settings, resolve_args
from minigrpo.tasks.base import Seq
from repo_root import ROOT


def seq(example, n_tokens, score):
    return Seq(example, 0, [1, 2], list(range(n_tokens)), [0.0] * n_tokens, "length", "", score, score)


def test_overlong_penalty_enters_the_reward_never_a_zero_spread_group():
    args = argparse.Namespace(max_new_tokens=10, overlong_buffer=4, adv_scale="group")
    seqs = [seq("a", 4, 0.5), seq("a", 8, 0.5), seq("a", 10, 0.5),     # one score: no signal, lengths differ
            seq("b", 6, 1.0), seq("b", 9, 0.0), seq("b", 10, None)]   # a failed score stays failed
    train.overlong_shaping(seqs, args)
    stats = train.assign_advantages(seqs, args)
    assert [s.advantage for s in seqs[:3]] == [0.0, 0.0, 0.0] and stats["zero_spread"] == 1
    assert [s.reward for s in seqs[:5]] == pytest.approx([0.5, 0.0, -0.5, 1.0, -0.75]) and seqs[5].reward is None
    assert [s.info.get("overlong_penalty") for s in seqs] == [None, -0.5, -1.0, None, -0.75, None]
    assert [s.score for s in seqs] == [0.5, 0.5, 0.5, 1.0, 0.0, None]  # the task's own score is untouched
    z = (1.0 - (-0.75)) / 2 / math.sqrt(2 * ((1.75 / 2) ** 2))  # the penalised rewards of group b, z-scored
    assert seqs[3].advantage == pytest.approx(z, rel=1e-5) and seqs[4].advantage == pytest.approx(-z, rel=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# the flags


def refusal(*argv):
    with pytest.raises(SystemExit) as e:
        resolve_args(["--task", "synthetic", *argv])
    return str(e.value.code)


def test_truncated_sampling_is_refused_for_training():
    line = refusal("--top-p", "0.9", "--top-k", "20")
    assert line.startswith("--top-p 0.9 --top-k 20:") and "--top-p 1 --top-k 0" in line and "\n" not in line
    assert "off-policy" in refusal("--top-k", "20") and "off-policy" in refusal("--top-p", "0.95")
    out = subprocess.run([sys.executable, "train.py", "--task", "synthetic", "--top-p", "0.9", "--top-k", "20"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("train.py: error: --top-p 0.9 --top-k 20:")
    assert len(out.stderr.strip().splitlines()) == 1


def test_loss_flag_ranges():
    assert "--is-cap" in refusal("--is-correction", "tis", "--is-cap", "0.5")
    assert "--is-cap" in refusal("--is-cap", "nan")
    assert "--overlong-buffer" in refusal("--overlong-buffer", "-1")
    assert "--overlong-buffer" in refusal("--overlong-buffer", "9", "--max-new-tokens", "8")
    assert "--gspo-eps-low" in refusal("--gspo-eps-low", "1.5")
    args = resolve_args(["--task", "synthetic", "--loss", "gspo", "--overlong-buffer", "8", "--is-correction", "mis"])
    assert (args.loss, args.overlong_buffer, args.is_correction, args.is_level, args.is_cap) == \
        ("gspo", 8, "mis", "token", 2.0)
    defaults = resolve_args(["--task", "synthetic"])
    assert (defaults.loss, defaults.overlong_buffer, defaults.is_correction) == ("grpo", 0, "none")


def test_loss_settings_defaults_are_the_flags_defaults():
    """LossSettings() (what a test or a script gets without flags) is the loss train.py trains with by default;
    max_tokens alone comes from another flag (--max-new-tokens)."""
    from_flags = loss_settings(resolve_args(["--task", "synthetic"]))
    assert replace(from_flags, max_tokens=None) == LossSettings()


# ----------------------------------------------------------------------------------------------------------------
# train.py passes the flags on: one optimizer step of policy_update on the tiny model, mu = 2


def update_stats(*flags, adv=(1.0, 1.0, 1.0, 1.0)):
    """Per-micro-batch stats of one train.policy_update (2 micro-batches x 2 passes) on four made-up rollouts with
    advantages `adv` and every sampler log-prob 0."""
    from minigrpo.run.dist import Dist
    from minigrpo.update import adamw
    args = resolve_args(["--task", "synthetic", "--micro-batch", "2", "--mu", "2", "--lr", "1e-4", *flags])
    torch.manual_seed(0)
    model, tok, params, reference = train.build_policy(args, torch.device("cpu"), torch.float32)
    opt, sched = adamw(params, args.lr, 4)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(4):
        comp = torch.randint(0, 261, (3 + i,), generator=g).tolist()
        s = Seq(f"ex{i}", 0, torch.randint(0, 261, (5,), generator=g).tolist(), comp, [0.0] * len(comp), "eos",
                "", 1.0, 1.0)
        s.advantage = adv[i]
        seqs.append(s)
    up = train.Updater(model, reference, params, opt, sched, loss_settings(args))
    stats, _ = train.policy_update(up, seqs, args, Dist(), tok)
    return stats


def test_policy_update_uses_the_loss_flags():
    grpo_st, cispo_st = update_stats(), update_stats("--loss", "cispo")
    assert sum(st["pg"] for st in grpo_st[:2]) == pytest.approx(-1.0)  # on-policy GRPO: -mean(A)
    assert sum(st["pg"] for st in cispo_st[:2]) > 3.0  # CISPO's value -A logp: about log(261) = 5.6
    # the second pass is off-policy: GSPO's own small clip (3e-4, 4e-4) clips on both sides, GRPO's 0.2 does not
    signs = (1.0, -1.0, 1.0, -1.0)
    assert all(st["clip_low"] + st["clip_high"] == 0 for st in update_stats(adv=signs))
    gspo = update_stats("--loss", "gspo", "--agg", "seq", adv=signs)[2:]
    assert sum(st["clip_low"] for st in gspo) > 0 and sum(st["clip_high"] for st in gspo) > 0
    tis = update_stats("--is-correction", "tis")
    assert "is_weight_mean" not in grpo_st[0]
    assert all(0 < st["is_weight_mean"] < 0.1 for st in tis)  # pi_old / 1 = the token's probability, ~1/261


def test_train_logs_the_overlong_penalty(tmp_path):
    """One step of the tiny run with --overlong-buffer 4 (max_new_tokens 8): a completion cut at the limit carries
    the full penalty -1 in samples.jsonl and in its reward; the task's score is untouched."""
    cmd = [sys.executable, "train.py", "--task", "synthetic", "--model", "tiny", "--tasks-per-step", "2",
           "--group-size", "4", "--steps", "1", "--quiet", "--overlong-buffer", "4", "--runs-dir", str(tmp_path),
           "--run-name", "r"]
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    with open(tmp_path / "r" / "samples.jsonl") as f:
        recs = [json.loads(ln) for ln in f]
    assert len(recs) == 8
    penalties = [r.get("info", {}).get("overlong_penalty", 0.0) for r in recs]
    assert [r["reward"] for r in recs] == pytest.approx([r["score"] + p for r, p in zip(recs, penalties)])
    assert all(p == -1.0 for r, p in zip(recs, penalties) if r["finish"] == "length")
    assert any(r["finish"] == "length" for r in recs)  # a random tiny model rarely stops by itself
