"""train.py end to end on CPU: a golden tiny run, exact resume after SIGKILL, and torchrun with 2 ranks (gloo)."""
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from minigrpo.errors import StopRun
from repo_root import ROOT
from train_runs import ENV, final_weights, metrics, wait_for_checkpoint

SMALL = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "4", "--group-size", "4",
         "--micro-batch", "8", "--quiet"]


def run_train(args, runs, name, check=True, **kw):
    cmd = [sys.executable, "train.py", *SMALL, "--runs-dir", str(runs), "--run-name", name, *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, check=check, timeout=600, **kw)


def test_golden_tiny_run(tmp_path):
    """Fixed seed, three steps: these numbers only change when the math, the sampler or the model changes.
    If a deliberate change moves them, rerun and update them in the same commit, saying why."""
    run_train(["--steps", "3", "--seed", "1"], tmp_path, "golden")
    got = metrics(tmp_path / "golden")
    assert [m["step"] for m in got] == [1, 2, 3]
    rewards = [m["reward_mean"] for m in got]
    lengths = [m["completion_len"] for m in got]
    assert rewards == GOLDEN["reward_mean"], rewards
    assert lengths == GOLDEN["completion_len"], lengths
    # recorded on another CPU: max rel diff seen 9.0e-8 (grad_norm, entropy 4.3e-8) across avx2/avx512/default
    # x 1/2 threads; tolerance 1e-5
    for key in ("loss", "grad_norm", "entropy"):
        assert [m[key] for m in got] == pytest.approx(GOLDEN[key], rel=1e-5, abs=1e-7), key
    # sampler and trainer agree in fp32: the largest seen 1.7e-7 (default), 1.3e-7 (avx512); bound 1e-5
    assert all(m["sampler_logp_diff"] < 1e-5 for m in got)
    # on-policy (mu=1): the ratio is exp(logp - logp.detach()) = 1 and nothing is clipped, exactly, on any machine
    assert all(m["ratio_mean"] == 1.0 and m["clip_low"] == m["clip_high"] == 0.0 for m in got)
    assert got[1]["grad_norm"] == got[2]["grad_norm"] == 0.0     # zero spread, no KL: the gradient is exactly 0


GOLDEN = {  # python train.py --task synthetic --model tiny --tasks-per-step 4 --group-size 4 --micro-batch 8
    #          --steps 3 --seed 1, with OMP_NUM_THREADS=1 (sample seeds from seeds.derive_seed; the synthetic
    #          preset and letters: lr 3e-3 cosine, letters b c d f)
    "reward_mean": [0.0234375, 0.0, 0.0],
    "completion_len": [8.0, 7.5625, 7.625],
    "loss": [0.0, 0.0, 0.0],   # on-policy, centred advantages, equal lengths: the loss is 0, its gradient is not
    "grad_norm": [1.3181185722351074, 0.0, 0.0],   # steps 2 and 3: every group had zero spread
    "entropy": [5.550319194793701, 5.550771208834057, 5.549935669195457],
}


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    steps = ["--steps", "8", "--save-every", "2", "--seed", "3"]
    run_train(steps, tmp_path, "whole")
    cmd = [sys.executable, "train.py", *SMALL, "--runs-dir", str(tmp_path), "--run-name", "killed", *steps]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = tmp_path / "killed" / "checkpoints" / "step-4"
    wait_for_checkpoint(proc, ckpt, "killed mid-way")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(metrics(tmp_path / "killed")) < 8
    run_train(["--resume"], tmp_path, "killed")
    w_whole, last_whole = final_weights(tmp_path / "whole")
    w_resumed, last_resumed = final_weights(tmp_path / "killed")
    assert last_whole == last_resumed == "step-8"
    for k in w_whole:
        assert torch.equal(w_whole[k], w_resumed[k]), k
    assert metrics(tmp_path / "whole") == metrics(tmp_path / "killed")


def test_resume_needs_a_run(tmp_path):
    out = run_train(["--resume"], tmp_path, "nothing-here", check=False)
    assert out.returncode != 0
    assert "config.json" in out.stderr and "--resume" in out.stderr


@pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "torchrun")), reason="torchrun not installed")
def test_torchrun_two_ranks_match_one_process(tmp_path):
    args = ["--steps", "3", "--seed", "5", "--device", "cpu", "--save-every", "3"]
    run_train(args, tmp_path, "one")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", "train.py", *SMALL, "--runs-dir", str(tmp_path),
           "--run-name", "two", *args]
    # gloo picks its interface from the hostname unless told; a CI container's hostname may not resolve
    env = {**ENV, "GLOO_SOCKET_IFNAME": ENV.get("GLOO_SOCKET_IFNAME", "lo")}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    # Two ranks sum the step's gradient in another order than one process (each rank its share, then the
    # all-reduce), so the weights agree up to fp32 rounding, which Adam magnifies where a gradient entry is about
    # its eps. Max abs diff seen 4.1e-5, in one entry of 165,568 (avx512; 3.8e-5 avx2, 9.8e-6 default, the same at
    # 1 and 2 threads); tolerance 4e-4, an eighth of one Adam step at this lr (3e-3).
    w1, _ = final_weights(tmp_path / "one")
    w2, _ = final_weights(tmp_path / "two")
    for k in w1:
        assert torch.allclose(w1[k], w2[k], atol=4e-4, rtol=0), (k, (w1[k] - w2[k]).abs().max())
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [m["reward_mean"] for m in m1] == [m["reward_mean"] for m in m2]
    # the gradient norm before the clip shows a normaliser or a sum over ranks gone wrong, which Adam's update hides
    # (it is nearly scale-free): max rel diff seen 1.1e-7 (avx512, 0 at avx2 and default); tolerance 1e-5
    assert [m["grad_norm"] for m in m2] == pytest.approx([m["grad_norm"] for m in m1], rel=1e-5, abs=1e-7)


def test_the_process_group_is_torn_down_after_a_run(tmp_path, monkeypatch):
    """train.py destroys the process group itself once a run has ended (dist.finish_distributed): left to the
    interpreter's exit, gloo's worker threads can abort a rank with std::terminate after a run that completed
    (pytorch/pytorch#190489; seen once in CI in the 2-rank test above). Shown on a 1-rank gloo group in a fresh
    process; without a group (one process, no torchrun) it does nothing."""
    code = ("import torch.distributed as dist\n"
            "from minigrpo.run.dist import finish_distributed\n"
            f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
            "finish_distributed()\n"
            "print('initialized' if dist.is_initialized() else 'destroyed')\n")
    env = {**ENV, "GLOO_SOCKET_IFNAME": ENV.get("GLOO_SOCKET_IFNAME", "lo")}    # as in the 2-rank test above
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "destroyed", out.stderr[-2000:]
    import train
    calls = []
    monkeypatch.setattr(train, "train", lambda args: calls.append("train"))
    monkeypatch.setattr(train, "finish_distributed", lambda: calls.append("finish"))
    train.main([*SMALL, "--runs-dir", str(tmp_path), "--steps", "1"])
    assert calls == ["train", "finish"]
    from minigrpo.run.dist import finish_distributed
    finish_distributed()                                   # no group in this process: a no-op


def test_three_non_finite_steps_stop_with_the_last_good_checkpoint(tmp_path, monkeypatch):
    """A non-finite gradient skips its step (weights untouched); three in a row stop the run with a clear error."""
    import train
    args = train.resolve_args([*SMALL, "--runs-dir", str(tmp_path), "--run-name", "nan", "--steps", "6",
                               "--save-every", "1", "--keep-checkpoints", "5"])
    real, calls = train.all_reduce_and_clip, []

    def poisoned(params, max_grad_norm, dist_info):
        calls.append(real(params, max_grad_norm, dist_info))
        return calls[-1] if len(calls) == 1 else float("nan")     # step 1 is fine, then every gradient is NaN

    monkeypatch.setattr(train, "all_reduce_and_clip", poisoned)
    with pytest.raises(StopRun, match="3 non-finite steps in a row"):
        train.train(args)
    run = tmp_path / "nan"
    assert sorted(os.listdir(run / "checkpoints")) == ["step-1", "step-2", "step-3"]
    good = load_file(str(run / "checkpoints" / "step-1" / "model.safetensors"))
    last = load_file(str(run / "checkpoints" / "step-3" / "model.safetensors"))
    assert all(torch.equal(good[k], last[k]) for k in good)      # skipped steps changed nothing


def test_a_non_finite_step_with_several_passes_does_not_claim_the_weights_are_untouched(capsys):
    """With --mu 2 a pass before the non-finite one has already stepped the optimizer: the warning and the stop
    say so instead of naming an earlier step's weights."""
    import train

    assert train.nonfinite_streak(0, float("nan"), 4, mu=2) == 1
    assert "earlier passes applied" in capsys.readouterr().err
    with pytest.raises(StopRun) as e:
        train.nonfinite_streak(2, float("nan"), 6, mu=2)
    assert "with --mu 2 each kept the passes before its non-finite one" in str(e.value)
    assert "weights are those of step" not in str(e.value)


def test_a_fresh_run_refuses_a_used_run_folder(tmp_path):
    run_train(["--steps", "1"], tmp_path, "used")
    out = run_train(["--steps", "1"], tmp_path, "used", check=False)
    assert out.returncode == 3 and "--resume" in out.stderr and "already holds a run" in out.stderr


def test_eos_equal_to_pad_is_trained_by_the_trainer():
    """Qwen base models pad with their EOS id. The trainer's loss mask (train.collate, built by position with
    grpo.span_mask) trains the EOS a model emitted and never a pad; a mask by token id would drop the EOS."""
    import train
    from minigrpo import grpo
    from minigrpo.tasks.base import Seq
    from toy_lm import ToyLM
    PAD = EOS = 7
    seqs = [Seq("a", 0, [3, 4, 5], [9, 1, EOS], [-1.0] * 3, "eos", "", 1.0, 1.0, advantage=1.0),
            Seq("b", 0, [3, 4, 5, 6, 2, 8, 8], [EOS], [-1.0], "eos", "", 0.0, 0.0, advantage=-1.0)]
    b = train.collate(seqs, PAD, "cpu")
    assert b.ids[0].tolist() == [PAD, PAD, 3, 4, 5, 9, 1, EOS]     # left-padded with the EOS id
    eos_col = b.ids.shape[1] - 2                       # column t scores the token at position t + 1: the last one
    assert b.mask[:, eos_col].all() and b.mask.sum(-1).tolist() == [3, 1]
    assert not (b.ids[:, 1:] != PAD)[:, eos_col].any()     # the bug: masking by token id drops the emitted EOS
    logp = train.log_probs(ToyLM(), b, 1.0, vocab_size=None)
    loss, _ = grpo.policy_loss(logp, b.adv.double(), b.mask)
    g = torch.autograd.grad(loss, logp)[0]
    assert (g[:, eos_col] != 0).all()                  # the emitted EOS is an action and gets a gradient
    assert (g[0, :eos_col - 2] == 0).all() and (g[1, :eos_col] == 0).all()   # prompts and pads do not
