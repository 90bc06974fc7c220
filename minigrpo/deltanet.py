"""Gated DeltaNet: the linear-attention token mixer of Qwen3.5 (3 of every 4 layers).

A GDN layer keeps, per value head, a fixed-size memory S (dk x dv) instead of a growing KV cache. Each token
decays the memory, corrects what it recalls for its key towards its value (the "delta rule"), then reads it with its
query. The math follows transformers' torch fallback; its steps and dtype rules: docs/qwen.md ("Gated DeltaNet",
"Precision"). Three forms of the same recurrence, which the tests hold equal: recurrent_delta_rule (token by token:
the definition, the naive twin), decode_delta_rule (one token: the decode step) and chunked_delta_rule (64 tokens
at a time with matrix products: prefill and any multi-token call; chunk_loop: eager, or compiled by --compile-gdn).

Shape letters: B batch, T tokens in this call, H hidden size, C conv channels (2*nk*dk + nv*dv), K conv kernel
width, nk / nv key / value heads, dk / dv key / value head dim, N chunks, L chunk length (64).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from minigrpo import compiling
from minigrpo.lora import shared_input

CHUNK = 64   # tokens per step of chunked_delta_rule; a row's chunks start at its first token

def l2norm(x, eps=1e-6):
    # eps sits inside the sqrt and is added to the *sum* of squares (FLA / transformers convention)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent_delta_rule(q, k, v, g, beta, state):
    """The gated delta rule, one token at a time. All inputs fp32.
    q, k: (B, h, T, dk) already l2-normed (q also scaled); v: (B, h, T, dv); g, beta: (B, h, T);
    state: (B, h, dk, dv). Returns o (B, h, T, dv) and the final state."""
    S = state
    out = []
    for t in range(q.shape[2]):
        S = S * g[:, :, t, None, None].exp()                     # forget: S <- alpha_t S
        recalled = (S * k[:, :, t, :, None]).sum(-2)             # S^T k_t                  (B, h, dv)
        delta = beta[:, :, t, None] * (v[:, :, t] - recalled)    # prediction error of the memory
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]       # write: S <- S + k_t delta_t^T
        out.append((S * q[:, :, t, :, None]).sum(-2))            # read after the write: S^T q_t
    return torch.stack(out, dim=2), S


def decode_delta_rule(q, k, v, g, beta, state):
    """recurrent_delta_rule for one token (T == 1), with the same arguments and results, written so that the state
    is read for both reductions at once and then once more for the write. With a = e^g and S the old state:
      recalled = (a S)^T k = a (S^T k)
      delta    = beta (v - recalled)
      o        = (a S + k delta^T)^T q = a (S^T q) + (k . q) delta
      S'       = a S + k delta^T
    The definition reads S after the forget for the recall and reads S' for the output, so a compiler makes five
    passes over the (B, h, dk, dv) fp32 state (one of them to store a S); here S^T k and S^T q share one pass, and
    S' is one read and one write: three. Equal to the definition up to fp32 rounding (the tests' bound)."""
    k1, q1 = k[:, :, 0], q[:, :, 0]                                          # (B, h, dk)
    a = g[:, :, 0, None].exp()                                               # (B, h, 1)
    Sk = (state * k1[..., None]).sum(-2)                                     # S^T k      (B, h, dv)
    Sq = (state * q1[..., None]).sum(-2)                                     # S^T q      (B, h, dv)
    delta = beta[:, :, 0, None] * (v[:, :, 0] - a * Sk)                      # (B, h, dv)
    o = a * Sq + (k1 * q1).sum(-1, keepdim=True) * delta
    S = state * a[..., None] + k1[..., None] * delta[:, :, None, :]          # (B, h, dk, dv)
    return o[:, :, None], S


def chunked_delta_rule(q, k, v, g, beta, state, chunk=CHUNK):
    """The same recurrence as recurrent_delta_rule, 64 tokens per step (the WY / UT-transform form).
    Within a chunk with incoming state S0 and cumulative log-decay gam_i = sum_{s<=i} g_s:
      A = strictly-lower beta_i e^(gam_i-gam_j) k_i.k_j
      U = (I + A)^-1 (beta v),  W = (I + A)^-1 (beta e^gam k)           (one unit-triangular solve: chunk_terms)
      Delta = U - W S0                                                   (the chunk's delta_i, all at once)
      O = (e^gam q) S0 + ((q k^T) * M) Delta,  M_ij = e^(gam_i-gam_j) for j <= i
      S0 <- e^gam_last S0 + (e^(gam_last-gam) k)^T Delta
    Same arguments and results as recurrent_delta_rule."""
    T, dv = k.shape[2], v.shape[-1]
    U, W, q_in, qk, k_out, gam_last = chunk_terms(q, k, v, g, beta, chunk)
    # The loop reads chunk n of each tensor through unbind, not U[:, :, n]: the backward of an index is a zero
    # tensor of the full (B, h, N, ...) size holding one chunk's gradient, so N chunks would write N full-size
    # gradients and add them up (quadratic in T); unbind's backward stacks the N chunk gradients once.
    # Same values and gradients, bit for bit: the ops per chunk are the same, only the zeros added are gone.
    chunks = zip(U.unbind(2), W.unbind(2), q_in.unbind(2), qk.unbind(2), k_out.unbind(2), gam_last.unbind(2))
    S = state
    out = []
    for terms_n in chunks:  # chunks depend on each other only through S
        o_n, S = chunk_step(*terms_n, S)                                      # (B, h, L, dv)
        out.append(o_n)
    # one stack of the chunk outputs (its backward hands each chunk a view of the gradient, nothing is copied)
    B, h, N = U.shape[:3]
    o = torch.stack(out, dim=2).reshape(B, h, N * chunk, dv)[:, :, :T]
    return o, S


def chunk_terms(q, k, v, g, beta, chunk):
    """What chunked_delta_rule computes for all N chunks at once, before the loop that carries the state: U, W,
    the state reads e^gam q, the masked (q k^T) * M, the state writes e^(gam_last-gam) k (each (B, h, N, L, .)),
    and gam_last (B, h, N, 1, 1). T is padded up to N * chunk."""
    return chunk_math(*by_chunk(q, k, v, g, beta, chunk))


def by_chunk(q, k, v, g, beta, chunk):
    """q, k, v (B, h, T, d), g and beta (B, h, T) padded up to N * chunk tokens and viewed as (B, h, N, L, .)."""
    B, h, T, _ = k.shape
    pad = (-T) % chunk
    if pad:  # zero padding at the end: g = 0 (no decay) and beta = 0 (no write), so padded rows change nothing
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // chunk
    q, k, v = (x.reshape(B, h, N, chunk, x.shape[-1]) for x in (q, k, v))   # (B, h, N, L, d)
    return q, k, v, g.reshape(B, h, N, chunk), beta.reshape(B, h, N, chunk)


def chunk_math(q, k, v, g, beta):
    """chunk_terms of chunks q, k, v (..., L, d) and g, beta (..., L), any leading dims: each chunk on its own."""
    dv, chunk = v.shape[-1], k.shape[-2]
    gam = g.cumsum(-1)                                                        # (.., L)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # mask before exp: above the diagonal gam_i - gam_j > 0 and could overflow to inf (inf * 0 = nan)
    decay = (gam[..., :, None] - gam[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # M (.., L, L)
    A = (beta[..., None] * (k @ k.mT) * decay).tril(-1)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    rhs = torch.cat([beta[..., None] * v, (beta * gam.exp())[..., None] * k], dim=-1)
    UW = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    U, W = UW.split([dv, k.shape[-1]], dim=-1)                                # (.., L, dv), (.., L, dk)
    qk = (q @ k.mT) * decay                                                   # (.., L, L)
    q_in = q * gam.exp()[..., None]                                           # reads of the incoming state
    k_out = k * (gam[..., -1:] - gam).exp()[..., None]                        # writes carried to the chunk end
    return U, W, q_in, qk, k_out, gam[..., -1, None, None]


def chunk_step(U_n, W_n, q_in_n, qk_n, k_out_n, gam_last_n, S):
    """One chunk of the loop: its output (.., L, dv) from the incoming state S (.., dk, dv), and the state after it."""
    delta = U_n - W_n @ S                                                     # (.., L, dv)
    o = q_in_n @ S + qk_n @ delta
    return o, S * gam_last_n.exp() + k_out_n.mT @ delta


LOOP = "Gated DeltaNet chunk loop"   # what compiling.py names this compile's failures by
_compiled = {}  # backend -> (chunk-major chunk_math, chunk_step), each under torch.compile: one pair per process


def compiled_chunked_delta_rule(q, k, v, g, beta, state, backend):
    """chunked_delta_rule through two compiled functions (the "backend" of torch.compile), each one graph for every
    length and batch: chunk_math of all chunks, with (B, h) as one row dim M and the chunk count N dynamic, then the
    loop, whose body chunk_step sees one chunk (M, L, .) with M dynamic. Compiling the loop itself would unroll it:
    one graph per chunk count. The terms come out chunk-major (N, M, L, .), so that chunk n is one contiguous block
    whose strides do not depend on N (a view of (M, N, L, .) would have, and each N would be a new graph)."""
    B, h, T, dv = v.shape
    if backend not in _compiled:
        terms = lambda *x: [t.transpose(0, 1).contiguous() for t in chunk_math(*x)]   # noqa: E731
        _compiled[backend] = (torch.compile(terms, backend=backend), torch.compile(chunk_step, backend=backend))
    chunk_terms_fn, step_fn = _compiled[backend]
    xs = [x.flatten(0, 1) for x in by_chunk(q, k, v, g, beta, CHUNK)]      # (M, N, L, .)
    for x in xs:
        torch._dynamo.maybe_mark_dynamic(x, 0)                             # "maybe": a size of 1 specializes
        torch._dynamo.maybe_mark_dynamic(x, 1)
    terms = chunk_terms_fn(*xs)                                            # (N, M, L, .)
    S = state.flatten(0, 1)                                                # (M, dk, dv)
    out = []
    for terms_n in zip(*(t.unbind(0) for t in terms)):  # unbind, not an index: see chunked_delta_rule
        for x in terms_n + (S,):
            torch._dynamo.maybe_mark_dynamic(x, 0)
        o_n, S = step_fn(*terms_n, S)                                      # (M, L, dv)
        out.append(o_n)
    o = torch.stack(out, dim=1).reshape(B, h, len(out) * CHUNK, dv)[:, :, :T]
    return o, S.reshape(state.shape)


def chunk_loop(q, k, v, g, beta, state, compile=None):
    """chunked_delta_rule, compiled with torch.compile's backend `compile` (None: eager). A compile that fails
    (compiling.py) warns once and this call and every later one run eager, the same math. A call of one chunk
    runs eager: it has no loop to save, and its shapes would be one more graph."""
    if compile is None or k.shape[2] <= CHUNK or compiling.failure(LOOP, k.device, compile):
        return chunked_delta_rule(q, k, v, g, beta, state)
    try:   # the backward is compiled with the forward, so that its failure too is caught here
        with compiling.strict(), torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
            return compiled_chunked_delta_rule(q, k, v, g, beta, state, compile)
    except Exception as e:  # noqa: BLE001  every compile failure: the run goes on eager
        compiling.give_up(LOOP, k.device, compile, e, "running it eager from now on (the same math, more kernels)")
        return chunked_delta_rule(q, k, v, g, beta, state)


def causal_conv(u, weight, conv_state):
    """Depthwise causal conv over time, continuing from the last K-1 inputs of the previous call.
    u: (B, C, T) pre-conv inputs in model dtype; weight: (C, 1, K); conv_state: (B, C, K-1).
    Accumulates in fp32 and rounds once (bf16 multiply-adds break parity with HF), SiLU after the rounding."""
    x = torch.cat([conv_state, u], dim=-1)                                    # (B, C, K-1+T)
    y = F.conv1d(x.float(), weight.float(), groups=u.shape[1]).to(u.dtype)   # (B, C, T)
    return F.silu(y), x[:, :, -conv_state.shape[-1]:]


def row_chunked_delta_rule(q, k, v, g, beta, state, real_tokens, compile=None):
    """chunk_loop (chunked_delta_rule; compiled when `compile` names a backend) with each row's chunks starting at
    its first real token, wherever the row's left padding puts it (real_tokens (B, T) bool, False = pad; None = no
    padding). Rounding then depends on the row alone, not on the batch it shares: the trainer's micro-batch, the
    sampler's prefill and a kept state's continuation (prefix.py) cut a conversation into the same chunks. A row's
    leading pads, up to a multiple of the chunk, move to its end, where g = 0 and k = v = 0 make them change nothing
    (not the state either), and the output moves back."""
    if real_tokens is None:
        return chunk_loop(q, k, v, g, beta, state, compile)
    B, h, T, _ = q.shape
    g = g * real_tokens[:, None, :]                                          # a pad never decays the state
    shift = (~real_tokens).sum(-1, keepdim=True) % CHUNK                     # (B, 1)
    take = (torch.arange(T, device=q.device) + shift) % T                    # (B, T): rolled slot j <- slot take
    roll = lambda x: x.gather(2, take[:, None, :, None].expand(B, h, T, x.shape[-1]))   # noqa: E731
    rolled = [roll(x) for x in (q, k, v)] + [x.gather(2, take[:, None].expand(B, h, T)) for x in (g, beta)]
    o, state = chunk_loop(*rolled, state, compile)
    back = (torch.arange(T, device=q.device) - shift) % T                    # slot j <- rolled slot back
    return o.gather(2, back[:, None, :, None].expand_as(o)), state


class GatedRMSNorm(nn.Module):
    """Per-head RMSNorm of the GDN output, then the SiLU gate z: norm before gate (FLA's FusedRMSNormGated).
    Its weight is plain (init 1), unlike the other Qwen3.5 norms (1 + w)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o, z):
        x = o.float()
        n = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(o.dtype)
        return (n.float() * F.silu(z.float())).to(o.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg, layer_idx=0):
        super().__init__()
        self.layer_idx = layer_idx
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        H, Dk, Dv = cfg.hidden_size, self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * Dk + Dv
        self.in_proj_qkv = nn.Linear(H, self.conv_dim, bias=False)   # rows [q | k | v], each head-major
        self.in_proj_z = nn.Linear(H, Dv, bias=False)                # output gate
        self.in_proj_b = nn.Linear(H, self.nv, bias=False)           # write strength beta (logits)
        self.in_proj_a = nn.Linear(H, self.nv, bias=False)           # decay input
        # depthwise, no bias; an nn.Conv1d only so that the weight has HF's name and shape (C, 1, K)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.linear_conv_kernel_dim,
                                groups=self.conv_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(Dv, H, bias=False)
        self.loop_backend = None   # torch.compile backend of the multi-token delta rule, or None: compile_chunk_loop

    def forward(self, x, real_tokens=None, cache=None, pack=None):
        """x: (B, T, H) normed input; real_tokens: (B, T) bool, False at left padding, or None; cache: the model's
        Cache, whose conv[i] (B, C, K-1) model dtype and state[i] (B, nv, dk, dv) fp32 this layer continues from and
        updates (None: start from zeros, keep nothing); pack: packing.Pack when x (1, N, H) is documents packed into
        one row. Returns the output (B, T, H)."""
        if pack is not None:
            return self.packed_forward(x, pack)
        B, T, _ = x.shape
        if real_tokens is not None:
            # zeroed pads give k = v = 0 after the conv (pads are on the left), so the state stays exactly 0
            x = x * real_tokens[:, :, None].to(x.dtype)
        if cache is None:
            conv_state = x.new_zeros(B, self.conv_dim, self.conv1d.kernel_size[0] - 1)
            state = x.new_zeros(B, self.nv, self.dk, self.dv, dtype=torch.float32)
        else:
            conv_state, state = cache.conv[self.layer_idx], cache.state[self.layer_idx]

        qkv, z, b, a = shared_input(x, self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        o, conv_state, state = self.mix(qkv, b, a, conv_state, state, real_tokens)
        if cache is not None:
            cache.update_state(self.layer_idx, conv_state, state)
        return self.gate_out(o, z)

    def packed_forward(self, x, pack):
        """Packed documents (packing.py): the projections over the N packed tokens, the conv and the delta rule on
        the per-document grid, each row from a zero conv window and a zero state."""
        D, Tg = pack.grid_shape
        qkv, z, b, a = shared_input(x, self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        qkv, b, a = (pack.to_grid(t) for t in (qkv, b, a))                      # (D, Tg, .)
        conv_state = x.new_zeros(D, self.conv_dim, self.conv1d.kernel_size[0] - 1)
        state = x.new_zeros(D, self.nv, self.dk, self.dv, dtype=torch.float32)
        o, _, _ = self.mix(qkv, b, a, conv_state, state)                         # (D, Tg, nv, dv)
        return self.gate_out(pack.from_grid(o), z)

    def mix(self, qkv, b, a, conv_state, state, real_tokens=None):
        """The token mixing: short conv, then the delta rule. qkv (B, T, C), b and a (B, T, nv): the input
        projections; real_tokens (B, T) bool, False at left padding, or None. Returns o (B, T, nv, dv) in the model
        dtype, the conv window and the state after the call."""
        B, T, _ = qkv.shape
        u, conv_state = causal_conv(qkv.mT, self.conv1d.weight, conv_state)                  # (B, C, T)
        q, k, v = u.mT.split([self.nk * self.dk, self.nk * self.dk, self.nv * self.dv], dim=-1)
        q = q.reshape(B, T, self.nk, self.dk).transpose(1, 2)                # (B, nk, T, dk)
        k = k.reshape(B, T, self.nk, self.dk).transpose(1, 2)
        v = v.reshape(B, T, self.nv, self.dv).transpose(1, 2).float()        # (B, nv, T, dv)
        # value head i reads key head i // r: consecutive value heads share a key head (not tiled)
        r = self.nv // self.nk
        q = l2norm(q.float()).repeat_interleave(r, dim=1) * self.dk ** -0.5  # (B, nv, T, dk)
        k = l2norm(k.float()).repeat_interleave(r, dim=1)

        beta = b.sigmoid().float().mT                                        # sigmoid in model dtype (B, nv, T)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        g = g.mT                                                             # log-decay <= 0 (B, nv, T)

        if T == 1:
            o, state = decode_delta_rule(q, k, v, g, beta, state)            # (B, nv, 1, dv) fp32
        else:
            o, state = row_chunked_delta_rule(q, k, v, g, beta, state, real_tokens, self.loop_backend)  # (B, nv, T, dv)
        return o.transpose(1, 2).to(qkv.dtype), conv_state, state            # (B, T, nv, dv)

    def gate_out(self, o, z):
        """The gated per-head norm of the mixed o (B, T, nv, dv) by the gate z (B, T, nv * dv), then out_proj:
        (B, T, H)."""
        B, T = o.shape[:2]
        z = z.reshape(B, T, self.nv, self.dv)
        y = self.norm(o, z).reshape(B, T, self.nv * self.dv)
        return self.out_proj(y)


def compile_chunk_loop(*models, backend="inductor"):
    """Every Gated DeltaNet layer of the models (None: skipped) runs its multi-token delta rule (training's forward,
    recompute and backward; prefill) compiled with torch.compile's `backend` (None: eager). train.py --compile-gdn."""
    for m in (m for model in models if model is not None for m in model.modules()):
        if isinstance(m, GatedDeltaNet):
            m.loop_backend = backend
