"""The mdp pipeline (minigrpo/experiments/mdp_pipeline.py): its prompts and data, and a shrunken run of every stage."""
import json
import os
from dataclasses import replace

import pytest
import torch

from minigrpo.experiments import mdp_pipeline as P
from minigrpo.tasks.mdp.task import MDPTask, compact_text, messages_for, relabel
from minigrpo.tokenizer import Tokenizer
from train import resolve_args, train

def test_compact_prompts_have_one_length_and_keep_the_scramble():
    task = MDPTask(train_per_cell=2, prompt="compact")
    tok = Tokenizer.from_pretrained("tiny")
    lens = {len(P.prompt_ids(tok, task, task.text(ex))) for ex in task.examples("train")}
    assert len(lens) == 1
    ex = task.examples("train")[0]
    plain, scrambled = task.text(ex), MDPTask(train_per_cell=2, scramble=True).text(ex)
    lines = lambda t: compact_text(t).splitlines()[1:-1]
    assert sorted(x[:-1] for x in lines(plain)) == sorted(x[:-1] for x in lines(scrambled))   # same summaries
    assert [x[-1] for x in lines(plain)] == list("ABCDEFGH")                                    # letters in order
    with pytest.raises(ValueError, match="prompt style"):
        messages_for(plain, "tiny")


def test_shrunken_pipeline_sft_beats_random(tmp_path):
    """Every stage runs (pretrain, SFT, DPO, shuffled DPO, GRPO through train.py, the controls, the report), and
    SFT beats random on the records it plays. Shrunk to seconds, the run plays its 16 train records: SFT fits
    their states in a few hundred steps, while reading the columns well enough to generalise takes the quickstart's
    ~1500+ (the quickstart shows that part, on held-out records)."""
    cfg = replace(P.PIPELINES["tiny"], train_per_cell=2, eval_per_cell=1, eval_split="train", base_steps=20,
                  sft_steps=300, dpo_steps=3, grpo_steps=2, grpo_tasks=2, group_size=4)
    args = resolve_args(["--task", "mdp", "--model", "tiny", "--device", "cpu", "--runs-dir", str(tmp_path),
                         "--run-name", "mdp", "--quiet"])
    out = P.run_pipeline(args, train, cfg)
    res = out["results"]
    solved = lambda name: sum(r["solved"] for r in res[name]["overall"].values())
    assert solved("SFT") > solved("random")
    assert list(res) == list(P.ORDER)
    for name in ("overall_by_policy_budget.md", "regime_split.csv", "probe_choices.md", "solve_rate_vs_budget.png",
                 "results.json", "sft/model.safetensors", "dpo_adapter/adapter_model.safetensors",
                 "grpo_adapter/adapter_model.safetensors"):
        assert os.path.exists(tmp_path / "mdp" / name), name
    assert json.load(open(tmp_path / "mdp" / "results.json"))["time"]["total"]["wall_s"] > 0


@pytest.mark.parametrize("flags", [["--lr", "1e-3"], ["--steps", "5", "--group-size", "4"], ["--resume"]])
def test_stage_flags_are_refused_not_ignored(flags, capsys):
    """The pipeline takes its stage settings from PIPELINES: a flag that would set them is a usage error."""
    import train
    with pytest.raises(SystemExit) as e:
        train.main(["--task", "mdp", "--model", "tiny", *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error:") and "PIPELINES" in err[0]
    assert all(f in err[0] for f in flags if f.startswith("--"))
    assert vars(resolve_args(["--task", "mdp", "--seed", "3", "--quiet"]))["seed"] == 3   # the flags it reads


@pytest.mark.parametrize("argv, named", [(["--task", "mdp"], "--task mdp"),
                                         (["--task", "revise", "--experiment"], "--experiment")])
def test_pipelines_refuse_torchrun(argv, named, monkeypatch, capsys, tmp_path):
    """The mdp pipeline and the revise experiment run their stages in one process: under torchrun (WORLD_SIZE > 1)
    they are refused before anything runs, not run once per rank into the same run folder."""
    import train
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        train.main([*argv, "--model", "tiny", "--runs-dir", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"train.py: error: {named}:") and "not torchrun" in err[0]
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert resolve_args([*argv, "--model", "tiny"]).task == argv[1]


def test_format_pretraining_answers_the_first_free_letter():
    """The from-scratch base learns the answer format and not to repeat a probe, nothing about which probe is
    good: its answer is the first letter not yet probed, whatever the probes' values (shuffled or not). Its data
    holds the states it will meet playing that rule (probed "", "A", "AB" on every train record)."""
    tok = Tokenizer.from_pretrained("tiny")
    task = MDPTask(train_per_cell=2, prompt="compact")
    items = P.format_items(tok, task, copies=2)
    exs = P.train_states(task, copies=2)                  # the states and two renamed copies of each
    n_rec = len(task.records("train"))
    assert len(items) == len(exs) + 3 * n_rec and len(exs) == 3 * len(task.examples("train"))
    probed = [ex["probed"] for ex in exs] + [st["probed"] for st in P.rule_states(task)]
    assert probed[len(exs):] == ["", "A", "AB"] * n_rec and any(probed[:len(exs)])
    for p, (prompt, answer) in zip(probed, items):
        letter = tok.decode(answer[:1])
        assert answer[1:] == [tok.im_end_id] and letter not in p
        assert all(c in p for c in "ABCDEFGH"[:"ABCDEFGH".index(letter)])
        shown = "".join(dict.fromkeys(p))                  # the compact prompt names a re-probed letter once
        assert f"probed={shown:-<3}" in tok.decode(prompt)
    assert P.format_items(tok, MDPTask(train_per_cell=2, prompt="compact", shuffle_rewards=True), copies=2) == items


def test_relabelled_states_are_the_same_game():
    """A renamed copy shows each probe's split and value under its new letter, and the oracle follows it."""
    task = MDPTask(train_per_cell=2)
    ex = next(e for e in task.examples("train") if e["probed"])
    perm = [3, 0, 7, 1, 6, 2, 5, 4]                  # probe k is shown as letter perm[k]
    new = relabel(ex, perm)
    for k in range(8):
        j = perm[k]
        assert new["view"]["splits"][j] == ex["view"]["splits"][k] and new["values"][j] == ex["values"][k]
        assert new["view"]["probes"][j] == ex["view"]["probes"][k]
    old_to_new = {"ABCDEFGH"[k]: "ABCDEFGH"[perm[k]] for k in range(8)}
    assert new["probed"] == "".join(old_to_new[c] for c in ex["probed"]) and new["oracle"] == old_to_new[ex["oracle"]]
    assert f" {new['probed'][0]}=" in task.text(new) and new["id"] != ex["id"]
    assert compact_text(task.text(new)).splitlines()[0] == f"left={ex['left']} probed={new['probed']:-<3}"
    tok = Tokenizer.from_pretrained("tiny")
    assert len(P.sft_items(tok, task, copies=2)) == 3 * len(task.examples("train"))


def test_a_rerun_skips_the_finished_stages_and_reruns_an_incomplete_one(tmp_path, capsys):
    """Each stage's output is its folder: a rerun into the same run folder skips every finished stage with one line
    each and ends with the same results; a stage whose output is damaged runs again, on the same weights and random
    numbers (its adapter comes out bit-identical), and a change of settings reruns everything."""
    from safetensors.torch import load_file
    cfg = replace(P.PIPELINES["tiny"], train_per_cell=2, eval_per_cell=1, eval_split="train", base_steps=2,
                  sft_steps=3, dpo_steps=2, grpo_steps=1, grpo_tasks=2, group_size=4, relabel=0)
    args = resolve_args(["--task", "mdp", "--model", "tiny", "--device", "cpu", "--runs-dir", str(tmp_path),
                         "--run-name", "mdp", "--quiet"])
    run = tmp_path / "mdp"
    first = P.run_pipeline(args, train, cfg)
    adapter = load_file(run / "grpo_adapter" / "adapter_model.safetensors")
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)      # GRPO trained something
    for stage in ("dpo_adapter", "grpo_adapter"):                  # the stage adapters name the SFT weights
        assert json.load(open(run / stage / "adapter_config.json"))["base_model_name_or_path"] == str(run / "sft")
    capsys.readouterr()
    again = P.run_pipeline(args, train, cfg)
    skipped = [ln for ln in capsys.readouterr().err.splitlines() if "skipped" in ln]
    assert [ln.split(":")[1].strip() for ln in skipped] == ["base", "sft", "dpo", "dpo-shuffled", "grpo"]
    assert again["results"] == first["results"] and again["invalid"] == first["invalid"]

    with open(run / "grpo_adapter" / "adapter_model.safetensors", "ab") as f:     # a damaged last stage
        f.write(b"\0")
    third = P.run_pipeline(args, train, cfg)
    err = capsys.readouterr().err
    assert "grpo: " + str(run / "grpo_adapter" / "adapter_model.safetensors") + " is missing or incomplete" in err
    assert err.count("skipped") == 4 and third["results"] == first["results"]
    again = load_file(run / "grpo_adapter" / "adapter_model.safetensors")
    assert all(torch.equal(adapter[k], again[k]) for k in adapter)

    P.run_pipeline(args, train, replace(cfg, dpo_steps=1))
    assert "skipped" not in capsys.readouterr().err
