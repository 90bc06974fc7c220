"""torchrun with 2 ranks on a process group that, like NCCL's, moves only tensors of one device type, and a step
with fewer tasks than ranks; both must train exactly as one process does. Run on CPU: no GPU has to be present.

Why this design. NCCL moves only CUDA tensors: a process group whose device map sends CUDA to a backend and
nothing to CPU rejects a CPU tensor ("No backend type associated with device type cpu"), and the 2-rank gloo test
of test_train.py cannot see that, because there the model, every tensor and the collectives are all on the CPU.
To catch a CPU-born tensor on a CPU-only machine, the collectives' device has to be some other device type that
holds real numbers, and the only stock one is torch's lazy device (its TorchScript backend computes on the CPU;
'meta' holds no values, so a sum there means nothing). Running the whole model there is no option: a few steps
take many minutes and safetensors cannot save its tensors. So each rank here (this file, run by torchrun as its
script; see rank_main at the bottom) keeps the model on the CPU and does two things before train.main:

  - it wraps torch.distributed's tensor collectives (all_reduce, all_gather, broadcast, ...) so that they refuse,
    with NCCL's message, every tensor whose device type is not COLLECTIVE_DEVICE, and run the others on gloo
    through a CPU copy, the results copied back into the caller's tensors;
  - it names COLLECTIVE_DEVICE as the rank's collective device (Dist.device, which minigrpo.run.dist's helpers
    reduce on; on a GPU init_distributed names the rank's own CUDA device there, which
    test_init_distributed_names_the_rank_gpu_as_the_collective_device checks). The gradients, already on that
    device on a GPU, here make the round trip a CPU-born tensor makes there.

Any tensor the loop hands to a collective without going through minigrpo.run.dist's helpers (the step's loss
normaliser built on the CPU, gradients sent where they are) is then refused exactly as NCCL refuses a CPU tensor.
Object collectives (all_gather_object) are left alone: torch picks their device from the backend itself (under
NCCL the current GPU), so the library hands them no tensor to place; patching torch.distributed's names does not
reach the calls torch makes inside them. Nothing in the library reads a test setting: the wrapping lives here.
"""
import argparse
import os
import shutil
import subprocess
import sys

import pytest
import torch

from minigrpo.pretrained import load_pretrained
from minigrpo.tasks.base import DataState

from repo_root import ROOT
from train_runs import ENV, final_weights, metrics

SMALL = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "4", "--group-size", "4", "--micro-batch", "8",
         "--quiet", "--device", "cpu"]
# One group per micro-batch (the docstrings below): each rank's gradient is one of the one process's micro-batches,
# so the weights differ by rounding only: max |diff| 9.3e-9 (OMP_NUM_THREADS 1 and 2, ATEN_CPU_CAPABILITY default),
# grad_norm, loss, pg and entropy within 6.2e-8 relative, sampler_logp_diff (a rounding itself, ~1e-7) under
# the abs 1e-6. ATOL keeps 1000x and is 1/300 of one Adam step at lr 3e-3: a gradient summed twice, or dropped
# on one rank, moves weights by about lr.
ATOL = 1e-5
COLLECTIVE_DEVICE = "lazy"
TENSOR_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                      "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
                      "isend", "irecv")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
needs_torchrun = pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(TORCHRUN),
                                    reason="torchrun not installed")


# -----------------------------------------------------------------------------------------------------------------
# Runs and what they wrote

def run_one(args, runs, name):
    cmd = [sys.executable, "train.py", *SMALL, "--runs-dir", str(runs), "--run-name", name, *args]
    subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, check=True, timeout=600)


def run_two(args, runs, name, **env):
    """train.py on 2 ranks under torchrun, each rank behind the device-only collectives of rank_main."""
    pytest.importorskip("torch._lazy.ts_backend", reason="this torch has no torch._lazy.ts_backend, which the two "
                                                     "ranks' device-only collectives run on")
    cmd = [TORCHRUN if os.path.exists(TORCHRUN) else "torchrun", "--standalone", "--nproc_per_node", "2",
           os.path.abspath(__file__), *SMALL, "--runs-dir", str(runs), "--run-name", name, *args]
    # gloo picks its interface from the hostname unless told; a CI container's hostname may not resolve
    # each rank runs this file as a script: the repository and the test helpers on its path
    env = {**ENV, **env, "GLOO_SOCKET_IFNAME": ENV.get("GLOO_SOCKET_IFNAME", "lo"),
           "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "support")])}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    # the ranks' own errors and where in train.py and minigrpo they rose first: torchrun's summary fills the tail
    errors = [ln for ln in out.stderr.splitlines() if "torch/distributed/" not in ln
              and ("Error" in ln or "train.py\"" in ln or "/minigrpo/" in ln)]
    assert out.returncode == 0, "\n".join(errors[:20]) + "\n...\n" + out.stderr[-1500:]


def assert_same_training(one, two, steps):
    """The same weights (to test_train.py's tolerance), and the same logged steps: rewards exactly, and the loss
    statistics, which count every rank's micro-batches (a rank without examples contributes none)."""
    (w1, last1), (w2, last2) = final_weights(one), final_weights(two)
    assert last1 == last2 == f"step-{steps}"
    for k in w1:
        assert torch.allclose(w1[k], w2[k], atol=ATOL, rtol=0), (k, (w1[k] - w2[k]).abs().max())
    m1, m2 = metrics(one), metrics(two)
    assert [m["step"] for m in m2] == list(range(1, steps + 1))
    assert [m["reward_mean"] for m in m1] == [m["reward_mean"] for m in m2]
    for key in ("grad_norm", "loss", "pg", "kl", "entropy", "sampler_logp_diff"):
        assert [m[key] for m in m2] == pytest.approx([m[key] for m in m1], rel=1e-4, abs=1e-6), key
    assert any(m["grad_norm"] > 0 for m in m1), "no step had a gradient: the weights would match trivially"


# -----------------------------------------------------------------------------------------------------------------
# The tests

@needs_torchrun
def test_two_ranks_on_a_group_that_moves_only_device_tensors_match_one_process(tmp_path):
    """Every collective of the loop (the step's loss normaliser, the gradients, the checks at a checkpoint) runs on
    the rank's collective device, and the result is the one-process run's. One task per rank and one group per
    micro-batch: each rank's micro-batch is then one of the one process's, and gloo's sum of two gradients is the
    sum autograd accumulates over two micro-batches, so only sampling differs (the sampler's batch). With 4 tasks
    on 2 ranks the two add the 4 micro-batches' gradients in other orders, and AdamW, which moves a weight by about
    lr whatever its gradient's size, makes the rounding of a near-zero gradient a weight difference over 1e-5."""
    args = ["--tasks-per-step", "2", "--group-size", "8", "--micro-batch", "8", "--steps", "2", "--seed", "1",
            "--save-every", "2"]
    run_one(args, tmp_path, "one")
    run_two(args, tmp_path, "two")
    assert_same_training(tmp_path / "one", tmp_path / "two", 2)


@needs_torchrun
def test_fewer_tasks_than_ranks_match_one_process(tmp_path):
    """tasks_per_step=1 on 2 ranks (gsm8k's preset on 8 GPUs, in small): rank 1 has no example, samples nothing,
    and joins every collective with empty contributions; no rank hangs and the update is the one-process one."""
    args = ["--tasks-per-step", "1", "--group-size", "16", "--micro-batch", "16", "--steps", "2", "--seed", "2",
            "--save-every", "2"]
    run_one(args, tmp_path, "one")
    run_two(args, tmp_path, "two")
    assert_same_training(tmp_path / "one", tmp_path / "two", 2)


@needs_torchrun
def test_every_rank_validates_its_share(tmp_path):
    """--eval-every: each rank rolls out its share of the val examples (rank 0 alone would keep the other ranks in a
    collective for the whole validation, past the timeout on a long one), and val_reward is the one process's."""
    args = ["--tasks-per-step", "2", "--group-size", "4", "--steps", "2", "--seed", "3", "--eval-every", "1",
            "--eval-limit", "3", "--save-every", "2"]
    run_one(args, tmp_path, "one")
    log = tmp_path / "validated"
    run_two(args, tmp_path, "two", VALIDATION_LOG=str(log))
    shares = [open(f"{log}.{rank}").read().split() for rank in (0, 1)]
    assert [len(share) for share in shares] == [2 * 2, 1 * 2]          # 2 and 1 of the 3 examples, at both steps
    assert not set(shares[0]) & set(shares[1])
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [m["val_reward"] for m in two] == [m["val_reward"] for m in one]
    assert [m["val_examples"] for m in two] == [3, 3]


def test_the_process_group_waits_as_long_as_the_longest_phase(monkeypatch):
    """The timeout is the run's longest expected phase with a margin (never under 30 minutes), and it reaches the
    process group: a soyuz step whose LLM judge retries, and a shared validation, are both counted."""
    import datetime

    import torch.distributed as dist

    from minigrpo.run.dist import init_distributed
    from minigrpo.run import dist_timeout
    from minigrpo.run.flags import resolve_args
    soyuz = resolve_args(["--task", "soyuz", "--judge", "claude", "--judge-timeout", "100", "--judge-retries", "1",
                          "--judge-workers", "4"])
    # one rank's 4 tasks x G=6 answers in waves of 4 workers, 2 tries of 100 s and the 2 s backoff, both turns;
    # sampling: 2 turns of one call of 1,024 decode steps (a validation's 44 tasks: 11 calls of a step's 4)
    step = 2 * 6 * (2 * 100 + 2) + 2 * 1024 * dist_timeout.FAST_STEP_S
    assert dist_timeout.phase_seconds(soyuz, 1, 4, 6) == step
    assert dist_timeout.phase_seconds(soyuz, 1, 44, 1) == 2 * 11 * (2 * 100 + 2) + 2 * 11 * 1024 * 0.05
    timeout, note = dist_timeout.collective_timeout(soyuz, 2), dist_timeout.timeout_note(soyuz, 2)
    assert timeout.total_seconds() == 2 * dist_timeout.phase_seconds(soyuz, 2, 4, 6)
    assert note.startswith(f"collective timeout {timeout.total_seconds() / 60:.0f} min") and "a step's rollouts" in note
    soyuz.eval_every, soyuz.eval_limit = 5, 44                        # 22 of 44 val tasks per rank, 1 sample each
    assert "the validation" in dist_timeout.timeout_note(soyuz, 2)
    assert dist_timeout.collective_timeout(resolve_args(["--task", "synthetic"]), 2).total_seconds() == 30 * 60
    assert dist_timeout.timeout_note(soyuz, 1) == ""                  # one process: no group, nothing to say
    assert dist_timeout.collective_timeout(argparse.Namespace(task="lookup"), 1) is None    # a pipeline's own task
    seen = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "init_process_group", lambda backend, timeout=None: seen.append((backend, timeout)))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    init_distributed(torch.device("cpu"), datetime.timedelta(minutes=90))
    assert seen == [("gloo", datetime.timedelta(minutes=90))]


def test_init_distributed_names_the_rank_gpu_as_the_collective_device(monkeypatch):
    """Under NCCL the collectives run on the rank's own GPU (--device cuda included: LOCAL_RANK's, not GPU 0);
    under gloo on the CPU whatever the model's device. torch.distributed and torch.cuda are stubbed: no GPU here."""
    import torch.distributed as dist

    from minigrpo.run.dist import init_distributed
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(dist, "init_process_group", lambda backend, timeout=None: calls.append(backend))
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(device))
    for given in (torch.device("cuda"), torch.device("cuda", 3)):
        calls.clear()
        got = init_distributed(given)
        assert (got.rank, got.world, got.device) == (3, 8, torch.device("cuda", 3))
        assert calls == [torch.device("cuda", 3), "nccl"]     # the GPU first: NCCL's communicator lives there
    calls.clear()
    assert init_distributed(torch.device("mps")).device == torch.device("cpu") and calls == ["gloo"]


def test_resume_loads_the_trainer_state_onto_the_rank_device(tmp_path, monkeypatch):
    """A checkpoint's optimizer state comes back on map_location (checkpoints.load), and train.py's resume asks
    for the rank's own device: rank 0 saved it from its GPU, and every rank would otherwise load it there."""
    import train
    from minigrpo.run import checkpoints
    from minigrpo.run.dist import Dist
    from minigrpo.update import adamw
    from minigrpo.run.folder import RunFolder
    model = load_pretrained("tiny", dtype=torch.float32, device="cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    opt, sched = adamw(params, 1e-3, 10)
    sum(p.sum() for p in params).backward()
    opt.step()
    run = RunFolder(str(tmp_path), "r")
    run.claim(fresh=True)
    run.create({"resume": False, "lora_r": 0})
    checkpoints.save(run.ckpt_dir, 1, model, train.trainer_state(1, DataState(), opt, sched, 0), lora=False)
    state = checkpoints.load(checkpoints.latest(run.ckpt_dir), model, lora=False, map_location="meta")
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if t.dim()]
    assert moments and all(t.device.type == "meta" for t in moments)
    seen, real = [], checkpoints.load
    monkeypatch.setattr(checkpoints, "load", lambda *a, **kw: seen.append(kw.get("map_location")) or real(*a, **kw))
    args = argparse.Namespace(resume=True, lora_r=0)
    assert train.resume_or_start(run, args, model, opt, sched, Dist(), torch.device("cpu"), 10)[1] == 1
    assert seen == [torch.device("cpu")]


# -----------------------------------------------------------------------------------------------------------------
# One rank, as torchrun starts it: this file is the script (see the module docstring)

def _device_only(real):
    """`real` (a torch.distributed tensor collective) refusing tensors off COLLECTIVE_DEVICE, the others run by
    gloo on CPU copies whose results are copied back."""
    def collective(*args, **kwargs):
        if kwargs.get("async_op"):
            raise NotImplementedError("the test's device-only collectives run synchronous calls only")
        moved = []                                # (the caller's tensor, the CPU copy gloo works on)

        def to_gloo(x):
            if isinstance(x, torch.Tensor):
                if x.device.type != COLLECTIVE_DEVICE:     # NCCL's words for a CPU tensor
                    raise RuntimeError(f"No backend type associated with device type {x.device.type} (this group "
                                       f"moves {COLLECTIVE_DEVICE} tensors only, as NCCL moves CUDA ones)")
                moved.append((x, x.cpu()))
                return moved[-1][1]
            if isinstance(x, (list, tuple)) and x and all(isinstance(t, torch.Tensor) for t in x):
                return type(x)(to_gloo(t) for t in x)
            return x

        out = real(*[to_gloo(a) for a in args], **{k: to_gloo(v) for k, v in kwargs.items()})
        for mine, copy in moved:
            mine.copy_(copy)
        return out
    return collective


def rank_main(argv):
    import torch._lazy.ts_backend
    import torch.distributed as dist
    torch._lazy.ts_backend.init()
    for name in TENSOR_COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _device_only(getattr(dist, name)))
    import train
    real_init = train.init_distributed

    def init_distributed(device, timeout=None):
        d = real_init(device, timeout)            # gloo, since the model is on the CPU
        d.device = torch.device(COLLECTIVE_DEVICE)
        return d

    train.init_distributed = init_distributed
    if os.environ.get("VALIDATION_LOG"):         # which val examples this rank rolled out (greedy, one sample each)
        real_task = train.task_from_args

        def task_from_args(args):
            task = real_task(args)
            real_rollout = task.rollout

            def rollout(generate, tok, examples, seeds, args):
                if args.temperature == 0.0:
                    with open(f"{os.environ['VALIDATION_LOG']}.{os.environ['RANK']}", "a") as f:
                        f.write("".join(f"{ex['id']}\n" for ex in examples))
                return real_rollout(generate, tok, examples, seeds, args)
            task.rollout = rollout
            return task
        train.task_from_args = task_from_args
    train.main(argv)


if __name__ == "__main__":
    rank_main(sys.argv[1:])
