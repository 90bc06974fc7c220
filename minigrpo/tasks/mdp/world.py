"""The oracle-process verifier MDP: a model learns which diagnostic probe to ask, not the answer.

"Guess Who?" with hidden programs. A program is an ordered pair (p, q) of `reducer(transform(xs))` operators; its
output on a list is (p + 7q) mod 97 (regime pair_affine_mod) or 0 / 1 / 2 as p <, =, > q (pair_compare_gate). A
record hides a target pair; its candidates are the pairs that agree with it on two visible runs. A state shows the
candidate count and eight probe lists A-H with how the survivors' outputs split on each; the action is one letter,
and the verifier keeps the candidates that agree with the target on that probe. Budget: 0-3 probes.

Filtering only ANDs "agrees on probe a", so a state is (set of probed letters T, probes left r), and everything is
a 256-entry table per record: the quality q(T) = 0.5 solved(T) + 0.5 (1 - log n(T) / log N0), the oracle value
V_r(T) = max_a V_{r-1}(T + a) with V_0 = q, and the process reward 0.9 V_{r-1}(T + a) + 0.1 q(T + a). The metrics
(solved, exact, survivors), the baselines (random, minimax, max-split, the oracle), the prompt and why the reward
mixes in the tenth are in docs/mdp.md. Everything is numpy and seeded: a record is a small JSON-able dict;
`world(record)` compiles its arrays.
"""
import functools
import math

import numpy as np

from minigrpo.metrics import mean
from minigrpo.seeds import derive_seed

REGIMES = ("pair_affine_mod", "pair_compare_gate")
LIB_SIZES = (64, 128, 256, 512)
LETTERS = "ABCDEFGH"
PROBE_BITS = 1 << np.arange(8)   # letter a <-> bit a of a probed-set mask
MAX_BUDGET = 3
N_VISIBLE, N_PROBES, N_HIDDEN = 2, 8, 16
AFFINE_MUL, AFFINE_MOD = 7, 97
NOW_WEIGHT = 0.1     # process reward = 0.9 * oracle value + 0.1 * quality right after the probe (see the top)
UNIVERSE_SIZE, MAX_LEN, MAX_VAL = 2048, 6, 9     # every list a record uses is drawn from one fixed universe

# ----------------------------------------------------------------------------------------------------------------
# The operator library: transforms (list -> list) x reducers (list -> int). Like any DSL it has aliases
# (max(sort) computes max(id)); they are kept on purpose: a target with an alias can be solved (hidden-all) but
# never pinned down exactly, which is why "exact pair" stays well below "solved".

TRANSFORMS = {
    "id": lambda xs: xs, "sort": sorted, "rsort": lambda xs: sorted(xs, reverse=True),
    "rev": lambda xs: xs[::-1], "take2": lambda xs: xs[:2], "take3": lambda xs: xs[:3],
    "drop1": lambda xs: xs[1:], "drop2": lambda xs: xs[2:], "even": lambda xs: [x for x in xs if x % 2 == 0],
    "odd": lambda xs: [x for x in xs if x % 2], "gt4": lambda xs: [x for x in xs if x > 4],
    "lt5": lambda xs: [x for x in xs if x < 5], "gt2": lambda xs: [x for x in xs if x > 2],
    "lt7": lambda xs: [x for x in xs if x < 7], "mod3z": lambda xs: [x for x in xs if x % 3 == 0],
    "inc": lambda xs: [x + 1 for x in xs], "dbl": lambda xs: [2 * x for x in xs],
    "mod3": lambda xs: [x % 3 for x in xs], "half": lambda xs: [x // 2 for x in xs],
    "sq": lambda xs: [x * x for x in xs], "neg9": lambda xs: [9 - x for x in xs],
    "dist5": lambda xs: [abs(x - 5) for x in xs], "uniq": lambda xs: list(dict.fromkeys(xs)),
    "evens_at": lambda xs: xs[::2], "odds_at": lambda xs: xs[1::2],
    "scan": lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))],
    "diff": lambda xs: [b - a for a, b in zip(xs, xs[1:])], "low2": lambda xs: sorted(xs)[:2],
    "top2": lambda xs: sorted(xs)[-2:], "addi": lambda xs: [x + i for i, x in enumerate(xs)],
    "rotl": lambda xs: xs[1:] + xs[:1], "mod4": lambda xs: [x % 4 for x in xs], "init": lambda xs: xs[:-1],
    "last2": lambda xs: xs[-2:], "runmax": lambda xs: [max(xs[: i + 1]) for i in range(len(xs))],
    "gt6": lambda xs: [x for x in xs if x > 6], "tri3": lambda xs: [3 * x % 10 for x in xs],
}


def _reducers(a, m):
    """Every reducer at once over padded lists a (n, W) with validity mask m (n, W); empty lists give 0."""
    n, w = a.shape
    length = m.sum(1)
    has = length > 0
    big = np.iinfo(np.int64).max // 4
    hi, lo = np.where(m, a, -big), np.where(m, a, big)
    mx, mn = np.where(has, hi.max(1), 0), np.where(has, lo.min(1), 0)
    last = a[np.arange(n), np.maximum(length - 1, 0)] * has
    srt = np.sort(lo, axis=1)                                    # valid values first, ascending
    med = srt[np.arange(n), np.maximum((length - 1) // 2, 0)] * has
    distinct = ((np.diff(srt, axis=1) != 0) & m[:, 1:]).sum(1) + has
    sign = np.where(np.arange(w) % 2 == 0, 1, -1)
    return {
        "sum": (a * m).sum(1), "max": mx, "min": mn, "len": length, "first": a[:, 0] * has, "last": last,
        "cnt_even": (m & (a % 2 == 0)).sum(1), "cnt_odd": (m & (a % 2 != 0)).sum(1), "cnt_gt4": (m & (a > 4)).sum(1),
        "range": mx - mn, "sumsq": (a * a * m).sum(1), "prod10": np.where(m, a % 10, 1).prod(1) % 10,
        "distinct": distinct, "altsum": (a * m * sign).sum(1), "second": a[:, 1] * (length > 1),
        "argmax": np.where(has, hi.argmax(1), 0), "argmin": np.where(has, lo.argmin(1), 0), "median": med,
        "sum10": (a * m).sum(1) % 10, "cnt_first": (m & (a == a[:, :1])).sum(1) * has,
    }


@functools.lru_cache(maxsize=1)
def universe() -> list:
    """The fixed pool of input lists (length 1..6, values 0..9) that records draw their lists from."""
    rng = np.random.default_rng(1234)
    seen = {}
    while len(seen) < UNIVERSE_SIZE:
        xs = tuple(int(v) for v in rng.integers(0, MAX_VAL + 1, size=rng.integers(1, MAX_LEN + 1)))
        seen.setdefault(xs, None)
    return list(seen)


@functools.lru_cache(maxsize=1)
def _operator_pool():
    """All transform x reducer operators (37 x 20) in a seeded order, with their outputs on the universe."""
    lists, names, outs = universe(), [], []
    for tname, t in TRANSFORMS.items():
        ys = [list(t(list(xs))) for xs in lists]
        a = np.zeros((len(ys), MAX_LEN), dtype=np.int64)         # (U, W) padded transform outputs
        for k, y in enumerate(ys):
            a[k, : len(y)] = y
        m = np.arange(MAX_LEN)[None, :] < np.array([len(y) for y in ys])[:, None]
        for rname, out in _reducers(a, m).items():
            names.append(f"{rname}({tname})")
            outs.append(out)
    order = np.random.default_rng(0).permutation(len(names))     # every library size mixes all kinds of operator
    return [names[k] for k in order], np.stack(outs)[order]       # (ops, U)


def library(size: int):
    """The first `size` operators of the pool (libraries are nested): (names, outputs (size, U))."""
    names, outs = _operator_pool()
    if size > len(names):
        raise ValueError(f"mdp library size {size} is larger than the {len(names)} operators there are")
    return names[:size], outs[:size]


def combine(regime: str, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """A pair program's output from its two operators' outputs (elementwise, any shape)."""
    if regime == "pair_affine_mod":
        return (p + AFFINE_MUL * q) % AFFINE_MOD
    if regime == "pair_compare_gate":
        return np.sign(p - q) + 1
    raise ValueError(f"mdp regime {regime!r}: expected one of {', '.join(REGIMES)}")


# ----------------------------------------------------------------------------------------------------------------
# Records and their compiled worlds

def make_record(lib_size: int, regime: str, seed: int, split: str = "train", index: int = 0) -> dict:
    """A JSON-able puzzle: the hidden target pair and the universe indices of its visible/probe/hidden lists; the
    `index`-th record of its (split, regime, library size) cell at run seed `seed`."""
    rng = np.random.default_rng(derive_seed(seed, "record", split, regime, lib_size, index))
    p, q = rng.choice(lib_size, size=2, replace=False)
    idx = rng.choice(UNIVERSE_SIZE, size=N_VISIBLE + N_PROBES + N_HIDDEN, replace=False).tolist()
    return {"id": f"{split}-{regime}-L{lib_size}-s{seed}-{index}", "lib_size": lib_size, "regime": regime,
            "target": [int(p), int(q)], "visible": idx[:N_VISIBLE],
            "probes": idx[N_VISIBLE:N_VISIBLE + N_PROBES], "hidden": idx[N_VISIBLE + N_PROBES:]}


def _superset_sum(h: np.ndarray) -> np.ndarray:
    """f[T] = sum of h[c] over codes c that contain every bit of T (8-bit codes)."""
    f = h.astype(np.int64).copy()
    masks = np.arange(256)
    for b in range(N_PROBES):
        lo = masks[(masks >> b) & 1 == 0]
        f[lo] += f[lo | (1 << b)]
    return f


def candidates(record: dict) -> tuple:
    """The pairs that agree with the target on the visible lists, and what every one of them outputs:
    (cp, cq) (S,) their operators, out (S, 24) on the probe then the hidden lists, the target's (24,), and the
    visible outputs (2,)."""
    regime = record["regime"]
    _, ops = library(record["lib_size"])
    i, j = record["target"]
    lists = record["visible"] + record["probes"] + record["hidden"]
    ops = ops[:, lists].astype(np.int32)                              # (L, 26) outputs on this record's lists
    vis = np.arange(N_VISIBLE)
    ov = combine(regime, ops[:, None, vis], ops[None, :, vis])        # (L, L, 2) every pair on the visible lists
    tv = combine(regime, ops[i, vis], ops[j, vis])                    # (2,)
    cp, cq = np.nonzero((ov == tv).all(-1))                           # (S,) surviving pairs (p, q)
    rest = ops[:, N_VISIBLE:]                                         # (L, 24) probe and hidden lists
    out = combine(regime, rest.take(cp, 0), rest.take(cq, 0)).astype(np.int8)  # (S, 24) outputs fit a byte
    return cp, cq, out, combine(regime, rest[i], rest[j]).astype(np.int8), tv


class World:
    """A record compiled to arrays. A state is (T, r): T = 8-bit mask of probed letters, r = probes left."""

    def __init__(self, record: dict):
        _, _, out, target, tv = candidates(record)
        probe_out, self.target_probe = np.ascontiguousarray(out[:, :N_PROBES]), target[:N_PROBES]  # (S, 8), (8,)
        ok = (out[:, N_PROBES:] == target[N_PROBES:]).all(1)              # (S,) hidden-equivalent to the target
        code = np.packbits(probe_out == self.target_probe, axis=1, bitorder="little")[:, 0]  # (S,) agreement bits
        self.n = _superset_sum(np.bincount(code, minlength=256))          # (256,) survivors per probed set T
        self.bad = _superset_sum(np.bincount(code[~ok], minlength=256))   # (256,) those not hidden-equivalent
        # Splits only need how many survivors share each output row: keep the distinct rows and their counts.
        _, first, self.count = np.unique(probe_out.view(np.int64)[:, 0], return_index=True, return_counts=True)
        self.rows, self.code = probe_out[first], code[first]              # (R, 8), (R,)
        self.visible_out = tv.tolist()
        self.quality = self._quality()
        self.values = self._values()

    def _quality(self) -> np.ndarray:
        n0 = self.n[0]
        shrink = 1 - np.log(self.n) / math.log(n0) if n0 > 1 else np.ones(256)
        return 0.5 * (self.bad == 0) + 0.5 * shrink                              # (256,)

    def _values(self) -> list:
        """values[r] (256,) = best quality reachable from T with r more probes (re-probing is allowed, so <= r)."""
        masks = np.arange(256)
        vals = [self.quality]
        for _ in range(MAX_BUDGET):
            vals.append(np.stack([vals[-1][masks | (1 << a)] for a in range(N_PROBES)]).max(0))
        return vals

    def action_values(self, T: int, left: int) -> np.ndarray:
        """Oracle value of each letter at state (T, left >= 1): V_{left-1}(T + a), optimal continuation."""
        return self.values[left - 1][T | PROBE_BITS]                              # (8,)

    def process_rewards(self, T: int, left: int) -> np.ndarray:
        """The per-step reward of each letter: its oracle value, plus a tenth for the progress it makes now."""
        return (1 - NOW_WEIGHT) * self.action_values(T, left) + NOW_WEIGHT * self.quality[T | PROBE_BITS]  # (8,)

    def splits(self, T: int) -> list:
        """For each probe, the sizes of the groups the survivors' outputs fall into, largest first."""
        alive = (self.code & T) == T                                             # (R,) rows still surviving
        rows, count = self.rows[alive].astype(np.int64), self.count[alive]
        bins = (rows + 128 * np.arange(N_PROBES)).ravel()                      # (R*8,) one bin range per probe
        groups = np.bincount(bins, np.repeat(count, N_PROBES), minlength=128 * N_PROBES).reshape(N_PROBES, 128)
        groups = -np.sort(-groups.astype(np.int64), axis=1)                      # (8, 128) largest first
        return [g[g > 0].tolist() for g in groups]

    def metrics(self, T: int) -> dict:
        return {"solved": float(self.bad[T] == 0), "exact": float(self.n[T] == 1), "survivors": float(self.n[T])}


@functools.lru_cache(maxsize=1024)   # a compiled world is small (distinct output rows only): ~100 KB at most
def _world(key: tuple) -> World:
    return World({k: list(v) if isinstance(v, tuple) else v for k, v in key})


def world(record: dict) -> World:
    """The compiled World of a record (cached: compiling a 512-operator record takes a few milliseconds)."""
    return _world(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(record.items())))


def mask_of(probed: str) -> int:
    """Letters already probed -> 8-bit mask; anything that is not A-H (an invalid answer) probes nothing."""
    return sum(1 << LETTERS.index(c) for c in set(probed) if c in LETTERS)


# ----------------------------------------------------------------------------------------------------------------
# States, the rendered prompt, and the policies

def new_state(record: dict, budget: int, probed: str = "") -> dict:
    """A decision point: the record, the letters probed so far (in order) and the probes left."""
    return {"id": f"{record['id']}:{probed}:{budget - len(probed)}", "record": record, "probed": probed,
            "left": budget - len(probed)}


def advance(state: dict, letter: str) -> dict:
    """The verifier's step: probe `letter` ("?" for an invalid answer: the probe is spent on nothing)."""
    letter = letter if len(letter) == 1 and letter in LETTERS else "?"
    return new_state(state["record"], len(state["probed"]) + state["left"], state["probed"] + letter)


def view(state: dict) -> dict:
    """What the policy may see (JSON-able): known runs, candidate count, probes left, the eight probes' splits."""
    rec, w = state["record"], world(state["record"])
    lists, T = universe(), mask_of(state["probed"])
    seen = [[list(lists[u]), int(y)] for u, y in zip(rec["visible"], w.visible_out)]
    seen += [[c, int(w.target_probe[LETTERS.index(c)])] for c in dict.fromkeys(state["probed"]) if c in LETTERS]
    return {"seen": seen, "n": int(w.n[T]), "left": state["left"],
            "probes": [list(lists[u]) for u in rec["probes"]], "splits": w.splits(T)}


def _fmt_list(xs) -> str:
    return "[" + ",".join(map(str, xs)) + "]"


def _fmt_split(groups: list) -> str:
    """Largest four group sizes, then how many more groups: '20/12/5/3+4'."""
    head = "/".join(map(str, groups[:4]))
    return head + (f"+{len(groups) - 4}" if len(groups) > 4 else "")


def render(v: dict, scramble_key: str | None = None) -> str:
    """The state prompt (about 250 bytes). With scramble_key the split summaries are shuffled across the letters
    (the control: the probe lists stay, their summaries no longer belong to them)."""
    splits = [_fmt_split(g) for g in v["splits"]]
    if scramble_key is not None:
        perm = seeded_rng("scramble", scramble_key).permutation(N_PROBES)
        splits = [splits[k] for k in perm]
    seen = " ".join(f"{_fmt_list(x) if isinstance(x, list) else x}={y}" for x, y in v["seen"])
    lines = [f"Find the hidden program. Seen: {seen}", f"N={v['n']} left={v['left']}"]
    lines += [f"{c} {_fmt_list(p)} {s}" for c, p, s in zip(LETTERS, v["probes"], splits)]
    return "\n".join(lines + ["Probe? One letter A-H."])


def state_text(state: dict, scramble: bool = False) -> str:
    return render(view(state), state["id"] if scramble else None)


def seeded_rng(*key) -> np.random.Generator:
    """A generator seeded by `key` (ints and strings, e.g. a state id): the same key, the same draws."""
    return np.random.default_rng(derive_seed(*key))


def random_policy(seed: int = 0):
    """A uniformly random letter, seeded by the state (the same state always gets the same letter)."""
    return lambda text, state: LETTERS[seeded_rng(seed, state["id"]).integers(N_PROBES)]


def expected_survivors(state: dict) -> list:
    """Per letter, sum(b^2) over its split's groups b: n times the expected survivors if it is probed now."""
    return [sum(b * b for b in g) for g in world(state["record"]).splits(mask_of(state["probed"]))]


def max_split_policy(text: str, state: dict) -> str:
    """The probe whose split leaves the fewest expected survivors (target-blind)."""
    return LETTERS[int(np.argmin(expected_survivors(state)))]


def minimax_policy(text: str, state: dict) -> str:
    """The probe whose largest group is smallest: the fewest survivors in the worst case (Knuth's Mastermind rule;
    target-blind). Ties go to fewer expected survivors (max-split's sum(b^2)), then to the first letter. It is the
    ranking the compact prompt shows (tasks/mdp.compact_text: each probe's largest-group share), so it measures
    how far a policy reading only that prompt can get with one-step play."""
    largest = [g[0] for g in world(state["record"]).splits(mask_of(state["probed"]))]
    key = list(zip(largest, expected_survivors(state)))
    return LETTERS[min(range(N_PROBES), key=key.__getitem__)]


def oracle_action(state: dict) -> str:
    """The same-budget oracle's letter: best action value; ties go to the better set now, then a seeded
    random letter (a fixed order would teach a letter bias)."""
    w, T = world(state["record"]), mask_of(state["probed"])
    tie = seeded_rng("tie", state["id"]).permutation(N_PROBES)         # no letter is favoured by the tie-break
    order = np.lexsort((tie, -w.quality[T | PROBE_BITS], -w.action_values(T, state["left"])))
    return LETTERS[int(order[0])]


def oracle_policy(text: str, state: dict) -> str:
    return oracle_action(state)


# ----------------------------------------------------------------------------------------------------------------
# Data: records on the library-size ladder x both regimes, and the informative states along their trajectories

SPLITS = ("train", "val", "eval")


def build_records(split: str, per_cell: int, seed: int = 0) -> list:
    """`per_cell` records for every (regime, library size) cell; the split is part of every record's seed."""
    if split not in SPLITS:
        raise ValueError(f"mdp split {split!r}: expected train, val or eval")
    return [make_record(L, regime, seed, split, k) for regime in REGIMES for L in LIB_SIZES for k in range(per_cell)]


def state_example(state: dict) -> dict:
    """A training example: the state's view (rendered by `render`), each letter's process reward, the oracle."""
    w, rec = world(state["record"]), state["record"]
    values = w.process_rewards(mask_of(state["probed"]), state["left"])
    return {"id": state["id"], "record_id": rec["id"], "regime": rec["regime"], "lib_size": rec["lib_size"],
            "probed": state["probed"], "left": state["left"], "view": view(state),
            "values": [round(float(x), 6) for x in values], "oracle": oracle_action(state)}


def build_states(records: list, states_per_record: int = MAX_BUDGET, oracle_prob: float = 0.5, seed: int = 0):
    """States along one trajectory per record (each step the oracle's letter with prob. oracle_prob, else random),
    starting with the full budget; states where every letter has the same value carry no signal and are left out."""
    out = []
    for rec in records:
        rng, state = seeded_rng(seed, rec["id"], "traj"), new_state(rec, MAX_BUDGET)
        for _ in range(min(states_per_record, MAX_BUDGET)):
            ex = state_example(state)
            if max(ex["values"]) - min(ex["values"]) > 1e-9:
                out.append(ex)
            letter = ex["oracle"] if rng.random() < oracle_prob else LETTERS[rng.integers(N_PROBES)]
            state = advance(state, letter)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Evaluation: play each record from its start with a budget of b probes, for every b

def play(policy_fn, records: list, budget: int, scramble: bool = False, batched: bool = False,
         moves: list | None = None) -> list:
    """Final states after `budget` steps of `policy_fn(text, state) -> letter` on every record. With batched=True
    the policy is called once per step with all records' (texts, states) and returns a list of letters. `moves`,
    if given, receives every (state, letter) the policy played."""
    states = [new_state(rec, budget) for rec in records]
    for _ in range(budget):
        texts = [state_text(s, scramble) for s in states]
        letters = policy_fn(texts, states) if batched else [policy_fn(t, s) for t, s in zip(texts, states)]
        if moves is not None:
            moves.extend(zip(states, letters))
        states = [advance(s, letter) for s, letter in zip(states, letters)]
    return states


def choice_stats(moves: list) -> dict:
    """How a policy's probes compare with the rules', over the (state, letter) moves it played. Counted at the
    states where some probe still splits the survivors ("states"; "idle" counts the others, where every letter is
    as good as any): the share of its letters among minimax's best (smallest largest group: the ranking the
    compact prompt shows; ties included), among max-split's best (fewest expected survivors), among the oracle's
    best (highest action value with the probes left), and that repeat a letter already probed. An invalid answer
    is none of these."""
    counts = {"minimax_best": 0, "max_split_best": 0, "oracle_best": 0, "repeat": 0}
    idle = 0
    for state, letter in moves:
        w, T = world(state["record"]), mask_of(state["probed"])
        splits = w.splits(T)
        if all(len(g) == 1 for g in splits):          # no probe splits the survivors: nothing to choose between
            idle += 1
            continue
        if letter not in LETTERS:
            continue
        a = LETTERS.index(letter)
        largest, survivors = [g[0] for g in splits], expected_survivors(state)
        values = w.action_values(T, state["left"])
        counts["minimax_best"] += largest[a] == min(largest)
        counts["max_split_best"] += survivors[a] == min(survivors)
        counts["oracle_best"] += values[a] >= values.max() - 1e-12
        counts["repeat"] += letter in state["probed"]
    n = len(moves) - idle
    return {"states": n, "idle": idle, **{k: v / n if n else float("nan") for k, v in counts.items()}}


def _mean(rows: list) -> dict:
    """Each metric's mean over the rows (nan when there are none)."""
    return {k: mean([r[k] for r in rows]) if rows else float("nan") for k in ("solved", "exact", "survivors")}


def evaluate(policy_fn, records: list, budgets=(0, 1, 2, 3), scramble: bool = False, batched: bool = False) -> dict:
    """Per-budget metrics {"overall": {b: {solved, exact, survivors}}, "by_regime": {regime: {b: ...}},
    "by_lib": {L: {b: ...}}, "solved_by_record": {b: [0/1 per record]}, "choices": choice_stats(...) of its moves
    in the largest budget's games}; each budget is a separate game (a budget-aware policy sees `left=b` at the
    start)."""
    rows, moves, top = [], [], max(budgets)
    for b in budgets:
        for s in play(policy_fn, records, b, scramble, batched, moves if b == top else None):
            rec = s["record"]
            rows.append({"budget": b, "regime": rec["regime"], "lib_size": rec["lib_size"],
                         **world(rec).metrics(mask_of(s["probed"]))})
    out = {"overall": {b: _mean([r for r in rows if r["budget"] == b]) for b in budgets},
           # each record's outcome, in record order: what a paired comparison of two policies resamples
           "solved_by_record": {b: [r["solved"] for r in rows if r["budget"] == b] for b in budgets},
           "choices": choice_stats(moves)}
    for key, name in (("regime", "by_regime"), ("lib_size", "by_lib")):
        groups = sorted({r[key] for r in rows})
        out[name] = {g: {b: _mean([r for r in rows if r[key] == g and r["budget"] == b]) for b in budgets}
                     for g in groups}
    return out


BASELINES = {"random": random_policy(0), "minimax": minimax_policy, "max-split": max_split_policy,
             "oracle": oracle_policy}


def baselines(records: list, budgets=(0, 1, 2, 3)) -> dict:
    """The non-model policies on `records`: {name: evaluate(...)}."""
    return {name: evaluate(fn, records, budgets) for name, fn in BASELINES.items()}
