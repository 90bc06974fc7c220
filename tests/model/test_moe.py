"""minigrpo/moe.py against its naive twin: the grouped and looped expert compute against a token-by-token sum over
each token's k experts, the cost (only routed pairs reach an expert), and routing replay (the replayed ids are
used, the weights stay differentiable, a route flip is counted). Torch only."""

import pytest
import torch
import torch.nn.functional as F

from minigrpo import moe
from minigrpo.model import MLP
from minigrpo.moe import SparseMoe
from minigrpo.pretrained import QwenConfig


def block(seed=0, dtype=torch.float32, **over):
    """A Qwen3.5-MoE-shaped sparse block (tiny-moe's widths, 8 experts, 2 a token), every weight random at a scale
    where routes are decided by clear margins and the experts' outputs are O(1)."""
    cfg = QwenConfig.tiny("tiny-moe")
    for k, v in over.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    b = SparseMoe(cfg, MLP)
    with torch.no_grad():
        for p in b.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    return b.to(dtype)


def naive(b, x, ids):
    """Token by token: sum_j w_j Expert_ids_j(x) with w = softmax(router logits) at ids (renormalised), plus the
    gated shared expert; fp32 throughout."""
    x = x.float().reshape(-1, x.shape[-1])
    W, gu, dn = b.gate.weight.float(), b.experts.gate_up_proj.float(), b.experts.down_proj.float()
    probs = torch.softmax(x @ W.T, -1)
    out = []
    for n in range(x.shape[0]):
        w = probs[n, ids[n]]
        w = w / w.sum() if b.gate.norm_topk_prob else w
        y = sum(w[j] * (dn[e] @ (F.silu(gu[e, :gu.shape[1] // 2] @ x[n]) * (gu[e, gu.shape[1] // 2:] @ x[n])))
                for j, e in enumerate(ids[n].tolist()))
        if hasattr(b, "shared_expert"):
            s = b.shared_expert.float()
            y = y + torch.sigmoid(b.shared_expert_gate.weight.float() @ x[n]) * s(x[n])
        out.append(y)
    return torch.stack(out)


def rel(a, b):
    """max |a - b| relative to the reference's largest entry."""
    return ((a - b).abs().max() / b.abs().max()).item()


def test_block_equals_naive_sum():
    b = block()
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        y = b(x)
    chosen = b.chosen.reshape(-1, 2)
    assert chosen.shape == (18, 2) and len(set(chosen.flatten().tolist())) > 4  # routes spread over experts
    # fp32: measured rel. max |diff| 3.9e-7 (1 and 2 threads); a dropped weight, expert or gate moves it past 1e-2
    assert rel(y.reshape(-1, 64), naive(b, x, chosen)) < 1e-5


@pytest.mark.parametrize("norm", [True, False])
def test_replayed_routes_are_used(norm):
    """Replaying routes other than the router's own: the output is the naive sum over the replayed experts, with
    the router's weights at those ids; `flips` counts the tokens whose own choice differs."""
    b = block(norm_topk_prob=norm)
    b.gate.norm_topk_prob = norm
    x = torch.randn(1, 12, 64)
    with torch.no_grad():
        b(x)
        own = b.chosen.clone()
        replay = (own + 1) % 8                        # every token routed elsewhere
        replay[0, :4] = own[0, :4].flip(-1)           # the first 4: the same experts in another order, not a flip
        b.replay = replay
        y = b(x)
    assert rel(y.reshape(-1, 64), naive(b, x, replay.reshape(-1, 2))) < 1e-5  # measured 4.5e-7
    assert b.flips.tolist() == [[False] * 4 + [True] * 8]
    assert torch.equal(b.chosen, own)  # the block still reports its own choice


def test_replay_gradient_reaches_router_through_weights():
    """With replay, d output / d router weight is the derivative of the gathered, renormalised softmax: compared
    with autograd through the naive twin (which has no top-k at all)."""
    b = block()
    x = torch.randn(1, 6, 64)
    with torch.no_grad():
        b(x)
    replay = (b.chosen + 3) % 8
    b.replay = replay
    b(x).pow(2).sum().backward()
    got = b.gate.weight.grad.clone()
    b.zero_grad()
    naive(b, x, replay.reshape(-1, 2)).pow(2).sum().backward()
    assert got.abs().max() > 1e-3
    assert rel(got, b.gate.weight.grad) < 1e-5  # measured 5.0e-7


def test_grouped_and_looped_agree():
    """bf16 (where torch._grouped_mm runs on the CPU): outputs and gradients of the two expert paths, against each
    other. Measured on the CPU: equal bit for bit (1 and 2 threads); the bound allows a GPU kernel's bf16 rounding
    (2 ulps) and catches a misplaced group boundary (O(1))."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    x = torch.randn(3, 40, 64, dtype=torch.bfloat16)
    runs = {}
    for grouped in (True, False):
        b = block(dtype=torch.bfloat16)
        b.experts.grouped = grouped
        xi = x.clone().requires_grad_()
        y = b(xi)
        y.float().pow(2).sum().backward()
        runs[grouped] = (y.float(), xi.grad.float(), b.experts.gate_up_proj.grad.float(),
                         b.experts.down_proj.grad.float(), b.gate.weight.grad.float())
    assert moe.use_grouped_mm(x)  # the automatic choice on this CPU in bf16
    for a, c in zip(runs[True], runs[False]):
            assert rel(a, c) <= 1e-2


def test_experts_see_only_their_tokens(monkeypatch):
    """The looped path multiplies k * N rows in all, one matmul pair per expert that received tokens: never a
    product of a token with an expert it was not routed to."""
    rows = []
    real = F.linear

    def counting(inp, w, *a):
        if w.shape == (64, 32):  # an expert's down projection (H, I)
            rows.append(inp.shape[0])
        return real(inp, w, *a)
    b = block()
    b.experts.grouped = False
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        b(x)
        used = len(set(b.chosen.flatten().tolist()))
        monkeypatch.setattr(moe.F, "linear", counting)
        b.experts(x.reshape(5, 64), b.chosen.reshape(5, 2), torch.ones(5, 2))
    assert sum(rows) == 5 * 2 and len(rows) == used < 8


def test_model_routes_record_and_replay():
    """Whole model: the routes one forward chose, replayed into another, give the same logits bit for bit; replayed
    routes of the wrong layer count are refused."""
    from minigrpo.pretrained import tiny_model
    model = tiny_model("tiny-moe")
    ids = torch.randint(0, 261, (2, 7))
    with torch.no_grad():
        ref = model(ids)
        routes = moe.chosen_routes(model)
        assert routes.shape == (2, 7, 4, 2) and routes.dtype == torch.int16
        with moe.routing(model, routes):
            again = model(ids)
        assert moe.route_flips(model) == (0, 2 * 7 * 4)
    assert torch.equal(ref, again)
    assert all(b.replay is None for b in moe.sparse_blocks(model))
    with pytest.raises(ValueError, match="cover 3 sparse layers, the model has 4"):
        with moe.routing(model, routes[:, :, :3]):
            pass


def scaled_tiny(kind, seed):
    """tiny_model with every matrix redrawn at std 0.05: logits and routes with real margins, as a trained model's."""
    from minigrpo.pretrained import tiny_model
    model = tiny_model(kind)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def token_logprobs(model, ids):
    logp = torch.log_softmax(model(ids).float(), -1)
    return logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def sampler_trainer_gaps(seed):
    """A bf16 'sampler' forward and an fp32 'trainer' forward of the same weights over the same 4 x 64 tokens: the
    max |log-prob gap| of the dense hybrid (tiny-qwen3.5), of the MoE one (tiny-moe) with the sampler's routes
    replayed and without, and the share of the trainer's token-layer routes that differ from the sampler's."""
    import copy
    ids = torch.randint(0, 261, (4, 64), generator=torch.Generator().manual_seed(seed + 10))
    gaps = {}
    with torch.no_grad():
        for kind in ("tiny-qwen3.5", "tiny-moe"):
            trainer = scaled_tiny(kind, seed)
            sampler = copy.deepcopy(trainer).to(torch.bfloat16)
            sampled = token_logprobs(sampler, ids)
            gaps[kind] = (sampled - token_logprobs(trainer, ids)).abs().max().item()
        routes = moe.chosen_routes(sampler)
        with moe.routing(trainer, routes):
            gaps["replay"] = (sampled - token_logprobs(trainer, ids)).abs().max().item()
            flipped, total = moe.route_flips(trainer)
    return gaps, flipped / total


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_closes_the_sampler_trainer_gap(seed):
    """Routing replay, bf16 sampler against fp32 trainer: without replay 1-2% of the token-layer routes flip and the
    largest log-prob gap is 3-10x the dense model's; replaying the sampler's routes brings it back to the dense
    model's. Measured (the same at 1 and 2 threads), max |gap| dense / MoE replayed / MoE not replayed, flip share:
    seed 0: 0.031 / 0.024 / 0.30, 1.2%; seed 1: 0.055 / 0.029 / 0.16, 2.1%; with ATEN_CPU_CAPABILITY=default and
    avx2 replayed / dense 0.53-0.80 (bound 2x: 2.5x margin), not replayed / replayed 4.6-12.7 (bound 2x: 2.3x),
    flips 1.2-2.2%. A trainer that ignores the replayed routes fails the first two bounds (its ratios: 5-10x, 1x)."""
    gaps, flip_share = sampler_trainer_gaps(seed)
    assert gaps["replay"] <= 2 * gaps["tiny-qwen3.5"]
    assert gaps["tiny-moe"] >= 2 * gaps["replay"]
    assert 0.005 < flip_share < 0.1


def test_shipped_configs_and_their_errors():
    """The bundled config.json copies of the two released MoE models read as their published shapes; an MoE config
    without experts, or routing more experts than it has, is one line naming the file and the key."""
    import json
    import os

    from minigrpo.files import DATA
    from minigrpo.pretrained import CheckpointError, read_config
    folder = os.path.join(DATA, "configs")
    q3 = read_config(os.path.join(folder, "Qwen3-30B-A3B.json"))
    q35 = read_config(os.path.join(folder, "Qwen3.5-35B-A3B.json"))
    assert (q3.family, q3.num_experts, q3.num_experts_per_tok, q3.moe_intermediate_size, q3.norm_topk_prob,
            q3.shared_expert_intermediate_size) == ("qwen3", 128, 8, 768, True, 0)
    assert (q35.family, q35.num_experts, q35.moe_intermediate_size, q35.shared_expert_intermediate_size,
            q35.layer_types.count("full_attention"), q35.num_hidden_layers) == ("qwen3_5", 256, 512, 512, 10, 40)
    d = json.load(open(os.path.join(folder, "Qwen3-30B-A3B.json")))
    with pytest.raises(CheckpointError, match="x.json: missing key 'num_experts'"):
        QwenConfig.from_dict({k: v for k, v in d.items() if k != "num_experts"}, source="x.json")
    with pytest.raises(CheckpointError, match="x.json: num_experts_per_tok 8 > num_experts 4"):
        QwenConfig.from_dict(dict(d, num_experts=4), source="x.json")
