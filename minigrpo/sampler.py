"""The group sampler: n completions for each prompt, with the log-probs the trainer will compare against.

A call prefills the distinct prompts once (one left-padded batch, into a cache sized for the longest prompt +
max_new_tokens), copies each prompt's state to its n samples (`Cache.repeat_interleave`), then decodes one token
per step for all live rows; every `sync_every` steps the host reads the new tokens, ends rows at EOS ids and stop
strings, and drops finished rows from the batch. A Sample's log-probs are those of the untruncated distribution,
log_softmax(logits / temperature) in fp32, as logprobs.token_logprobs recomputes them; its randomness is
counter-based (splitmix64 of its prompt's seed, its index and the step), so it does not depend on the batch. What a
Sample holds, kept states (keep=, reuse=) and the seeds: docs/training.md, "The group sampler".

Shape letters: P prompts, B rows being decoded (P*n, fewer after compaction), L longest prompt, V vocabulary.
"""

from dataclasses import dataclass, replace

import torch

from minigrpo import moe, prefix, static_decode
from minigrpo.packing import left_pad
from minigrpo.seeds import derive_seed, logical_shr, splitmix64  # noqa: F401  (sampler.splitmix64)


@dataclass
class Sample:
    """One sampled completion of prompts[prompt_index], as the sampler knows it: tokens, their log-probs, why it
    stopped. It knows no task; the trainer's record of a completion is tasks.base.Seq, made from a Sample
    (Seq.of) with what the task adds: example, turn, prompt, score, reward, advantage."""
    prompt_index: int
    completion_ids: list
    logprobs: list
    finish_reason: str  # "eos" | "stop" | "length"
    text: str | None = None
    prefilled: int = 0              # prompt tokens this call prefilled for it (on the prompt's first sample only)
    reused: int = 0                 # prompt tokens taken from a kept state instead (likewise)
    kept: prefix.Kept | None = None  # with keep=True: the state after its prompt's start (prefix.kept_length)
    routes: torch.Tensor | None = None  # MoE: (prompt + completion tokens, M, k) experts chosen (module doc)


@dataclass
class Settings:
    """How one sampler call samples. A None default is resolved from the tokenizer or the device (`resolved`)."""
    n: int                          # completions per prompt
    max_new_tokens: int
    temperature: float = 1.0        # 0 = greedy
    top_p: float = 1.0              # top_k=0 / top_p=1.0 = no truncation; log-probs are before it (module doc)
    top_k: int = 0
    # ids that end a row (the last token of its completion); None: tokenizer.eos_ids, or none without a tokenizer
    stop_ids: tuple | None = None
    stop_strings: tuple = ()        # texts that end a row (need a tokenizer to decode completions)
    # logits of ids >= vocab_size are never sampled nor counted in log-probs; None: tokenizer.vocab_size (Qwen's
    # embedding has padding rows beyond the real vocabulary: docs/pitfalls.md 9)
    vocab_size: int | None = None
    pad_id: int | None = None       # None: the tokenizer's pad id, else 0
    sync_every: int | None = None   # decode steps between host checks for finished rows; None: 8 on CUDA, 1 elsewhere
    compact_fraction: float = 0.25  # drop finished rows from the batch once at least this fraction of it is done
    # compile: torch.compile the decode step (the fast path, train.py --decode fast): the static-shape step of
    # static_decode.py, one graph per shape bucket (fullgraph), on CUDA replayed as a CUDA graph. A LoRA model
    # decodes as itself, adapters unmerged: the step runs the trainer's own LoRA layers (a bf16 merged copy would
    # round small updates away and sample a policy nearer the base). A string names the torch.compile backend
    # (default inductor).
    compile: bool | str = False
    # static: the same static-shape step without compiling (its eager twin; compile implies it: `resolved` sets
    # it): caches of fixed sizes held across calls, attention over all their slots, no compaction.
    static: bool = False
    # rows: the static batch's fixed row count (the caller's largest call): a call with fewer rows is padded to it,
    # one with more is split into calls of whole prompts (None: the next power of two of the call's rows).
    rows: int | None = None

    def resolved(self, tokenizer, device):
        """These settings with every None default filled in from the tokenizer and the device."""
        stop_ids = self.stop_ids
        if stop_ids is None:
            stop_ids = tokenizer.eos_ids if tokenizer is not None else ()
        vocab_size = self.vocab_size
        if vocab_size is None and tokenizer is not None:
            vocab_size = tokenizer.vocab_size
        pad_id = self.pad_id
        if pad_id is None:
            pad_id = getattr(tokenizer, "pad_id", None) or 0
        sync_every = self.sync_every
        if sync_every is None:
            sync_every = 8 if device.type == "cuda" else 1
        return replace(self, stop_ids=stop_ids, vocab_size=vocab_size, pad_id=pad_id, sync_every=sync_every,
                       static=self.static or bool(self.compile))


# ------------------------------------------------------------------------------------------------ token choice

def truncate(probs, top_k=0, top_p=1.0):
    """Top-k then top-p, as transformers' TopKLogitsWarper then TopPLogitsWarper -> (probs, token ids) of each row,
    sorted descending, with the dropped tokens' probs set to 0 (the others are not renormalised).
    Top-k leaves every token whose prob reaches the k-th largest (ties with it stay, so possibly more than k).
    Top-p is measured on the distribution renormalised over what top-k left: it drops a token when the mass of it
    and every less likely token is <= 1 - top_p, i.e. leaves the smallest prefix whose mass reaches top_p (the
    warper's own arithmetic: an ascending cumulative sum); the most likely token always stays."""
    p, ids = probs.sort(dim=-1, descending=True)                    # (B, V)
    if top_k and top_k < p.shape[-1]:
        p = p.masked_fill(p < p[:, top_k - 1:top_k], 0.0)           # below the k-th value
    if top_p < 1.0:
        q = p / p.sum(-1, keepdim=True)                             # renormalised over the top-k set
        mass_from_here = q.flip(-1).cumsum(-1).flip(-1)             # mass of this token and all below it
        drop = mass_from_here <= 1.0 - top_p
        drop[:, 0] = False                                          # min_tokens_to_keep=1
        p = p.masked_fill(drop, 0.0)
    return p, ids


def inverse_cdf(p, u):
    """Index drawn from each row of unnormalised p (B, K) with one uniform u (B,) per row (fp64 for exactness)."""
    cdf = p.double().cumsum(-1)                                     # (B, K)
    x = u[:, None] * cdf[:, -1:]                                    # (B, 1) in [0, total)
    # right=True: the first index whose cdf exceeds x, which always has p > 0
    return torch.searchsorted(cdf, x, right=True).clamp_(max=p.shape[-1] - 1).squeeze(-1)  # (B,)


def sample_keys(seeds, n, device):
    """One 64-bit key per sample row: hash(hash(seed of its prompt) + its index among the n)."""
    s = torch.tensor([x % (1 << 63) for x in seeds], dtype=torch.long, device=device)
    j = torch.arange(n, device=device)
    return splitmix64(splitmix64(s)[:, None] + j).reshape(-1)       # (P*n,)


def uniforms(keys, t):
    """The step-t uniform in [0, 1) of each row: the top 53 bits of hash(key + t), in fp64."""
    return logical_shr(splitmix64(keys + t), 11).double() / float(1 << 53)


def choose(logits, temperature, top_k, top_p, u):
    """Next token and its log-prob (untruncated, at `temperature`) for each row. logits (B, V) fp32."""
    if temperature == 0:
        logp_all = torch.log_softmax(logits, dim=-1)
        token = logits.argmax(-1)
    else:
        logp_all = torch.log_softmax(logits / temperature, dim=-1)  # (B, V) fp32
        if top_k or top_p < 1.0:
            p, ids = truncate(logp_all.exp(), top_k, top_p)
            token = ids.gather(-1, inverse_cdf(p, u)[:, None]).squeeze(-1)
        else:
            token = inverse_cdf(logp_all.exp(), u)
    return token, logp_all.gather(-1, token[:, None]).squeeze(-1)  # (B,), (B,)


# ------------------------------------------------------------------------------------------------ model calls

def prefill(model, prompts, max_new_tokens, pad_id):
    """Run the prompts once into a fresh cache; returns (cache, last-position logits (P, V) fp32)."""
    ids, mask = left_pad(prompts, pad_id, model.device)            # (P, L)
    cache = model.new_cache(len(prompts), ids.shape[1] + max_new_tokens)
    h = model.hidden(ids, attention_mask=mask, cache=cache)        # (P, L, H)
    return cache, model.logits(h[:, -1]).float()                   # (P, V); only the last position is needed


def decode_step(model, tokens, cache):
    """One new token per row: (B,) -> next-token logits (B, V) fp32. Positions continue from each row's count."""
    h = model.hidden(tokens[:, None], cache=cache)                  # (B, 1, H)
    return model.logits(h[:, -1]).float()


# ------------------------------------------------------------------------------------------------ stop detection

class StopScanner:
    """Finds, on the host, where each row's completion should end: at the first stop id, or at the token that
    completed a stop string. Strings are checked on the decoded tail only: an occurrence of s spans at most
    len(s.encode()) tokens (each token carries >= 1 of its bytes), so a window of that many tokens ending at a
    token decides whether that token completed s."""

    def __init__(self, stop_ids, stop_strings, tokenizer):
        self.stop_ids = set(stop_ids)
        self.strings = [s for s in stop_strings if s]
        if self.strings and tokenizer is None:
            raise ValueError("stop_strings need tokenizer= to decode completions")
        self.tok = tokenizer
        self.window = max((len(s.encode()) for s in self.strings), default=0) + 1

    def _has_stop(self, ids):
        text = self.tok.decode(ids)
        return any(s in text for s in self.strings)

    def scan(self, ids, scanned):
        """ids: the row's tokens so far, of which the first `scanned` were scanned by an earlier call.
        Returns (the completion's length, "eos" | "stop") or None."""
        for j in range(scanned, len(ids)):
            if ids[j] in self.stop_ids:
                end, reason = j + 1, "eos"
                break
        else:
            end, reason = len(ids), None
        if self.strings:
            lo = max(0, scanned - self.window)
            if self._has_stop(ids[lo:end]):  # cheap rejection first: most checks find nothing
                for j in range(scanned, end):
                    if self._has_stop(ids[max(0, j + 1 - self.window):j + 1]):
                        return j + 1, "stop"
        return (end, reason) if reason else None

    def read(self, new, live, gen_ids, ended):
        """The host's check every sync_every steps: new[i] are the tokens of batch row i (original row live[i])
        since the last read. Appends them to gen_ids and records rows that stopped in ended {row: (length,
        reason)}."""
        for r, toks in zip(live, new):
            if r in ended:  # done, waiting to be compacted away: its later tokens are discarded
                continue
            scanned = len(gen_ids[r])
            gen_ids[r] += toks
            hit = self.scan(gen_ids[r], scanned)
            if hit:
                ended[r] = hit

    def text(self, ids, reason):
        """The completion's text: without a final EOS, cut after a stop string; None without a tokenizer."""
        if self.tok is None:
            return None
        text = self.tok.decode(ids[:-1] if reason == "eos" else ids)
        return cut_after_stop(text, self.strings) if reason == "stop" else text


def cut_after_stop(text, stop_strings):
    """The text up to the end of the first stop string in it (the token that completed it may run further)."""
    ends = [text.find(s) + len(s) for s in stop_strings if s in text]
    return text[:min(ends)] if ends else text


# ------------------------------------------------------------------------------------------------ the sampler

@torch.no_grad()
def sample(model, prompts, settings, tokenizer=None, seed=None, reuse=None, keep=False):
    """settings.n completions for each prompt (lists of token ids), prompt-major: result[i*n:(i+1)*n] belong to
    prompt i. `settings` (Settings) says how to sample; its None defaults come from `tokenizer` and the device.
    seed: an int, or one per prompt (module doc: Randomness); None draws one.
    keep: every Sample carries `kept`, the state after prefilling its prompt up to the grid (prefix.Kept: .ids,
      .tokens; None for a prompt shorter than the grid).
    reuse: one prefix.Kept or None per prompt: a prompt whose ids start with a kept state's (and go on past them)
      prefills only the rest, continuing a copy of it; any other prompt is prefilled afresh.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("sample needs a non-empty list of non-empty prompts (token-id lists)")
    if settings.n < 1 or settings.max_new_tokens < 1:
        raise ValueError(f"n={settings.n} and max_new_tokens={settings.max_new_tokens} must both be >= 1")
    s = settings.resolved(tokenizer, model.device)
    seeds = prompt_seeds(seed, len(prompts))
    scanner = StopScanner(s.stop_ids, s.stop_strings, tokenizer)
    reuse = prefix.check_reuse(reuse, len(prompts))
    if not s.static:
        return sample_batch(model, prompts, seeds, s, scanner, reuse, keep)
    s = replace(s, compact_fraction=float("inf"))  # fixed shapes: no compaction
    out = []
    for part in static_decode.whole_prompt_calls(len(prompts), s.n, s.rows):
        got = sample_batch(model, prompts[part], seeds[part], s, scanner, reuse[part], keep)
        out += [replace(x, prompt_index=x.prompt_index + part.start) for x in got]
    return out


def prompt_seeds(seed, P):
    """One seed per prompt: `seed` itself when it is a list, else derive_seed(seed, i) (a random seed for None,
    following torch.manual_seed)."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [derive_seed(seed, i) for i in range(P)]
    if len(seeds) != P:
        raise ValueError(f"{len(seeds)} seeds for {P} prompts; pass one per prompt or an int")
    return seeds


def sample_batch(model, prompts, seeds, s, scanner, reuse, keep):
    """n completions of each prompt, decoded as one batch: prefill, the decode loop, the Samples. reuse (a list)
    and keep as `sample` takes them; s.static: static_decode.py's fixed-shape step, else the ordinary one."""
    row_keys = sample_keys(seeds, s.n, model.device)                 # (P*n,) int64, one per sample row
    extra = static_decode.new_slots(prompts, s.max_new_tokens) if s.static else s.max_new_tokens
    cache, logits, kept, reused, routes = prefill_reusing(model, prompts, extra, s.pad_id, reuse, keep)
    run = lambda cache, step: decode(model, step, cache, logits, row_keys, s, scanner)  # noqa: E731
    if not s.static:
        gen_ids, logprobs, ended, steps = run(cache.repeat_interleave(s.n), decode_step)
    else:       # a compiled step that fails: one warning line, and this call again uncompiled (static_decode.py)
        gen_ids, logprobs, ended, steps = static_decode.decode_call(model, cache, s, run)
    out = []
    for r in range(len(row_keys)):  # the static batch's padding rows are not returned
        length, reason = ended.get(r, (s.max_new_tokens, "length"))
        ids, i, first = gen_ids[r][:length], r // s.n, r % s.n == 0
        route = None if routes[i] is None else torch.cat([routes[i], steps[r, :length]])
        out.append(Sample(i, ids, logprobs[r, :length].tolist(), reason, scanner.text(ids, reason),
                          prefilled=(len(prompts[i]) - reused[i]) * first, reused=reused[i] * first, kept=kept[i],
                          routes=route))
    return out


def prefill_reusing(model, prompts, extra, pad_id, reuse, keep):
    """The prefill of a call whose prompts may continue kept states (prefix.py) -> (cache of P rows, each prompt
    right-aligned to the longest, + `extra` slots; last-position logits (P, V) fp32; per prompt its Kept (None
    without keep, or for a prompt shorter than the grid); per prompt the tokens taken from a kept state; per prompt
    its tokens' routes (moe.py; None for a dense model)). Without a state to continue or to keep this is `prefill`.
    Otherwise the fresh prompts are prefilled as one left-padded batch, each continued one on its own (a batch of
    one: prefix.py says why), and the decode batch is assembled from their states; with keep, a fresh prompt's
    start up to the grid is prefilled first and continued."""
    P = len(prompts)
    goes_on = [prefix.continues(k, p) for k, p in zip(reuse, prompts)]
    reused = [k.tokens if c else 0 for k, c in zip(reuse, goes_on)]
    start = [k if c else None for k, c in zip(reuse, goes_on)]
    if keep:
        start = keep_prefixes(model, prompts, start, pad_id)
    whole = [keep and prefix.kept_length(model, len(p)) == len(p) for p in prompts]   # kept as they are
    if all(k is None for k in start):   # nothing to continue: straight into the decode batch's cache
        cache, logits = prefill(model, prompts, extra, pad_id)
        routes = row_routes(model, prompts)
        kept = [prefix.keep_row(model, cache, i, p, routes[i]) if w else None
                for i, (p, w) in enumerate(zip(prompts, whole))]
        return cache, logits, kept, reused, routes
    sources, last, kept, routes = [None] * P, [None] * P, [None] * P, [None] * P
    fresh = [i for i in range(P) if start[i] is None]
    if fresh:
        cache, logits = prefill(model, [prompts[i] for i in fresh], 0, pad_id)
        got = row_routes(model, [prompts[i] for i in fresh])
        for j, i in enumerate(fresh):
            sources[i], last[i], routes[i] = (cache, j, len(prompts[i])), logits[j], got[j]
            kept[i] = prefix.keep_row(model, cache, j, prompts[i], routes[i]) if whole[i] else None
    for i in (i for i in range(P) if start[i] is not None):
        cache, logit, kept[i], routes[i] = prefix.continue_prefill(model, start[i], prompts[i], keep)
        sources[i], last[i] = (cache, 0, len(prompts[i])), logit[0]
    return prefix.assemble(model, sources, extra), torch.stack(last), kept, reused, routes


def row_routes(model, prompts):
    """After a left-padded prefill of `prompts`: each prompt's routes (len, M, k), its real tokens being the last
    len of its row; [None, ...] for a dense model."""
    routes = moe.recorded(model)                                    # (P, L, M, k) or None
    return [None if routes is None else routes[i, routes.shape[1] - len(p):] for i, p in enumerate(prompts)]


def keep_prefixes(model, prompts, start, pad_id):
    """`start` with, for each fresh prompt that runs past its grid point (prefix.kept_length), the Kept of its
    tokens up to there: those starts prefilled as one left-padded batch (their lengths multiples of the chunk, so
    each row's chunks start at its first token), each then continued by `prefill_reusing`."""
    cut = [prefix.kept_length(model, len(p)) for p in prompts]
    todo = [i for i, p in enumerate(prompts) if start[i] is None and 0 < cut[i] < len(p)]
    if not todo:
        return start
    cache, _ = prefill(model, [prompts[i][:cut[i]] for i in todo], 0, pad_id)
    routes = row_routes(model, [prompts[i][:cut[i]] for i in todo])
    start = list(start)
    for j, i in enumerate(todo):
        start[i] = prefix.keep_row(model, cache, j, prompts[i][:cut[i]], routes[j])
    return start


def decode(model, step, cache, logits, row_keys, s, scanner):
    """The decode loop, from the prefill's last-position logits (P, V) and a cache of B rows (prompt r // n in row
    r; rows past P*n, a static batch's padding, repeat the last prompt and are never returned). Returns each row's
    tokens (host lists), log-probs (B, max_new_tokens) on the host, the rows that stopped {row: (length,
    reason)}, and in an MoE model the routes of the tokens each step ran (B, max_new_tokens, M, k) on the host, -1
    where none ran (None for a dense model)."""
    B, P, device = cache.mask.shape[0], logits.shape[0], logits.device
    src = (torch.arange(B, device=device) // s.n).clamp_(max=P - 1)   # the prompt of each row
    logits, row_keys = logits[src], row_keys[src * s.n + torch.arange(B, device=device) % s.n].clone()  # (B, V), (B,)
    out_tok = torch.zeros(B, s.max_new_tokens, dtype=torch.long, device=device)
    out_lp = torch.zeros(B, s.max_new_tokens, dtype=torch.float32, device=device)
    blocks = moe.sparse_blocks(model)       # none in a dense model: nothing recorded
    out_routes = (torch.full((B, s.max_new_tokens, len(blocks), blocks[0].gate.k), -1, dtype=torch.int16,
                             device=device) if blocks else None)
    live_rows = torch.arange(B, device=device)   # original row of each live batch row
    live = list(range(B))                        # the same, on the host
    gen_ids = [[] for _ in range(B)]        # host copy of each row's tokens, for stop detection
    ended = {r: (0, "pad") for r in range(P * s.n, B)}  # row -> (length, finish_reason); padding rows never count
    checked = 0                             # steps already read by the host
    for t in range(s.max_new_tokens):
        u = uniforms(row_keys[live_rows], t)                         # (B_live,) one draw per live row
        vocab_logits = logits if s.vocab_size is None else logits[:, :s.vocab_size]
        token, lp = choose(vocab_logits, s.temperature, s.top_k, s.top_p, u)
        out_tok[live_rows, t] = token
        out_lp[live_rows, t] = lp
        last = t == s.max_new_tokens - 1
        if last or (t + 1 - checked) >= s.sync_every:
            scanner.read(out_tok[live_rows, checked:t + 1].tolist(), live, gen_ids, ended)  # one host sync
            checked = t + 1
            going = [i for i, r in enumerate(live) if r not in ended]    # batch rows still decoding
            if not going or last:
                break
            if len(live) - len(going) >= max(1, s.compact_fraction * len(live)):
                idx = torch.tensor(going, device=device)
                cache, token, live_rows = cache.index_select(idx), token[idx], live_rows[idx]
                live = [live[i] for i in going]
        logits = step(model, token, cache)
        if blocks:                          # the experts token t went through in that step
            out_routes[live_rows, t] = torch.stack([b.chosen[:, 0] for b in blocks], dim=1).to(torch.int16)
    return gen_ids, out_lp.cpu(), ended, None if out_routes is None else out_routes.cpu()
