"""The reference pass overlaps the judge (train.py task_rollout, tasks/episodes.py rollout's meanwhile): for a
two-turn task the step's fixed log-probs (reference, and the behaviour policy's with mu > 1) are computed once the
revisions are sampled, while the judge grades them. Asserted on the order of events and on equality, never on time:
the pass ends before the judge's revision grades are let go; the run equals the sequential one bit for bit; the
phase clock puts the pass inside the rollout; a Ctrl-C in that window leaves a run that resumes to the same end."""
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from safetensors.torch import load_file

import train
from minigrpo.judge import CriterionResult, Verdict
from minigrpo.run.steplog import is_timing
from minigrpo.tasks.soyuz import SoyuzTask

TASKS, G = 2, 2
FLAGS = ["--task", "soyuz", "--model", "tiny", "--tasks-per-step", str(TASKS), "--group-size", str(G),
         "--max-new-tokens", "8", "--micro-batch", "3", "--mu", "2", "--lr", "1e-3", "--save-every", "1",
         "--quiet", "--seed", "3"]
DATA = [{"id": f"t{k}", "family": "writing", "prompt": f"Write poem {k}.",
         "criteria": [{"id": "c1", "text": "even length", "check": None},
                      {"id": "c2", "text": "has an e", "check": None}]} for k in range(3)]
HOLD_S = 30      # how long a held grade waits to be let go: only so that a loop that waits first fails, not hangs


class HeldJudge:
    """Grades the random model's bytes so that groups spread (even length; an 'e'). With `gate`, the revisions'
    grades of step k (the second TASKS x G calls of the step) are held until gate() says step k's fixed
    log-probs are done, or HOLD_S pass; each grade's release is logged."""

    def __init__(self, gate=None, log=None):
        self.pool, self.calls, self.gate, self.log = ThreadPoolExecutor(8), 0, gate, log
        self.lock = threading.Lock()

    def grade(self, index, answer):
        step, revision = divmod(index, 2 * TASKS * G)
        if self.gate is not None and revision >= TASKS * G:
            released = self.gate(step)
            self.log.append(("graded", step, released))
        return Verdict([CriterionResult("c1", len(answer) % 2 == 0, "length"),
                        CriterionResult("c2", "e" in answer, "letter")], "held")

    def submit(self, task, answer):
        with self.lock:
            index, self.calls = self.calls, self.calls + 1
        return self.pool.submit(self.grade, index, answer)

    def stats(self):
        return {"calls": self.calls, "errors": 0, "invalid": 0}


def soyuz(judge, overlap=True):
    task = SoyuzTask(judge_obj=judge)
    task.tasks = DATA
    task.overlaps_grading = overlap          # False: the rollout, then the pass (the sequential order)
    return task


def run(tmp_path, name, task, steps=2, resume=False):
    args = train.resolve_args([*FLAGS, "--runs-dir", str(tmp_path), "--run-name", name, "--steps", str(steps),
                               *(["--resume"] if resume else [])])
    train.train(args, task=task)
    return outcome(tmp_path / name)


def outcome(folder):
    """What a run leaves that must not depend on when its log-probs were computed: every metric but the clock's,
    the samples, the adapter of every checkpoint."""
    rows = [json.loads(line) for line in open(folder / "metrics.jsonl")]
    metrics = [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]
    samples = open(folder / "samples.jsonl").read()
    adapters = {str(p.relative_to(folder)): {k: (v.dtype, v.numpy().tobytes()) for k, v in load_file(p).items()}
                for p in sorted(folder.glob("checkpoints/step-*/adapter/*.safetensors"))}
    return metrics, samples, adapters, rows


def gated(monkeypatch, log):
    """(gate, the fixed log-probs wrapper): each fixed_logprobs call logs its end and lets its step's held grades go."""
    done, cond = [0], threading.Condition()
    real = train.fixed_logprobs

    def fixed_logprobs(*a, **k):
        out = real(*a, **k)
        log.append(("fixed", done[0], out.refs[0] is not None and out.olds[0] is not None))
        with cond:
            done[0] += 1
            cond.notify_all()
        return out

    def gate(step):
        with cond:
            return cond.wait_for(lambda: done[0] > step, timeout=HOLD_S)
    monkeypatch.setattr(train, "fixed_logprobs", fixed_logprobs)
    return gate


def test_the_reference_pass_ends_before_the_judge_lets_the_revisions_go(tmp_path, monkeypatch):
    """Every revision grade of a step waits for that step's fixed log-probs, so it is let go (released True) only if
    they were computed while it was pending; a loop that took the grades first would see each one wait HOLD_S
    and give up (released False), then compute the pass: the log below would differ."""
    log = []
    run(tmp_path, "o", soyuz(HeldJudge(gated(monkeypatch, log), log)))
    fixed = [e for e in log if e[0] == "fixed"]
    assert fixed == [("fixed", 0, True), ("fixed", 1, True)]          # reference and behaviour policy, each step
    for step in (0, 1):
        graded = [i for i, e in enumerate(log) if e[:2] == ("graded", step)]
        assert len(graded) == TASKS * G and all(log[i][2] for i in graded)
        assert log.index(fixed[step]) < min(graded)


def test_the_overlapped_run_equals_the_sequential_one_and_its_clock_shows_the_pass_inside(tmp_path):
    """Same tokens, same model state: the metrics, samples and adapters of the overlapped run equal those of the
    sequential one exactly (a pass that read the advantages before they were set, or a batch cut differently,
    changes the loss). The overlapped rows carry the pass as time_overlapped, inside time_sample."""
    overlapped, sequential = run(tmp_path, "o", soyuz(HeldJudge())), run(tmp_path, "s", soyuz(HeldJudge(), False))
    assert overlapped[:3] == sequential[:3]
    assert len(overlapped[2]) == 2 and all(m["grad_norm"] > 0 for m in overlapped[0])    # each step had spread
    for m in overlapped[3]:
        assert m["time_overlapped"] == m["time_reference"] > 0 and m["time_judge_wait"] >= 0
        assert m["time_generate"] + m["time_judge"] + m["time_overlapped"] == pytest.approx(m["time_sample"])
    for m in sequential[3]:
        assert "time_overlapped" not in m and "time_judge_wait" not in m
        assert m["time_generate"] + m["time_judge"] == pytest.approx(m["time_sample"])


def test_a_ctrl_c_while_the_judge_grades_leaves_a_run_that_resumes_to_the_same_end(tmp_path, monkeypatch):
    """KeyboardInterrupt in step 2's reference pass, with its revisions still being graded: the step writes no row
    and no checkpoint, the folder is released, and --resume ends where an uninterrupted run ends."""
    real, calls = train.fixed_logprobs, [0]

    def interrupted(*a, **k):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(train, "fixed_logprobs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "c", soyuz(HeldJudge()))
    folder = tmp_path / "c"
    assert [json.loads(line)["step"] for line in open(folder / "metrics.jsonl")] == [1]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step-1"]
    monkeypatch.setattr(train, "fixed_logprobs", real)
    resumed = run(tmp_path, "c", soyuz(HeldJudge()), resume=True)
    assert resumed[:3] == run(tmp_path, "u", soyuz(HeldJudge()))[:3]
