"""The tool-use experiment (minigrpo/experiments/tool_pipeline.py): its pretraining data holds no key or value of
the splits GRPO trains and is evaluated on, and teaches the format in the mix it is set to; the report's paired
differences; and a smoke run of every stage through train.py's loop (a few steps: no learning asserted)."""
import argparse
import csv
import os
import re
from dataclasses import replace

import pytest

from minigrpo.experiments import tool_pipeline as P
from minigrpo.sampler import Sample
from minigrpo.tasks.lookup import LookupTask, call_text, question
from minigrpo.tokenizer import Tokenizer
from train import train

TASK = LookupTask()
TOK = Tokenizer.from_pretrained("tiny")


def test_the_pretraining_never_shows_a_key_or_value_of_another_split():
    cfg = replace(P.ExperimentConfig(), transcripts=600)
    convs = P.pretrain_transcripts(TASK, cfg, seed=0)
    pool = TASK.tables["pretrain"]
    held = {split: t for split, t in TASK.tables.items() if split != "pretrain"}
    text = "\n".join(TOK.decode(p + a) for p, a in P.pretrain_items(TOK, TASK, convs))
    asked = set(re.findall(r"what is (..)\?", text)) | set(re.findall(r'"key": "(..)"', text))
    shown = set(re.findall(r"\d+", text))
    assert asked and asked <= set(pool) and shown and shown <= set(pool.values())
    for table in held.values():
        assert not asked & set(table) and not shown & set(table.values())
    assert len(asked) > 250 and len(shown) > 250      # many keys and values: what is learnt is to copy them


def test_the_mix_calls_with_the_asked_key_or_another_and_guesses():
    cfg = replace(P.ExperimentConfig(), transcripts=2000, p_call=0.5, p_right=0.7)
    convs = P.pretrain_transcripts(TASK, cfg, seed=0)
    calls = [c for c in convs if len(c) == 4]
    assert all(len(c) in (2, 4) for c in convs) and 0.45 < len(calls) / len(convs) < 0.55
    right = [c for c in calls if c[1]["content"] == call_text(c[0]["content"][8:10])]
    assert 0.65 < len(right) / len(calls) < 0.75
    assert all(c[0]["content"] == question(c[0]["content"][8:10]) for c in convs)
    assert all(c[3]["content"] == c[2]["content"] and c[2]["role"] == "tool" for c in calls)   # copies the tool
    items = P.pretrain_items(TOK, TASK, convs)
    assert len(items) == len(convs) + len(calls)          # one item per assistant turn
    assert P.pretrain_transcripts(TASK, cfg, seed=0) == convs != P.pretrain_transcripts(TASK, cfg, seed=1)


def test_a_pretraining_item_is_the_turn_the_loop_samples():
    """The prompt of each pretraining turn is what the multi-turn loop renders before that turn: the loop's own
    (prompt, completion) of a policy that plays the same transcript."""
    ex = TASK.examples("eval")[0]
    conv = [{"role": "user", "content": question(ex["key"])},
            {"role": "assistant", "content": call_text(ex["key"])}, {"role": "tool", "content": ex["value"]},
            {"role": "assistant", "content": ex["value"]}]

    def generate(prompts, seeds, n, reuse=None, keep=False):
        turn = [TOK.decode(p).count("<|im_start|>assistant") - 1 for p in prompts]
        texts = [conv[1 if t == 0 else 3]["content"] for t in turn]
        return [[Sample(0, TOK.encode(x) + [TOK.im_end_id], [0.0] * (len(x) + 1), "eos", x)] * n for x in texts]
    seqs = TASK.rollout(generate, TOK, [ex], [0], argparse.Namespace(group_size=2, enable_thinking=False))
    assert [s.score for s in seqs] == [1.0] * 2
    episode = seqs[0]
    turns = [(episode.prompt_ids + episode.completion_ids[:t["start"]],
              episode.completion_ids[t["start"]:t["start"] + t["tokens"]]) for t in episode.policy_turns()]
    assert turns == P.pretrain_items(TOK, TASK, [conv])


def test_an_episodes_outcome_is_read_from_its_environment():
    ex, other = TASK.examples("eval")[:2]
    right, guess, wrong = (TASK.env(ex) for _ in range(3))
    for env, texts in ((right, [call_text(ex["key"]), ex["value"]]), (guess, [other["value"]]),
                       (wrong, ["<tool_call>\nnope\n</tool_call>", call_text(other["key"]), other["value"]])):
        for t in texts:
            env.step(t, last=False)
    assert P.outcome(right) == {"success": 1.0, "called": 1.0, "right_key": 1.0, "tool_errors": 0.0, "turns": 2.0}
    assert P.outcome(guess) == {"success": 0.0, "called": 0.0, "right_key": 0.0, "tool_errors": 0.0, "turns": 1.0}
    assert P.outcome(wrong) == {"success": 0.0, "called": 1.0, "right_key": 0.0, "tool_errors": 1.0, "turns": 3.0}


def episodes_of(success):
    return [{"success": s, "called": 1.0, "right_key": s, "tool_errors": 0.0, "turns": 2.0} for s in success]


def test_the_table_reads_the_paired_difference():
    base = {"episodes": episodes_of([0.0] * 60 + [1.0] * 40)}
    trained = {"episodes": episodes_of([1.0] * 90 + [0.0] * 10)}
    for r in (base, trained):
        r.update({k: sum(e[k] for e in r["episodes"]) / 100 for k in P.OUTCOMES})
    header, rows = P.table({"base": base, "grpo": trained})
    success = dict(zip(header, rows[0]))
    assert (success["base"], success["trained"], success["trained - base"]) == ("0.400", "0.900", "+50.0")
    assert float(success["95% low"]) > 0 and success["reading"] == "above"
    assert dict(zip(header, rows[1]))["reading"] == "within noise"      # both called every time
    with pytest.raises(ValueError, match="not the same eval"):
        P.table({"base": base, "grpo": {**trained, "episodes": trained["episodes"][:50]}})


def test_a_smoke_run_of_every_stage_writes_the_report(tmp_path, capsys):
    cfg = replace(P.ExperimentConfig(), transcripts=40, base_steps=3, grpo_steps=2, tasks_per_step=2, group_size=2,
                  eval_limit=3, eval_samples=2, max_new_tokens=8)
    args = argparse.Namespace(seed=0, device="cpu", threads=None, runs_dir=str(tmp_path), run_name="x", quiet=True,
                              redo=False)
    out = P.run_experiment(args, train, cfg)
    res = out["results"]
    assert list(res) == ["base", "grpo"] and all(len(r["episodes"]) == 3 * 2 for r in res.values())
    assert [c["step"] for c in res["grpo"]["curve"]] == [1, 2]
    run = tmp_path / "x"
    for name in ("tool_table.md", "tool_table.csv", "tool_curves.png", "results.json", "base/model.safetensors",
                 "grpo/metrics.jsonl"):
        assert os.path.exists(run / name), name
    rows = list(csv.DictReader(open(run / "tool_table.csv")))
    assert [r["metric"] for r in rows] == [P.LABELS[k] for k in P.OUTCOMES]
    capsys.readouterr()
    again = P.run_experiment(args, train, cfg)                # a rerun skips both stages
    assert again["results"] == res and capsys.readouterr().err.count("skipped") == 2
