"""The verifier MDP's ceiling for target-blind play: Bayes-optimal play without the target.

The oracle (world.py) knows the target; max-split and minimax do not, but look one probe ahead and only at
group sizes. The planner knows everything but the target -- every candidate pair and its outputs on the probe and
the hidden lists -- and takes the target to be uniform over the surviving pairs (a record's target is two different
operators, so pairs (p, p) are candidates but never the target). It plays the letter with the highest probability
that the game ends solved:

    V_0(S) = 1 if every candidate in S has the same hidden outputs, else 0
    V_r(S) = 1 if so already, else max over unprobed letters a of  sum over a's output groups g  P(g | S) V_{r-1}(S_g)

with P(g | S) the share of S's possible targets that output g. Ties go to max-split's letter (fewer expected
survivors). What separates it from max-split is exactly what neither prompt shows: whether a group's candidates
agree on the hidden inputs, and what the next probes could still separate. It maximises the expected solve rate
given all it knows, so no policy that does not see the target beats it on average, whatever else it knows or not
(a real searcher would not know the hidden lists: it is an upper bound for one, not a recipe).

It is slow next to the other baselines -- about a second per record for budgets 0-3, in numpy and Python recursion --
so it is not in `mdp.BASELINES` or the pipeline's report: `python mdp.py baselines --planner` adds its row.
"""
import numpy as np

from minigrpo.tasks.mdp import world as mdp


class Belief:
    """A record's candidates as the planner sees them, target-blind: the distinct (probe outputs, hidden class)
    rows, each weighted by how many possible targets (pairs of two different operators) it holds. Values are
    memoised by (probed letters, what they showed, probes left): the same node is reached in every probe order."""

    def __init__(self, record: dict):
        cp, cq, out, _, _ = mdp.candidates(record)
        _, hidden = np.unique(out[:, mdp.N_PROBES:], axis=0, return_inverse=True)          # (S,) hidden class
        key = np.concatenate([out[:, :mdp.N_PROBES], hidden.reshape(-1, 1)], 1).astype(np.int64)
        rows, inv = np.unique(key, axis=0, return_inverse=True)
        self.rows, self.cls = rows[:, :mdp.N_PROBES], rows[:, mdp.N_PROBES]                # (R, 8), (R,)
        self.weight = np.bincount(inv.reshape(-1), weights=(cp != cq).astype(float), minlength=len(rows))  # (R,)
        self.memo = {}

    def alive(self, seen: tuple) -> np.ndarray:
        """Rows that agree with what the probes showed; seen = ((letter index, output), ...)."""
        agree = np.ones(len(self.cls), dtype=bool)
        for a, o in seen:
            agree &= self.rows[:, a] == o
        return np.nonzero(agree)[0]

    def value(self, idx: np.ndarray, left: int, seen: tuple) -> float:
        """V_left of the candidate rows idx (those still alive after `seen`)."""
        key = (seen, left)
        if key not in self.memo:
            c = self.cls[idx]
            solved = c.min() == c.max()
            self.memo[key] = 1.0 if solved else 0.0 if left == 0 else max(self.letter_values(idx, left, seen))
        return self.memo[key]

    def letter_values(self, idx: np.ndarray, left: int, seen: tuple) -> list:
        """For each letter, P(solved) if it is probed now and the rest is played optimally (-1: probed already)."""
        probed = {a for a, _ in seen}
        total, c = self.weight[idx].sum(), self.cls[idx]
        values = []
        for a in range(mdp.N_PROBES):
            if a in probed:
                values.append(-1.0)
                continue
            outs, group = np.unique(self.rows[idx, a], return_inverse=True)
            w = np.bincount(group, weights=self.weight[idx], minlength=len(outs))           # target mass per group
            if left == 1:   # the last probe, vectorised: a group ends solved iff one hidden class is left in it
                lo = np.full(len(outs), c.max())
                hi = np.full(len(outs), c.min())
                np.minimum.at(lo, group, c)
                np.maximum.at(hi, group, c)
                values.append(float(w[lo == hi].sum() / total))
                continue
            v = 0.0
            for k in np.nonzero(w)[0]:
                child = tuple(sorted(seen + ((a, int(outs[k])),)))
                v += w[k] / total * self.value(idx[group == k], left - 1, child)
            values.append(float(v))
        return values


_BELIEFS: dict = {}   # the last 64 records' beliefs (one holds at most a few MB with its memo)


def belief(record: dict) -> Belief:
    """The record's Belief, cached. The key leaves the target out: every target consistent with the visible runs
    (same visible outputs) shares one belief, as a searcher that does not know the target would."""
    visible = tuple(int(x) for x in mdp.world(record).visible_out)
    key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(record.items()) if k != "target")
    key += (visible,)
    if key not in _BELIEFS:
        if len(_BELIEFS) >= 64:
            _BELIEFS.pop(next(iter(_BELIEFS)))
        _BELIEFS[key] = Belief(record)
    return _BELIEFS[key]


def planner_policy(text: str, state: dict) -> str:
    """The Bayes-optimal target-blind letter (see the top); ties go to fewer expected survivors."""
    w, b = mdp.world(state["record"]), belief(state["record"])
    seen = tuple((a, int(w.target_probe[a])) for a in sorted({mdp.LETTERS.index(c) for c in state["probed"]
                                                               if c in mdp.LETTERS}))
    values = b.letter_values(b.alive(seen), state["left"], seen)
    expected = mdp.expected_survivors(state)
    return mdp.LETTERS[min(range(mdp.N_PROBES), key=lambda a: (-round(values[a], 9), expected[a]))]
