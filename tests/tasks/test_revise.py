"""The revise task (minigrpo/tasks/revise.py) and the two-turn code it shares with soyuz (minigrpo/tasks/twoturn.py):
scoring, the critique's content, the splits, the shaping flags (--recovery-coef, --no-turn0-guard) and what they
do to each turn's reward, for revise and soyuz alike."""
import re
from argparse import Namespace

import numpy as np
import pytest

import train
from minigrpo.run.flags import resolve_args
from minigrpo.run.folder import RunFolder
from minigrpo.sampler import Sample
from minigrpo.tasks import task_from_args, twoturn
from minigrpo.tasks.revise import RevisionTask, critique, grade, letter_sets
from minigrpo.tasks.soyuz import SoyuzTask
from minigrpo.tokenizer import Tokenizer

EX = {"id": "t", "letters": "dbca", "target": "abcd"}


def fake(tok, text):
    """What the sampler returns for `text` ended by EOS (the byte tokenizer: one id per character)."""
    return Sample(0, tok.encode(text) + [tok.im_end_id], [-0.5] * (len(text) + 1), "eos", text)


def apply_critique(previous: str, message: str, n: int) -> str:
    """What a perfect reviser writes: the previous answer with each named position replaced, cut to n letters."""
    out = list(previous[:n].ljust(n, "?"))
    for k, c in re.findall(r"(\d+):([a-j])", message):
        out[int(k) - 1] = c
    return "".join(out)


# -----------------------------------------------------------------------------------------------------------------
# Scoring and the critique

@pytest.mark.parametrize("answer, score", [("abcd", 1.0), (" abcd\n", 1.0), ("bacd", 0.5), ("ab", 0.5), ("", 0.0),
                                           ("abcde", 4 / 5), ("dcba", 0.0), ("abdc", 0.5)])
def test_score_is_the_share_of_correct_positions(answer, score):
    assert grade(EX, answer).score == pytest.approx(score)
    assert RevisionTask().score(EX, answer) == pytest.approx(score)


def test_critique_names_each_wrong_position_and_its_letter():
    assert critique(EX, grade(EX, "bacd")) == "fix 1:a 2:b"
    assert critique(EX, grade(EX, "ab")) == "fix 3:c 4:d"
    assert critique(EX, grade(EX, "abcdd")) == "fix keep 4"
    assert critique(EX, grade(EX, "abcd")) == "all correct"


def test_the_critique_carries_everything_a_revision_needs():
    """Whatever the first answer, applying its critique scores 1: the revision needs nothing the critique lacks."""
    rng = np.random.default_rng(0)
    task = RevisionTask()
    for ex in task.examples("train")[:100]:
        for _ in range(5):
            first = "".join(rng.choice(list("abcdefghij"), size=rng.integers(0, 8)))
            message = task.critique_for(ex, grade(ex, first))
            assert grade(ex, apply_critique(first, message, len(ex["target"]))).score == 1.0, (ex, first, message)


def test_splits_hold_out_the_eval_letter_sets():
    task = RevisionTask()
    split = {s: [ex["target"] for ex in task.examples(s)] for s in ("train", "val", "eval")}
    assert len(split["eval"]) == 64 and len(split["val"]) == 32 and len(split["train"]) == len(letter_sets()) - 96
    assert not set(split["eval"]) & set(split["train"]) and not set(split["val"]) & set(split["train"])
    for ex in task.examples("eval"):
        assert sorted(ex["letters"]) == list(ex["target"]) and 4 <= len(ex["target"]) <= 6
    assert task.examples("eval") == RevisionTask().examples("eval")          # fixed: every run evaluates the same
    with pytest.raises(ValueError, match="split"):
        task.examples("test")


def test_base_demonstrations_mix_both_skills():
    """The experiment's base data: turn-0 answers are the prompt's letters, sorted about half the time; a revision
    follows the answer and its true critique and either applies it (the sorted letters) or repeats the answer."""
    from minigrpo.experiments.revise_pipeline import base_items
    tok, task = Tokenizer.from_pretrained("tiny"), RevisionTask()
    items = base_items(tok, task, copies=2, seed=0, p_sorted=0.5, p_fixed=0.5)
    exs = [ex for ex in task.examples("train") for _ in range(2)]
    assert len(items) == 2 * len(exs)
    sorted0 = fixed = wrong0 = 0
    for ex, (p0, a0), (p1, a1) in zip(exs, items[0::2], items[1::2]):
        first, second = tok.decode(a0[:-1]), tok.decode(a1[:-1])
        assert a0[-1] == a1[-1] == tok.im_end_id and sorted(first) == sorted(ex["target"])
        ask = f"<|im_start|>user\nsort {ex['letters']}<|im_end|>\n<|im_start|>assistant\n"
        assert tok.decode(p0).startswith(ask) and p1[:len(p0) + len(a0)] == p0 + a0   # as the loop builds it
        assert f"user\n{critique(ex, grade(ex, first))}<|im_end|>" in tok.decode(p1)
        assert second in (first, ex["target"])
        sorted0 += first == ex["target"]
        wrong0 += first != ex["target"]
        fixed += first != ex["target"] and second == ex["target"]
    assert 0.4 < sorted0 / len(exs) < 0.6 and 0.4 < fixed / wrong0 < 0.6


# -----------------------------------------------------------------------------------------------------------------
# The rollout: rewards per turn, with and without the guard

def scripted(tok, firsts, log=None):
    """Turn 0 (n > 1): the scripted answers; turn 1 (n == 1): the perfect revision of the conversation's answer."""
    def generate(prompts, seeds, n, reuse=None, keep=False):
        out = []
        for p in prompts:
            text = tok.decode(p)
            if log is not None:
                log.append(text)
            if n > 1:
                out.append([fake(tok, a) for a in firsts[:n]])
            else:
                first = re.findall(r"assistant\n<think>\n\n</think>\n\n(\w*)<\|im_end\|>", text)[0]
                out.append([fake(tok, apply_critique(first, text.split("user\n")[-1], 4))])
        return out
    return generate


def revise_rollout(coef, guard, log=None):
    tok = Tokenizer.from_pretrained("tiny")
    task = RevisionTask(coef=coef, turn0_guard=guard)
    args = Namespace(group_size=3, enable_thinking=False, adv_scale="group")
    return task.rollout(scripted(tok, ["dcba", "abdc", "abcd"], log), tok, [EX], [7], args)


def test_guard_keeps_turn0_on_its_own_score_and_no_guard_pays_the_climb():
    guarded, unguarded = revise_rollout(0.5, True), revise_rollout(0.5, False)
    for seqs in (guarded, unguarded):
        assert [s.turn for s in seqs] == [0, 1] * 3
        assert [s.score for s in seqs] == [0.0, 1.0, 0.5, 1.0, 1.0, 1.0]       # every revision applies its critique
        assert [s.reward for s in seqs if s.turn == 1] == [1.5, 1.25, 1.0]     # s1 + 0.5 (s1 - s0)
    assert [s.reward for s in guarded if s.turn == 0] == [0.0, 0.5, 1.0]       # the guard: s0
    assert [s.reward for s in unguarded if s.turn == 0] == [1.5, 1.25, 1.0]    # the climb hack: worse start, more
    train.assign_advantages(guarded, Namespace(adv_scale="group"))
    train.assign_advantages(unguarded, Namespace(adv_scale="group"))
    order = lambda seqs: np.argsort([s.advantage for s in seqs if s.turn == 0]).tolist()
    assert order(guarded) == [0, 1, 2] and order(unguarded) == [2, 1, 0]      # the sorted answer: best vs worst


def test_coef_zero_pays_the_final_score_alone():
    seqs = revise_rollout(0.0, True)
    assert [s.reward for s in seqs] == [s.score for s in seqs]


def test_the_critique_is_the_second_user_turn_and_the_first_answer_is_prompt():
    log = []
    seqs = revise_rollout(0.5, True, log)
    revisions = [t for t in log if t.count("<|im_start|>user") == 2]
    assert len(revisions) == 3
    # the first answer as it was sampled, after turn 0's prompt (its empty think block included: token in, token out)
    assert "sort dbca<|im_end|>" in revisions[0] and "assistant\n<think>\n\n</think>\n\ndcba<|im_end|>" in revisions[0]
    assert "user\nfix 1:a 2:b 3:c 4:d<|im_end|>" in revisions[0] and "user\nall correct<|im_end|>" in revisions[2]
    tok = Tokenizer.from_pretrained("tiny")
    assert tok.decode(seqs[1].prompt_ids) == revisions[0]                      # never trained: it is prompt
    assert seqs[1].info["failed"] == [] and seqs[0].info["failed"] == ["1", "2", "3", "4"]


def test_soyuz_and_revise_share_the_two_turn_rollout(monkeypatch):
    """Both tasks' rollouts are twoturn.rollout: replaced there, both call the replacement."""
    from test_soyuz_rollout import ScriptedJudge
    calls = []
    monkeypatch.setattr(twoturn, "rollout", lambda task, *a: calls.append(task.name) or [])
    tok, args = Tokenizer.from_pretrained("tiny"), Namespace(group_size=2, enable_thinking=False)
    SoyuzTask(judge_obj=ScriptedJudge()).rollout(None, tok, [], [], args)
    RevisionTask().rollout(None, tok, [], [], args)
    assert calls == ["soyuz", "revise"]


def test_soyuz_takes_the_guard_and_coef_from_the_flags():
    from test_soyuz_rollout import TASKS, ScriptedJudge, scripted_generate
    tok = Tokenizer.from_pretrained("tiny")
    rewards = {}
    for guard in (True, False):
        task = SoyuzTask(judge_obj=ScriptedJudge(), coef=1.0, turn0_guard=guard)
        seqs = task.rollout(scripted_generate(tok, ["bad", "good", "meh"]), tok, TASKS[:1], [11],
                            Namespace(group_size=3, enable_thinking=False))
        rewards[guard] = [s.reward for s in seqs]
    # bad -> good, good -> meh, meh -> meh: turn 1 = s1 + 1.0 (s1 - s0); turn 0 = s0 with the guard
    assert rewards[True] == [0.0, 2.0, 1.0, 0.0, 0.5, 0.5]
    assert rewards[False] == [2.0, 2.0, 0.0, 0.0, 0.5, 0.5]                  # turn 0 = its rollout's shaped reward


# -----------------------------------------------------------------------------------------------------------------
# The flags

@pytest.mark.parametrize("task", ["revise", "soyuz"])
def test_flags_reach_the_task(task, tmp_path):
    RunFolder(str(tmp_path), "r").claim(fresh=True)         # soyuz's judge keeps its cache in the run folder
    run = ["--runs-dir", str(tmp_path), "--run-name", "r"]
    t = task_from_args(resolve_args(["--task", task, "--recovery-coef", "0.25", "--no-turn0-guard", *run]))
    assert (t.coef, t.turn0_guard) == (0.25, False)
    t = task_from_args(resolve_args(["--task", task, *run]))
    assert (t.coef, t.turn0_guard) == (0.5, True)
    if task == "soyuz":                             # an LLM judge's patience
        t = task_from_args(resolve_args(["--task", task, "--judge", "cmd:true", "--judge-retries", "5",
                                         "--judge-timeout", "7", *run]))
        assert (t.judge.retries, t.judge.timeout) == (5, 7.0)


@pytest.mark.parametrize("argv, flag", [
    (["--task", "revise", "--recovery-coef", "-1"], "--recovery-coef -1.0"),
    (["--task", "soyuz", "--recovery-coef", "nan"], "--recovery-coef nan"),
    (["--task", "synthetic", "--no-turn0-guard"], "--no-turn0-guard"),
    (["--task", "gsm8k", "--recovery-coef", "0.5"], "--recovery-coef"),
    (["--task", "synthetic", "--experiment"], "--experiment"),
    (["--task", "mdp", "--recovery-coef", "0"], "--recovery-coef"),
    (["--task", "revise", "--model", "tiny-qwen3.5", "--experiment"], "--experiment"),
    (["--task", "revise", "--experiment", "--no-turn0-guard"], "--no-turn0-guard"),
    (["--task", "revise", "--experiment", "--recovery-coef", "0"], "--recovery-coef"),
])
def test_bad_shaping_flags_are_one_line_errors(argv, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        train.main(argv + ["--runs-dir", str(tmp_path), "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error: ") and flag in err[0], err
