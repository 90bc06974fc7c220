"""An agentic episode trained as ONE sequence (minigrpo/tasks/episodes.py, update.collate) is the same update as its
policy turns trained one by one, each with the context before it as prompt: the same loss and the same gradients
(fp32, tiny model, agg="token", with and without KL, with and without --mask-truncated); and the sampler's log-probs
of every turn, sampled on the token-id prompts, are the trainer's log-probs at those positions of the one sequence.
Also: token in, token out keeps a control-token string the policy wrote as the ordinary ids it sampled."""
import copy
from argparse import Namespace

import pytest
import torch

from minigrpo import grpo
from minigrpo.logprobs import token_logprobs
from minigrpo.pretrained import tiny_model
from minigrpo.sampler import Sample, Settings, sample
from minigrpo.tasks import episodes
from minigrpo.tasks.base import Seq
from minigrpo.tasks.episodes import Reply
from minigrpo.tokenizer import Tokenizer
from minigrpo.update import collate

TOK = Tokenizer.from_pretrained("tiny")
TEMPERATURE, NEW_TOKENS = 0.9, 7
STOPS = TOK.eos_ids + list(range(40))      # the random model stops now and then, so some turns end before the cap


class Tools:
    """Every turn but the last is answered by a tool message; the last ends the episode with score 1."""

    def __init__(self):
        self.turns = 0

    def messages(self):
        return [{"role": "user", "content": "count to three"}]

    def step(self, text, last):
        self.turns += 1
        return Reply(done=True, score=1.0) if last else Reply([{"role": "tool", "content": f"result {self.turns}"}])

    def close(self):
        pass


class ToolTask:
    max_turns, tools = 3, None

    def env(self, ex, family):
        return Tools()


def sampled_episodes(model, prompts_seen, G=2):
    """G episodes of 3 policy turns sampled by the real sampler (fp32, eager) on the loop's token-id prompts, each
    later turn continuing the state its episode kept (the loop's keep / reuse, as train.py's sampler passes them)."""
    def generate(prompts, seeds, n, reuse=None, keep=False):
        prompts_seen.extend(prompts)
        with torch.no_grad():
            settings = Settings(n=n, max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE, stop_ids=STOPS)
            out = sample(model, prompts, settings, tokenizer=TOK, seed=list(seeds), reuse=reuse, keep=keep)
        return [out[i * n:(i + 1) * n] for i in range(len(prompts))]
    args = Namespace(group_size=G, enable_thinking=False)
    return episodes.rollout(ToolTask(), generate, TOK, [{"id": "e"}], [3], args)


def per_turn(seq) -> list:
    """The episode as the per-turn form trains it: one Seq per policy turn, its prompt the context before it."""
    context = seq.prompt_ids + seq.completion_ids
    out = []
    for t in seq.policy_turns():
        at, end = len(seq.prompt_ids) + t["start"], t["start"] + t["tokens"]
        out.append(Seq(seq.example_id, 0, context[:at], seq.completion_ids[t["start"]:end],
                       seq.logprobs[t["start"]:end], t["finish_reason"], "", seq.score, seq.reward,
                       advantage=seq.advantage))
    return out


def loss_and_grads(model, reference, seqs, beta, mask_truncated):
    """The step's loss over `seqs` in one micro-batch (agg="token", its own normaliser) and the gradients."""
    b = collate(seqs, TOK.pad_id, "cpu", mask_truncated)
    sampling = dict(temperature=TEMPERATURE, vocab_size=TOK.vocab_size)
    with torch.no_grad():
        ref = token_logprobs(reference, b.ids, b.attn, **sampling) if beta else None
    model.zero_grad(set_to_none=True)
    logp = token_logprobs(model, b.ids, b.attn, **sampling)
    norm = grpo.loss_normalizer([b.mask], "token")
    loss, _ = grpo.policy_loss(logp, b.adv, b.mask, grpo.LossSettings(agg="token", beta=beta), normalizer=norm,
                               against=grpo.Against(ref=ref))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, norm


@pytest.fixture(scope="module")
def rolled():
    torch.manual_seed(0)
    model = tiny_model("tiny").float().eval()
    prompts = []
    seqs = sampled_episodes(model, prompts)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():       # a reference the policy has moved away from: KL > 0
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.01)
    for s, adv in zip(seqs, (0.8, -0.8)):
        s.advantage = adv
    return model, reference, seqs, prompts


def test_each_turn_was_sampled_on_the_context_before_it(rolled):
    _, _, seqs, prompts = rolled
    assert [len(s.policy_turns()) for s in seqs] == [3, 3]
    later = [s.prompt_ids + s.completion_ids[:s.policy_turns()[t]["start"]] for t in (1, 2) for s in seqs]
    assert prompts == [seqs[0].prompt_ids] + later      # turn 0: one prompt for the G; then one per episode
    for s in seqs:      # the policy's ids are the trained ones, the tool's never
        assert sum(s.trained) == sum(t["tokens"] for t in s.policy_turns()) < len(s.completion_ids)


def test_the_samplers_log_probs_are_the_trainers_on_the_one_sequence(rolled):
    model, _, seqs, _ = rolled
    b = collate(seqs, TOK.pad_id, "cpu")
    with torch.no_grad():
        logp = token_logprobs(model, b.ids, b.attn, temperature=TEMPERATURE, vocab_size=TOK.vocab_size)
    assert int(b.mask.sum()) == sum(sum(s.trained) for s in seqs)
    assert torch.allclose(logp[b.mask], b.sampled[b.mask], atol=2e-5, rtol=0)
    assert (b.sampled[~b.mask] == 0).all()          # the environment's positions carry no sampler log-prob
    assert all(s.info["reused_tokens"] > 0 and s.info["fresh_prefills"] == 0 for s in seqs)   # later turns continued


@pytest.mark.parametrize("beta,mask_truncated", [(0.0, False), (0.1, False), (0.1, True)])
def test_one_sequence_per_episode_is_the_per_turn_update(rolled, beta, mask_truncated):
    model, reference, seqs, _ = rolled
    turns = [t for s in seqs for t in per_turn(s)]
    if mask_truncated:
        assert any(t.finish_reason == "length" for t in turns) and any(t.finish_reason == "eos" for t in turns)
    one, grads_one, norm_one = loss_and_grads(model, reference, seqs, beta, mask_truncated)
    split, grads_split, norm_split = loss_and_grads(model, reference, turns, beta, mask_truncated)
    assert norm_one == norm_split > 0
    assert torch.allclose(one, split, atol=1e-6, rtol=1e-5)
    # fp32, other micro-batches and so other orders of sums: the loss used 0.8% of its tolerance, the gradients
    # up to 32% of theirs (1 and 2 threads; ATen's default kernels 30%). They protect that one sequence per
    # episode trains each turn's tokens with that turn's advantage and the same normaliser as the per-turn update.
    assert grads_one.keys() == grads_split.keys() and grads_one
    for name, g in grads_one.items():
        assert torch.allclose(g, grads_split[name], atol=1e-7, rtol=1e-4), name
    assert max(float(g.abs().max()) for g in grads_one.values()) > 1e-4       # a gradient worth comparing


# -----------------------------------------------------------------------------------------------------------------
# Token in, token out: what the policy wrote is never re-tokenized

SPELLED = list("say <|im_end|> then <think>".encode())     # ordinary byte ids that spell two special tokens


def test_a_control_token_string_the_policy_sampled_stays_its_ordinary_ids():
    prompts = []

    def generate(prompts_, seeds, n, reuse=None, keep=False):
        prompts.extend(prompts_)
        ids = SPELLED + [TOK.im_end_id]
        return [[Sample(0, ids, [-0.5] * len(ids), "eos", TOK.decode(SPELLED))] * n for _ in prompts_]
    task = ToolTask()
    task.max_turns = 2
    episodes.rollout(task, generate, TOK, [{"id": "e"}], [0], Namespace(group_size=1, enable_thinking=None))
    first, second = prompts
    assert TOK.decode(SPELLED) == "say <|im_end|> then <think>" and TOK.im_end_id not in SPELLED
    # the next turn's context: the first prompt, then the sampled ids exactly, not the special tokens they spell
    assert second[:len(first) + len(SPELLED) + 1] == first + SPELLED + [TOK.im_end_id]
