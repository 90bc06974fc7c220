"""The soyuz two-turn rollout: critique grounded in the verdict, per-turn rewards, advantages and loss masks,
judging overlapped with generation, and `train.py --task soyuz` end to end on the tiny model."""
import json
import os
import subprocess
import sys
import threading
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor

import pytest

import train
from minigrpo.run.dist import Dist
from minigrpo.judge import CriterionResult, Verdict
from minigrpo.sampler import Sample
from minigrpo.tasks.soyuz import SoyuzTask, critique, recovery_metrics
from minigrpo.tokenizer import Tokenizer

from repo_root import ROOT

TASKS = [{"id": f"t{k}", "family": "writing", "prompt": f"Write poem {k}.",
          "criteria": [{"id": "c1", "text": "Mentions the sea", "check": None},
                       {"id": "c2", "text": "Has exactly four lines", "check": None}]} for k in range(3)]


class ScriptedJudge:
    """Scores by keyword: 'good' passes both criteria, 'meh' one, anything else none. Optionally sleeps."""

    def __init__(self, delay=0.0, workers=16):
        self.delay, self.pool, self.calls = delay, ThreadPoolExecutor(workers), 0

    def grade(self, task, answer):
        time.sleep(self.delay)
        self.calls += 1
        sea = "good" in answer or "meh" in answer
        lines = "good" in answer
        return Verdict([CriterionResult("c1", sea, "no sea in it" if not sea else "ok"),
                        CriterionResult("c2", lines, "it has 7 lines" if not lines else "ok")], "scripted")

    def submit(self, task, answer):
        return self.pool.submit(self.grade, task, answer)

    def stats(self):    # the Judge's counters the task reads to tell a grader that is down
        return {"calls": self.calls, "errors": 0, "invalid": 0}


def scripted_generate(tok, turn0_texts, delay=0.0, log=None):
    """Turn 0 (n > 1): the scripted answers in order; turn 1 (n == 1): 'good' after a harsh critique, 'meh' after
    a light one."""
    def generate(prompts, seeds, n, reuse=None, keep=False):
        time.sleep(delay)
        out = []
        for p in prompts:
            text = tok.decode(p)
            if log is not None:
                log.append(text)
            if n > 1:
                texts = turn0_texts[:n]
            else:
                texts = ["good answer" if "Scrap it" in text else "meh answer"]
            out.append([Sample(0, tok.encode(t) + [tok.im_end_id], [-0.5] * (len(t) + 1), "eos", t) for t in texts])
        return out
    return generate


def rollout_args(G):
    return Namespace(group_size=G, enable_thinking=False, adv_scale="group", mask_truncated=False)


def test_rollout_rewards_advantages_masks_and_critique():
    tok = Tokenizer.from_pretrained("tiny")
    task = SoyuzTask(judge_obj=ScriptedJudge(), data=None)
    task.tasks = TASKS[:1]
    prompts_seen = []
    seqs = task.rollout(scripted_generate(tok, ["bad answer", "good answer", "meh answer"], log=prompts_seen),
                        tok, TASKS[:1], [11], rollout_args(3))
    assert [s.turn for s in seqs] == [0, 1, 0, 1, 0, 1]
    s0 = [s.score for s in seqs if s.turn == 0]
    s1 = [s.score for s in seqs if s.turn == 1]
    assert s0 == [0.0, 1.0, 0.5]
    assert s1 == [1.0, 0.5, 0.5]               # bad -> harsh critique -> good; good/meh -> light -> meh
    # turn-1 reward = s1 + 0.5 (s1 - s0); turn 0 reward = s0
    assert [s.reward for s in seqs if s.turn == 0] == s0
    assert [s.reward for s in seqs if s.turn == 1] == [1.0 + 0.5 * 1.0, 0.5 - 0.5 * 0.5, 0.5]
    # the critique quotes the judge: criterion text and reason, harsh for the bad start
    revision_prompts = [p for p in prompts_seen if "Your answer scored" in p]
    assert len(revision_prompts) == 3
    bad = revision_prompts[0]
    assert "scored 0/10" in bad and "Scrap it" in bad
    assert "Mentions the sea (no sea in it)" in bad and "Has exactly four lines (it has 7 lines)" in bad
    assert "bad answer" in bad                  # the whole conversation is the turn-1 prompt
    assert "scored 5/10" in revision_prompts[2] and "Scrap it" not in revision_prompts[2]
    # advantages: group-relative per turn (z-score with Bessel's std), computed here by hand
    train.assign_advantages(seqs, rollout_args(3))
    import statistics
    for turn in (0, 1):
        r = [s.reward for s in seqs if s.turn == turn]
        m, sd = statistics.mean(r), statistics.stdev(r)
        got = [s.advantage for s in seqs if s.turn == turn]
        assert got == pytest.approx([(x - m) / (sd + 1e-6) for x in r], abs=1e-6)
    # loss masks: exactly each turn's own tokens; the prompt (with the earlier turn and the critique) is never trained
    b = train.collate(seqs, tok.pad_id, "cpu")
    ids, mask, adv = b.ids, b.mask, b.adv
    for row, s in enumerate(seqs):
        c, T = len(s.completion_ids), ids.shape[1]
        assert mask[row].sum() == c
        assert mask[row, T - 1 - c:].all() and not mask[row, :T - 1 - c].any()
        assert ids[row, T - c:].tolist() == s.completion_ids     # the EOS it emitted is among the trained tokens
        assert adv[row] == pytest.approx(s.advantage)


def test_zero_spread_uses_raw_scores_not_shaped_rewards():
    """Three revisions that all score 0.5 (raw) but climbed from different turn-0 scores: their shaped rewards
    differ, yet the group carries no signal and must get advantage 0 (docs/pitfalls.md 13)."""
    from minigrpo import grpo
    from minigrpo.tasks.base import Seq
    s0 = [0.0, 0.5, 1.0]
    seqs = []
    for a in s0:
        seqs.append(Seq("t", 0, [1], [2], [0.0], "eos", "", a, a))
        seqs.append(Seq("t", 1, [1], [2], [0.0], "eos", "", 0.5, grpo.recovery_rewards(a, 0.5)))
    assert len({s.reward for s in seqs if s.turn == 1}) == 3
    stats = train.assign_advantages(seqs, rollout_args(3))
    assert all(s.advantage == 0 for s in seqs if s.turn == 1)
    assert any(s.advantage != 0 for s in seqs if s.turn == 0)
    assert stats["zero_spread"] == 1


def test_recovery_metrics():
    from minigrpo.tasks.base import Seq
    mk = lambda turn, score: Seq("t", turn, [1], [2], [0.0], "eos", "", score)
    seqs = [mk(0, 0.2), mk(1, 0.8), mk(0, 0.4), mk(1, 0.3), mk(0, 0.9), mk(1, 0.4)]
    m = recovery_metrics(seqs)
    assert m["recovery"] == pytest.approx(((0.8 - 0.2) + (0.3 - 0.4)) / 2)
    assert m["bad_to_good"] == 0.5 and m["good_to_bad"] == 1.0 and m["bad_start_share"] == pytest.approx(2 / 3)


def test_critique_without_verdict_is_generic():
    assert "improved" in critique({"criteria": []}, None)


def test_with_chunks_judging_overlaps_generation():
    """chunk=1: turn 0 of task 1 is sampled while task 0's answers are being judged. Asserted on the order of events:
    task 0's verdicts cannot finish before the sampler has been called for task 1 (their judge waits for that call),
    so a loop that waited for them first would see them finish only when the judge gives up, after which the order
    below fails. The wait's bound is only there so that such a loop fails instead of hanging."""
    tok = Tokenizer.from_pretrained("tiny")
    events, second_call = [], threading.Event()
    lock = threading.Lock()

    def log(*what):
        with lock:
            events.append((time.perf_counter(), *what))

    class GatedJudge(ScriptedJudge):
        def grade(self, task, answer):
            log("judge start", task["id"])
            if task["id"] == "t0":
                second_call.wait(timeout=30)
            verdict = super().grade(task, answer)
            log("judge end", task["id"])
            return verdict

    generate = scripted_generate(tok, ["bad", "good"])

    def sampler(prompts, seeds, n, reuse=None, keep=False):
        log("sample start", len(prompts), n)
        if len([e for e in events if e[1] == "sample start"]) == 2:
            second_call.set()
        return generate(prompts, seeds, n)
    task = SoyuzTask(judge_obj=GatedJudge(), data=None, chunk=1)
    examples = [dict(TASKS[0], id=f"t{k}") for k in range(3)]
    seqs = task.rollout(sampler, tok, examples, [0, 1, 2], rollout_args(2))
    assert len(seqs) == 2 * 2 * 3
    at = lambda what, i=None: [e[0] for e in events if e[1] == what and (i is None or e[2] == i)]
    calls = [e[2:] for e in events if e[1] == "sample start"]
    assert calls[:2] == [(1, 2), (1, 2)]                      # turn 0 of task 0, then turn 0 of task 1
    second = at("sample start")[1]
    answers = at("judge start", "t0")[:2]                    # task 0's two answers (its revisions come later)
    assert max(answers) < second < min(at("judge end", "t0"))   # they are judged while task 1 is sampled


def test_one_sampler_call_per_turn_by_default(monkeypatch):
    """A soyuz-shaped step on the tiny model (4 tasks x G=6, answer then revision): by default one sampler call per
    turn with all of the step's rows, 4 prompts x 6 samples for the answers and 24 prompts x 1 for the revisions."""
    from minigrpo.pretrained import load_pretrained
    tok, model, calls = Tokenizer.from_pretrained("tiny"), load_pretrained("tiny"), []
    real = train.sample
    monkeypatch.setattr(train, "sample", lambda model, prompts, settings, **kw:
                        calls.append((len(prompts), settings.n)) or real(model, prompts, settings, **kw))
    task = SoyuzTask(judge_obj=ScriptedJudge(), data=None)
    args = Namespace(seed=0, group_size=6, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, decode=None,
                     enable_thinking=False)
    examples = [dict(TASKS[0], id=f"t{k}") for k in range(4)]
    seqs, _ = train.rollout_step(model, tok, task, args, 0, list(enumerate(examples)), Dist())
    assert calls == [(4, 6), (24, 1)]
    assert [s.turn for s in seqs] == [0, 1] * 24


def test_validation_samples_in_calls_of_a_steps_examples(monkeypatch):
    """train.py sets a step's examples as the task's chunk (run/callsize.py): the greedy validation (G=1, here 5
    tasks against a step's 2) then samples in calls of at most 2 prompts, never in one call of every val task,
    whose rows would need a static cache the memory plan does not count."""
    import torch

    from minigrpo.pretrained import load_pretrained
    from minigrpo.run import callsize
    from minigrpo.run.flags import resolve_args
    tok, model, calls = Tokenizer.from_pretrained("tiny"), load_pretrained("tiny"), []
    real = train.sample
    monkeypatch.setattr(train, "sample", lambda model, prompts, settings, **kw:
                        calls.append((len(prompts), settings.n)) or real(model, prompts, settings, **kw))
    task = SoyuzTask(judge_obj=ScriptedJudge(), data=None)
    task.tasks = [dict(TASKS[0], id=f"t{k}") for k in range(5)]
    args = resolve_args(["--task", "soyuz", "--model", "tiny", "--tasks-per-step", "2", "--group-size", "3",
                         "--max-new-tokens", "8", "--eval-every", "1", "--eval-limit", "5"])
    assert callsize.size_calls(task, args, "cpu", torch.float32, 1) == "one sampler call per turn (2 tasks x G=3 = 6 rows)"
    assert train.validate(model, tok, task, args, 0, Dist())["val_examples"] == 5
    assert sorted(calls) == [(1, 1)] * 2 + [(2, 1)] * 4          # 2 + 2 + 1 tasks, answer and revision each


BYTE_TASKS = [{"id": f"bytes-{k}", "family": "algorithms", "prompt": f"Write anything ({k}).", "criteria": [
    {"id": f"c{i + 1}", "text": text, "check": {"type": "regex", "pattern": pattern}} for i, (text, pattern) in
    enumerate([("has a digit", "[0-9]"), ("has a capital", "[A-Z]"), ("has a line break", "\\n"),
               ("has a vowel", "[aeiou]"), ("has a tag", "<")])]} for k in range(3)]


@pytest.mark.slow
def test_train_soyuz_tiny_end_to_end(tmp_path):
    """The soyuz preset (LoRA, beta 0.04, recovery shaping) on the tiny model with the local judge, checked by
    value from what the run logged: KL exactly 0 at LoRA init and > 0 once a step has moved the adapters; scores
    in [0, 1]; the turn-1 reward and the recovery metrics recomputed from the logged per-turn scores. The tasks are
    BYTE_TASKS: the soyuz tasks' own checks pay the random model's byte soup nothing (the writing checks fail it),
    so they give no reward spread to train on; these surface checks of its bytes do."""
    from minigrpo.tasks.soyuz import BAD
    data = tmp_path / "byte_tasks.json"
    data.write_text(json.dumps(BYTE_TASKS))
    cmd = [sys.executable, "train.py", "--task", "soyuz", "--model", "tiny", "--steps", "2", "--tasks-per-step", "2",
           "--group-size", "2", "--max-new-tokens", "24", "--lr", "1e-3", "--seed", "1", "--runs-dir", str(tmp_path),
           "--run-name", "s", "--quiet", "--data", str(data)]
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    run = tmp_path / "s"
    metrics = [json.loads(ln) for ln in open(run / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2]
    config = json.loads(open(run / "config.json").read())
    assert config["beta"] > 0 and config["lora_r"] > 0 and config["mu"] == 1
    assert metrics[0]["kl"] == 0.0                       # B = 0 at init: policy == reference, exactly
    assert metrics[0]["grad_norm"] > 0                   # step 1 had reward spread, so the adapters moved
    assert metrics[1]["kl"] > 0                          # ... and step 2's KL to the LoRA-disabled base is > 0
    samples = [json.loads(ln) for ln in open(run / "samples.jsonl")]
    assert len(samples) == 2 * 2 * 2 * 2            # steps x tasks x G x turns
    assert [s["turn"] for s in samples] == [0, 1] * 8   # each rollout's turn 0, then its revision
    assert all(s["score"] is not None and 0.0 <= s["score"] <= 1.0 for s in samples)
    for step, m in zip((1, 2), metrics):
        logged = [s for s in samples if s["step"] == step]
        pairs = [(a["score"], b["score"]) for a, b in zip(logged[0::2], logged[1::2])]
        for (s0, s1), rev in zip(pairs, logged[1::2]):
            assert rev["reward"] == pytest.approx(s1 + 0.5 * (s1 - s0))       # the recovery shaping, coef 0.5
        for a in logged[0::2]:
            assert a["reward"] == a["score"]                                  # turn 0: its raw score
        bad = [(a, b) for a, b in pairs if a < BAD]
        assert 0.0 <= m["score_turn0"] <= 1.0 and 0.0 <= m["score_turn1"] <= 1.0
        assert m["turn0_score"] == pytest.approx(sum(a for a, _ in pairs) / len(pairs))
        assert m["final_score"] == pytest.approx(sum(b for _, b in pairs) / len(pairs))
        assert m["reward_mean"] == pytest.approx(m["final_score"])
        assert m["bad_start_share"] == pytest.approx(len(bad) / len(pairs))
        if bad:
            assert m["recovery"] == pytest.approx(sum(b - a for a, b in bad) / len(bad))
    assert (run / "judge_cache.sqlite").exists()
    assert (run / "checkpoints" / "step-2" / "adapter" / "adapter_config.json").exists()


@pytest.mark.slow
def test_a_judge_that_is_down_stops_the_run(tmp_path):
    # every grader call fails: the run stops after JUDGE_DOWN_STEPS steps with one line naming the judge, instead
    # of training on through "reward None". Seed 1 draws two writing tasks and one code task, whose machine checks
    # are quick (seed 0 drew refactor-orders, whose checks take seconds more each step and prove nothing more here)
    cmd = [sys.executable, "train.py", "--task", "soyuz", "--model", "tiny", "--steps", "10", "--tasks-per-step", "1",
           "--group-size", "2", "--max-new-tokens", "8", "--runs-dir", str(tmp_path), "--run-name", "s", "--quiet",
           "--judge", "cmd:/bin/false", "--judge-workers", "2", "--judge-retries", "0", "--seed", "1"]
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 4, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "cmd:/bin/false judge failed every call for 3 steps" in last, last
    assert oct((tmp_path / "s").stat().st_mode & 0o777) == oct(0o700)     # run folders are private
