"""Mixture of experts: the MLP of Qwen3-MoE (Qwen3-30B-A3B) and Qwen3.5-MoE (Qwen3.5-35B-A3B), read after the dense
MLP in model.py. A sparse layer holds E small SwiGLU MLPs (the experts) and a router; each token goes through k of
them, summed with the router's weights (p = softmax(x Wr^T) in fp32; ids, w = top-k(p)), plus in Qwen3.5-MoE an
always-on shared expert. A token pays for k experts, not E: the (token, expert) pairs are sorted by expert and run
as one grouped matmul over the blocks (`torch._grouped_mm`), or a loop over the experts that received tokens.

Routing replay (for RL): given `replay` routes, a block uses those expert ids, weighted by its own softmax at them,
so the trainer scores the experts the sampler took and the gradient reaches the router through the weights;
`chosen` keeps the ids it chose, `flips` how many it would have routed differently. All of it, measured: docs/moe.md.
LoRA on the router and the experts (lora.ParamLoRA) is added where the block multiplies by the weight it adapts.
Shape letters: N tokens (B * T flattened), H hidden size, E experts, k experts a token, I expert width.
"""

import re
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F


def is_sparse_layer(cfg, i):
    """Whether layer i holds experts (transformers' rule for Qwen3-MoE; every layer of Qwen3.5-MoE)."""
    return cfg.num_experts > 0 and i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0


class Router(nn.Module):
    """Softmax over the experts in fp32, then top-k (or the replayed ids), weights cast back to the model dtype."""

    def __init__(self, cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))
        self.k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.lora = None  # a lora.ParamLoRA when the router trains (inject_lora(router=True))

    def forward(self, x, replay=None):
        """x: (N, H). Returns (weights (N, k) model dtype, ids (N, k) long, own top-k ids (N, k))."""
        logits = F.linear(x, self.weight)                                    # (N, E) model dtype
        if active(self.lora):
            logits = self.lora.looped(logits, x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)           # (N, E) fp32
        top_p, own = torch.topk(probs, self.k, dim=-1)                       # (N, k)
        ids = own if replay is None else torch.where(replay >= 0, replay, own)  # -1: no route recorded, own
        if replay is not None:
            top_p = probs.gather(-1, ids)                                     # gradient flows through the weights
        if self.norm_topk_prob:
            top_p = top_p / top_p.sum(-1, keepdim=True)
        return top_p.to(logits.dtype), ids, own


class Experts(nn.Module):
    """E SwiGLU experts stored as two stacked tensors (the layout transformers and Qwen3.5-MoE checkpoints use)."""

    def __init__(self, cfg):
        super().__init__()
        E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.zeros(E, H, I))
        self.grouped = None  # None: grouped matmul where use_grouped_mm allows; True / False forces one path
        self.gate_up_lora = self.down_lora = None  # lora.ParamLoRA each, with inject_lora(experts=True)

    def forward(self, x, ids, weights):
        """x: (N, H); ids, weights: (N, k). Returns sum_j weights_j * Expert_ids_j(x), (N, H)."""
        N, k = ids.shape
        E = self.gate_up_proj.shape[0]
        flat = ids.reshape(-1)                                               # (N*k,) pair p = token p // k
        order = torch.argsort(flat, stable=True)                             # pairs sorted by expert
        token = order // k                                                   # (N*k,) the token of each sorted pair
        counts = torch.bincount(flat, minlength=E)                           # (E,) tokens per expert
        xs = x[token]                                                        # (N*k, H) grouped by expert
        lora = [a if active(a) else None for a in (self.gate_up_lora, self.down_lora)]
        grouped = use_grouped_mm(x, lora) if self.grouped is None else self.grouped
        run = grouped_swiglu if grouped else looped_swiglu
        ys = run(xs, counts, self.gate_up_proj, self.down_proj, *lora)      # (N*k, H)
        ys = ys * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, token, ys)                  # sum each token's k outputs


def active(adapter):
    return adapter is not None and adapter.active


def use_grouped_mm(x, lora=()):
    """torch._grouped_mm runs bf16 on CPU and on CUDA from compute capability 9.0 (H100); on CPU in torch 2.13 its
    fp32 backward fails, so fp32 takes the loop. Rows must be 16-byte aligned (H, I and a LoRA rank multiples of 8
    in bf16: another rank takes the loop)."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != torch.bfloat16:
        return False
    if any(a is not None and a.r % 8 for a in lora):
        return False
    return x.device.type == "cpu" or (x.device.type == "cuda" and torch.cuda.get_device_capability(x.device)[0] >= 9)


def grouped_swiglu(xs, counts, gate_up, down, gate_up_lora=None, down_lora=None):
    """One grouped matmul per projection: rows [offs[e-1], offs[e]) go through expert e (and its LoRA update, two
    more grouped matmuls on the same offsets). Static shapes (N*k rows whatever the routing), so a decode step that
    uses it compiles as the dense one does."""
    offs = torch.cumsum(counts, 0).to(torch.int32)                           # (E,) end row of each expert
    h = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs=offs)            # (N*k, 2I)
    if gate_up_lora is not None:
        h = gate_up_lora.grouped(h, xs, offs)
    g, u = h.chunk(2, dim=-1)
    a = F.silu(g) * u                                                        # (N*k, I)
    y = torch._grouped_mm(a, down.transpose(1, 2), offs=offs)                # (N*k, H)
    return y if down_lora is None else down_lora.grouped(y, a, offs)


def looped_swiglu(xs, counts, gate_up, down, gate_up_lora=None, down_lora=None):
    """The same, one expert at a time, over the experts that received tokens (one host read of the counts)."""
    out = xs.new_empty(xs.shape[0], down.shape[1])
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            x = xs[start:start + n]
            h = F.linear(x, gate_up[e])                                      # (n, 2I)
            if gate_up_lora is not None:
                h = gate_up_lora.looped(h, x, e)
            g, u = h.chunk(2, dim=-1)
            a = F.silu(g) * u
            y = F.linear(a, down[e])                                         # (n, H)
            out[start:start + n] = y if down_lora is None else down_lora.looped(y, a, e)
            start += n
    return out


class SparseMoe(nn.Module):
    """The MLP of a sparse layer. `replay` (N, k) or (B, T, k) expert ids, when set, replaces the router's top-k
    (set it with `routing`; a token whose ids are -1 has no recorded route and routes itself); after each call
    `chosen` holds the router's own top-k (B, T, k) and, when given routes, `flips` (B, T) whether the own top-k set
    differs from the recorded one. `follow` False only compares: the block routes itself, `flips` still says where
    it differs from `replay` (what a run without replay measures)."""

    def __init__(self, cfg, dense_mlp):
        """dense_mlp: model.py's MLP class (cfg, width), the shared expert's (passed in: model.py builds this
        block, so this file does not import it)."""
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = dense_mlp(cfg, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        self.replay, self.chosen, self.flips, self.compared, self.follow = None, None, None, None, True

    def forward(self, x):
        B, T, H = x.shape
        flat = x.reshape(B * T, H)
        replay = None if self.replay is None else self.replay.reshape(B * T, -1).to(x.device, torch.long)
        weights, ids, own = self.gate(flat, replay if self.follow else None)
        y = self.experts(flat, ids, weights)                                 # (N, H)
        if hasattr(self, "shared_expert"):
            y = y + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        self.chosen = own.detach().view(B, T, -1)
        self.compared = None if replay is None else (replay[:, 0] >= 0).view(B, T)   # tokens with a route
        self.flips = None if replay is None else differs(own, replay).view(B, T) & self.compared
        return y.view(B, T, H)


def differs(a, b):
    """(N,) bool: whether two (N, k) id lists name different sets of experts (the order within top-k is not a
    different route: the sum over the k experts does not depend on it)."""
    return (a.sort(-1).values != b.sort(-1).values).any(-1)


# ----------------------------------------------------------------------------------------------------------------
# Routes of a whole model: what a sampler records and a trainer replays, (B, T, M, k) for its M sparse layers


def sparse_blocks(model):
    return [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, SparseMoe)]


@contextmanager
def routing(model, replay=None, follow=True):
    """Inside, every sparse block routes through `replay` (B, T, M, k), the M blocks in layer order (-1: a token
    with no recorded route routes itself); None: each chooses its own experts. follow=False: the blocks route
    themselves and only count where they differ from `replay` (route_flips). Backward must run inside too when
    layers are checkpointed (the recompute routes again). Nested calls restore the outer routes on exit."""
    blocks = sparse_blocks(model)
    if replay is not None and replay.shape[2] != len(blocks):
        raise ValueError(f"replayed routes cover {replay.shape[2]} sparse layers, the model has {len(blocks)}")
    before = [(b.replay, b.follow) for b in blocks]
    for j, block in enumerate(blocks):
        block.replay, block.follow = (None if replay is None else replay[:, :, j]), follow
    try:
        yield model
    finally:
        for block, (replay_, follow_) in zip(blocks, before):
            block.replay, block.follow = replay_, follow_


def recorded(model):
    """chosen_routes of the last forward on the host, or None for a dense model (no work: the sampler calls this
    after every forward)."""
    if not model.config.num_experts:
        return None
    return chosen_routes(model).cpu()


def chosen_routes(model):
    """(B, T, M, k) the expert ids each sparse block chose itself in the last forward (int16: E <= 32767)."""
    return torch.stack([b.chosen for b in sparse_blocks(model)], dim=2).to(torch.int16)


def route_flips(model, real_tokens=None):
    """(token-layer routes the last forward given routes would have chosen differently, token-layer routes it was
    given), over the real tokens ((B, T) bool, None = all) that have a recorded route."""
    blocks = sparse_blocks(model)
    flips = torch.stack([b.flips for b in blocks], dim=-1)                   # (B, T, M)
    given = torch.stack([b.compared for b in blocks], dim=-1)               # (B, T, M)
    if real_tokens is not None:
        given = given & real_tokens[..., None].to(given.device)
    return int((flips & given).sum()), int(given.sum())


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints: Qwen3-MoE stores each expert's projections apart; the loader stacks them into the fused tensors


PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def expert_piece(name, I):
    """For a per-expert checkpoint name `...mlp.experts.{e}.{gate,up,down}_proj.weight`: (the fused parameter's
    name, the index into it); None for every other name. I: the expert width (gate rows, then up rows)."""
    m = PER_EXPERT.match(name)
    if m is None:
        return None
    prefix, e, proj = m.group(1), int(m.group(2)), m.group(3)
    if proj == "down_proj":
        return f"{prefix}.down_proj", (e,)
    weight_rows = slice(0, I) if proj == "gate_proj" else slice(I, 2 * I)
    return f"{prefix}.gate_up_proj", (e, weight_rows)
