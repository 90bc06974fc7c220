"""A soyuz step's rollout against its judge's latency: one sampler call per turn (train.py's default) vs chunks of
one or two tasks (where judging overlaps generation: 8 calls of 6 rows, or 4 of 12), through the real rollout loop
(train.rollout_step -> tasks/episodes.py) with a scripted judge of ~0 s and of ~20 s (a `claude -p` call) per answer.

Soyuz-shaped: 4 tasks x G=6, answer -> critique -> revision. The judge grades in a pool of --workers threads (soyuz's
--judge-workers: 8 by default; 24 = every row of a call at once). Two settings:

  cpu   the tiny model, sampled by train.py's own sampler call (--new-tokens tokens), in real time
  gpu   an estimate at the GPU's decode cost: the same loop, each sampler call sleeping COST(rows) seconds and
        returning scripted answers; the clock runs --scale times faster and the table reports unscaled seconds

The update after the rollout is the same either way, so the table gives the rollout: sampling + the judge's wait.

    python bench/judge_overlap.py                          # both settings, both latencies (about 15 minutes)
    python bench/judge_overlap.py --setting gpu            # the estimate only (seconds)
"""
import argparse
import contextlib
import io
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

import torch

import train
from minigrpo.run.dist import Dist
from minigrpo.judge import CriterionResult, Verdict
from minigrpo.pretrained import load_pretrained
from minigrpo.sampler import Sample
from minigrpo.tasks.soyuz import SoyuzTask
from minigrpo.tokenizer import Tokenizer

TASKS, G = 4, 6
GPU_CALL_6_S = 3.5      # one soyuz call of 6 rows x 1,024 tokens on one H200, fast path (estimated, not measured)
GPU_24_OVER_6 = 1.45    # a call of 24 rows against one of 6: the weights are read once per decode step either way
EXAMPLES = [{"id": f"t{k}", "family": "writing", "prompt": f"Write poem {k}.",
             "criteria": [{"id": "c1", "text": "Mentions the sea", "check": None},
                          {"id": "c2", "text": "Has four lines", "check": None}]} for k in range(TASKS)]


def gpu_call_seconds(rows):
    """The decode cost model: linear in rows between a 6-row call and a 24-row one (1.45x)."""
    return GPU_CALL_6_S * (1 + (GPU_24_OVER_6 - 1) * (rows - 6) / 18)


class Judge:
    """Every answer takes `latency` seconds in a pool of `workers`; the score is read off the answer's bytes."""

    def __init__(self, latency, workers):
        self.latency, self.pool, self.calls = latency, ThreadPoolExecutor(workers), 0

    def grade(self, task, answer):
        time.sleep(self.latency)
        self.calls += 1
        h = sum(answer.encode()) % 4
        return Verdict([CriterionResult("c1", h > 0, "no sea"), CriterionResult("c2", h > 1, "7 lines")], "scripted")

    def submit(self, task, answer):
        return self.pool.submit(self.grade, task, answer)

    def stats(self):
        return {"calls": self.calls, "errors": 0, "invalid": 0}


def scripted_generate(tok, scale, calls):
    """A sampler call of the GPU estimate: it sleeps the call's cost (scaled) and answers with scripted text."""
    def generate(prompts, seeds, n):
        calls.append(len(prompts) * n)
        time.sleep(gpu_call_seconds(len(prompts) * n) / scale)
        return [[Sample(0, tok.encode(t) + [tok.im_end_id], [-0.5] * (len(t) + 1), "eos", t)
                 for t in (f"answer {s} {j}" for j in range(n))] for s in seeds]
    return generate


def rollout_seconds(setting, chunk, latency, workers, args, tok, model):
    """(seconds of one step's rollout, sampler calls, seconds inside the sampler), unscaled."""
    scale = args.scale if setting == "gpu" else 1.0
    with contextlib.redirect_stdout(io.StringIO()):    # the task's start-up notes on the bundled tasks
        task = SoyuzTask(judge_obj=Judge(latency / scale, workers), data=None, chunk=chunk)
    calls, clock = [], train.PHASES
    clock.reset()
    t0 = time.perf_counter()
    if setting == "gpu":
        generate = scripted_generate(tok, scale, calls)

        def timed(prompts, seeds, n):
            with clock("generate"):
                return generate(prompts, seeds, n)
        task.rollout(timed, tok, EXAMPLES, list(range(TASKS)), ns(args))
    else:
        real = train.sample
        train.sample = lambda model, prompts, settings, **kw: (calls.append(len(prompts) * settings.n)
                                                               or real(model, prompts, settings, **kw))
        try:
            train.rollout_step(model, tok, task, ns(args), 0, list(enumerate(EXAMPLES)), Dist())
        finally:
            train.sample = real
    task.judge.pool.shutdown()
    return (time.perf_counter() - t0) * scale, calls, clock.times.get("generate", 0.0) * scale


def ns(args):
    return argparse.Namespace(seed=0, group_size=G, max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0,
                              top_k=0, decode=None, enable_thinking=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setting", choices=["cpu", "gpu", "both"], default="both")
    p.add_argument("--latencies", default="0,20", help="judge seconds per answer, comma-separated")
    p.add_argument("--workers", default="8,24", help="judge pool sizes, comma-separated")
    p.add_argument("--chunks", default="1,2,all", help="tasks per sampler call, comma-separated (all: one call)")
    p.add_argument("--new-tokens", type=int, default=32, help="cpu: tokens per answer")
    p.add_argument("--scale", type=float, default=20.0, help="gpu: the clock runs this many times faster")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tok, model = Tokenizer.from_pretrained("tiny"), load_pretrained("tiny")
    settings = ["cpu", "gpu"] if args.setting == "both" else [args.setting]
    print(f"soyuz-shaped rollout: {TASKS} tasks x G={G}, 2 turns; torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    rollout_seconds("cpu", None, 0.0, 1, args, tok, model)      # warm-up: the first calls pay one-time setup
    print("| setting | judge s/answer | judge workers | calls | rows per call | sampler s | rollout s |")
    print("|---|---|---|---|---|---|---|")
    for setting in settings:
        for latency in [float(x) for x in args.latencies.split(",")]:
            for workers in [int(x) for x in args.workers.split(",")]:
                for chunk in [None if c == "all" else int(c) for c in args.chunks.split(",")]:
                    name = "one call per turn" if chunk is None else f"chunk {chunk}"
                    seconds, calls, sampling = rollout_seconds(setting, chunk, latency, workers, args, tok, model)
                    print(f"| {setting} | {latency:g} | {workers} | {name}: {len(calls)} | "
                          f"{'/'.join(map(str, sorted(set(calls))))} | {sampling:.1f} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
