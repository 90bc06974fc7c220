"""The mdp pipeline (minigrpo/tasks/mdp_pipeline.py): its sequence plumbing, and a shrunken run of every stage."""
import json
import os
from dataclasses import replace

import pytest
import torch

from minigrpo import grpo
from minigrpo.lora import inject_lora, lora_layers
from minigrpo.tasks import mdp_pipeline as P
from minigrpo.tasks.mdp import MDPTask, compact_text, messages_for
from minigrpo.tokenizer import Tokenizer
from train import resolve_args

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 8}


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


def test_answer_logprobs_match_token_logprobs():
    """The last-K-positions shortcut scores the same tokens as grpo.token_logprobs with a position mask."""
    torch.manual_seed(0)
    tok = Tokenizer.from_pretrained("tiny")
    model = P.scratch_model(SMALL, 0, "cpu", torch.float32)
    items = [([256, 5, 6, 7, 8], [65, tok.im_end_id]), ([9, 10], [66, 67, tok.im_end_id])]   # padded batch
    for every in (False, True):
        ids, attn, mask = P.pad_batch(items, tok.pad_id, "cpu", every_token=every)
        ours = P.answer_logprobs(model, tok, (ids, attn, mask))
        T, K = ids.shape[1], mask.shape[1]
        full = grpo.token_logprobs(model, ids, attn, vocab_size=tok.vocab_size)              # (B, T-1)
        ref = torch.where(mask, full[:, T - 1 - K:], 0.0).sum(-1)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert mask.sum().item() == sum(len(p) + len(a) - 1 for p, a in items)


def test_strip_lora_restores_the_model():
    model = P.scratch_model(SMALL, 0, "cpu", torch.float32)
    ids = torch.randint(0, 256, (2, 7))
    before = model(ids)
    for p in inject_lora(model, r=4, alpha=8):
        torch.nn.init.normal_(p)
    assert not torch.allclose(model(ids), before)
    P.strip_lora(model)
    assert not lora_layers(model)
    torch.testing.assert_close(model(ids), before)


def test_shrunken_pipeline_sft_beats_random(tmp_path):
    """Every stage runs (pretrain, SFT, DPO, shuffled DPO, GRPO through train.py, the controls, the report), and
    SFT beats random on the records it plays. Shrunk to seconds, the run plays its 16 train records: SFT fits
    their states in a few hundred steps, while reading the columns well enough to generalise takes the quickstart's
    ~1500+ (the quickstart shows that part, on held-out records)."""
    cfg = replace(P.PIPELINES["tiny"], train_per_cell=2, eval_per_cell=1, eval_split="train", base_steps=20,
                  sft_steps=300, dpo_steps=3, grpo_steps=2, grpo_tasks=2, group_size=4)
    args = resolve_args(["--task", "mdp", "--model", "tiny", "--device", "cpu", "--runs-dir", str(tmp_path),
                         "--run-name", "mdp", "--quiet"])
    out = P.run_pipeline(args, cfg)
    res = out["results"]
    solved = lambda name: sum(r["solved"] for r in res[name]["overall"].values())
    assert solved("SFT") > solved("random")
    assert list(res) == list(P.ORDER)
    for name in ("overall_by_policy_budget.md", "regime_split.csv", "solve_rate_vs_budget.png", "results.json",
                 "sft/model.safetensors", "dpo_adapter/adapter_model.safetensors",
                 "grpo_adapter/adapter_model.safetensors"):
        assert os.path.exists(tmp_path / "mdp" / name), name
    assert json.load(open(tmp_path / "mdp" / "results.json"))["time"]["total"]["wall_s"] > 0
