"""The verifier MDP: exact filtering (against brute force in plain Python), oracle optimality, the budget-0 rule,
the two regimes' information, determinism, the report files, and the task's prompt/reward/SFT/DPO helpers."""
import csv
import itertools
import json

import numpy as np
import pytest

from minigrpo.evals import report
from minigrpo.tasks.mdp import world as mdp
from minigrpo.tasks.mdp.planner import belief, planner_policy
from minigrpo.tasks.mdp.task import MDPTask, parse_letter

# The naive twin of mdp._reducers: one plain-Python function per reducer (empty list -> 0).
NAIVE_REDUCERS = {
    "sum": sum, "max": lambda y: max(y, default=0), "min": lambda y: min(y, default=0), "len": len,
    "first": lambda y: y[0] if y else 0, "last": lambda y: y[-1] if y else 0,
    "cnt_even": lambda y: sum(x % 2 == 0 for x in y), "cnt_odd": lambda y: sum(x % 2 != 0 for x in y),
    "cnt_gt4": lambda y: sum(x > 4 for x in y), "range": lambda y: max(y) - min(y) if y else 0,
    "sumsq": lambda y: sum(x * x for x in y), "prod10": lambda y: int(np.prod([x % 10 for x in y])) % 10,
    "distinct": lambda y: len(set(y)), "altsum": lambda y: sum(x if k % 2 == 0 else -x for k, x in enumerate(y)),
    "second": lambda y: y[1] if len(y) > 1 else 0, "argmax": lambda y: y.index(max(y)) if y else 0,
    "argmin": lambda y: y.index(min(y)) if y else 0, "median": lambda y: sorted(y)[(len(y) - 1) // 2] if y else 0,
    "sum10": lambda y: sum(y) % 10, "cnt_first": lambda y: y.count(y[0]) if y else 0,
}


def naive_op(name: str, xs) -> int:
    rname, tname = name[:-1].split("(")
    return NAIVE_REDUCERS[rname](list(mdp.TRANSFORMS[tname](list(xs))))


def naive_pair(regime: str, a: int, b: int) -> int:
    return (a + mdp.AFFINE_MUL * b) % mdp.AFFINE_MOD if regime == "pair_affine_mod" else (a > b) - (a < b) + 1


@pytest.fixture(scope="module")
def eval_records():
    return mdp.build_records("eval", 4)                     # 32 records: 4 per (regime, library size)


def test_operator_outputs_match_naive_python():
    names, outs = mdp.library(512)
    lists = mdp.universe()
    for k in range(0, 512, 7):
        for u in range(0, len(lists), 97):
            assert outs[k, u] == naive_op(names[k], lists[u]), (names[k], lists[u])


@pytest.mark.parametrize("regime", mdp.REGIMES)
def test_filtering_is_exact_against_brute_force(regime):
    names, _ = mdp.library(64)
    lists = mdp.universe()
    for seed in range(2):
        rec = mdp.make_record(64, regime, seed)
        w = mdp.world(rec)
        used = rec["visible"] + rec["probes"] + rec["hidden"]
        run = {(k, u): naive_op(names[k], lists[u]) for k in range(64) for u in used}
        out = lambda p, q, u: naive_pair(regime, run[p, u], run[q, u])        # noqa: E731
        tp, tq = rec["target"]
        cands = [(p, q) for p in range(64) for q in range(64)
                 if all(out(p, q, u) == out(tp, tq, u) for u in rec["visible"])]
        for T in (0, 0b1, 0b101, 0b11010000, 0b111, 0xFF):
            probed = [u for a, u in enumerate(rec["probes"]) if T >> a & 1]
            alive = [c for c in cands if all(out(*c, u) == out(tp, tq, u) for u in probed)]
            bad = [c for c in alive if any(out(*c, u) != out(tp, tq, u) for u in rec["hidden"])]
            assert w.n[T] == len(alive) and w.bad[T] == len(bad)
            splits = [sorted(np.unique([out(*c, u) for c in alive], return_counts=True)[1].tolist(), reverse=True)
                      for u in rec["probes"]]
            assert w.splits(T) == splits
            assert w.metrics(T)["exact"] == float(alive == [(tp, tq)])


def test_oracle_value_is_the_exhaustive_optimum(eval_records):
    for rec in eval_records[::3]:
        w = mdp.world(rec)
        for budget in range(mdp.MAX_BUDGET + 1):
            best = max(w.quality[mdp.mask_of("".join(seq))] for seq in itertools.product(mdp.LETTERS, repeat=budget))
            final = mdp.play(mdp.oracle_policy, [rec], budget)[0]
            assert w.quality[mdp.mask_of(final["probed"])] == pytest.approx(best)


def test_oracle_is_never_beaten(eval_records):
    for budget in range(mdp.MAX_BUDGET + 1):
        oracle = mdp.play(mdp.oracle_policy, eval_records, budget)
        for policy in (mdp.random_policy(0), mdp.random_policy(1), mdp.max_split_policy, mdp.minimax_policy):
            for o, s in zip(oracle, mdp.play(policy, eval_records, budget)):
                w = mdp.world(o["record"])
                qo, qs = w.quality[mdp.mask_of(o["probed"])], w.quality[mdp.mask_of(s["probed"])]
                assert qo >= qs - 1e-12
                assert w.metrics(mdp.mask_of(o["probed"]))["solved"] >= w.metrics(mdp.mask_of(s["probed"]))["solved"]


def test_target_blind_baselines_rank_probes_by_their_split(eval_records):
    """max-split: fewest expected survivors (sum of squared group sizes); minimax: smallest largest group, ties to
    the max-split criterion. Checked against each state's splits by brute force over the eight letters."""
    for rec in eval_records[::4]:
        state = mdp.new_state(rec, mdp.MAX_BUDGET)
        for _ in range(mdp.MAX_BUDGET):
            splits = mdp.world(rec).splits(mdp.mask_of(state["probed"]))
            expected = [sum(b * b for b in g) for g in splits]
            worst = [max(g) for g in splits]
            ms = mdp.LETTERS.index(mdp.max_split_policy("", state))
            mm = mdp.LETTERS.index(mdp.minimax_policy("", state))
            assert expected[ms] == min(expected)
            assert worst[mm] == min(worst)
            assert expected[mm] == min(e for e, w in zip(expected, worst) if w == worst[mm])
            state = mdp.advance(state, mdp.LETTERS[mm])


def test_planner_is_the_target_blind_optimum():
    """Played against every target the visible runs leave possible, the planner solves on average exactly the value
    its recursion computed (so it is the game's, and it does not peek: a policy that saw the target would beat its
    own value), at least as often as each target-blind baseline, and never more often than the oracle."""
    sees_further = 0
    for seed in (0, 1, 2, 13):
        rec = mdp.make_record(128, "pair_affine_mod", seed, "eval")
        cp, cq, _, _, _ = mdp.candidates(rec)
        recs = [{**rec, "target": [int(p), int(q)], "id": f"{rec['id']}~{p},{q}"} for p, q in zip(cp, cq) if p != q]
        for budget in (1, 2):
            solved = {name: np.array([mdp.world(s["record"]).metrics(mdp.mask_of(s["probed"]))["solved"]
                                      for s in mdp.play(fn, recs, budget)])
                      for name, fn in {"planner": planner_policy, **mdp.BASELINES}.items()}
            b = belief(rec)
            assert solved["planner"].mean() == pytest.approx(max(b.letter_values(b.alive(()), budget, ())))
            for name in ("random", "minimax", "max-split"):
                assert solved["planner"].mean() >= solved[name].mean() - 1e-12
            sees_further += solved["planner"].mean() > max(solved["minimax"].mean(), solved["max-split"].mean())
            assert (solved["oracle"] >= solved["planner"]).all()
    assert sees_further        # on some record it beats both one-step heuristics (seed 13, budget 1: 5/9 vs 4/9)


def test_budget_zero_solves_only_what_the_visible_runs_identify(eval_records):
    def never(text, state):
        raise AssertionError("no probe may be asked at budget 0")
    res = mdp.evaluate(never, eval_records, budgets=(0,))
    solved = [mdp.world(r).bad[0] == 0 for r in eval_records]
    assert res["overall"][0]["solved"] == pytest.approx(np.mean(solved))
    # brute force on the smallest library: solved at 0 <=> every pair agreeing on the visible runs is hidden-equal
    _, ops = mdp.library(64)
    for rec in [r for r in eval_records if r["lib_size"] == 64]:
        tp, tq = rec["target"]
        def agree(idx):                                                          # (64, 64) pairs equal to the target
            o = mdp.combine(rec["regime"], ops[:, None, idx], ops[None, :, idx])
            return (o == o[tp, tq]).all(-1)
        assert (mdp.world(rec).bad[0] == 0) == bool(agree(rec["hidden"])[agree(rec["visible"])].all())


def test_regimes_differ_in_information():
    recs = mdp.build_records("eval", 8)
    res = {name: mdp.evaluate(fn, recs, budgets=(3,)) for name, fn in mdp.BASELINES.items()}
    gain = {g: res["max-split"]["by_regime"][g][3]["solved"] - res["random"]["by_regime"][g][3]["solved"]
            for g in mdp.REGIMES}
    assert gain["pair_affine_mod"] > gain["pair_compare_gate"] + 0.1
    oracle = res["oracle"]["by_regime"]
    assert oracle["pair_affine_mod"][3]["solved"] > 0.6 > 0.25 > oracle["pair_compare_gate"][3]["solved"]


def test_records_states_and_random_play_are_deterministic():
    a, b = mdp.build_records("train", 1, seed=3), mdp.build_records("train", 1, seed=3)
    assert a == b and a != mdp.build_records("train", 1, seed=4)
    assert json.dumps(mdp.build_states(a)) == json.dumps(mdp.build_states(b))
    ids = [r["id"] for r in mdp.build_records("train", 2) + mdp.build_records("eval", 2)]
    assert len(ids) == len(set(ids))
    r1 = mdp.evaluate(mdp.random_policy(5), a)
    assert r1 == mdp.evaluate(mdp.random_policy(5), b)


def test_states_are_informative_and_rewards_in_range():
    exs = mdp.build_states(mdp.build_records("train", 2))
    assert len({e["id"] for e in exs}) == len(exs) > 0
    records = {r["id"]: r for r in mdp.build_records("train", 2)}
    for e in exs:
        assert 0 <= min(e["values"]) < max(e["values"]) <= 1
        oracle_values = mdp.world(records[e["record_id"]]).action_values(mdp.mask_of(e["probed"]), e["left"])
        assert oracle_values[mdp.LETTERS.index(e["oracle"])] == oracle_values.max()


def test_choice_stats_score_each_rule_by_its_own_letters(eval_records):
    """Each rule's own letters are 100% its best; repeats and invalid answers are no rule's; the states counted are
    those of the largest budget's games where some probe still splits the survivors."""
    res = mdp.baselines(eval_records)
    for name, key in (("minimax", "minimax_best"), ("max-split", "max_split_best"), ("oracle", "oracle_best")):
        assert res[name]["choices"][key] == 1.0 and res[name]["choices"]["repeat"] == 0.0
    choices = res["random"]["choices"]
    assert 0 < choices["minimax_best"] < 1 and 0 < choices["repeat"] < 1
    # the same counts by hand, from the prompt's view of each state (its "splits": one group = splits nothing)
    want = {"states": 0, "minimax_best": 0, "max_split_best": 0, "oracle_best": 0, "repeat": 0}
    for state in (s for rec in eval_records for s in _budget3_states(mdp.random_policy(0), rec)):
        splits = mdp.view(state)["splits"]
        if max(len(g) for g in splits) == 1:
            continue
        a = mdp.LETTERS.index(mdp.random_policy(0)("", state))
        largest, survivors = [max(g) for g in splits], [sum(b * b for b in g) for g in splits]
        value = mdp.world(state["record"]).action_values(mdp.mask_of(state["probed"]), state["left"])
        want["states"] += 1
        want["minimax_best"] += largest[a] == min(largest)
        want["max_split_best"] += survivors[a] == min(survivors)
        want["oracle_best"] += value[a] == max(value)
        want["repeat"] += mdp.LETTERS[a] in state["probed"]
    assert choices["states"] == want["states"] and choices["idle"] == 3 * len(eval_records) - want["states"]
    for key in ("minimax_best", "max_split_best", "oracle_best", "repeat"):
        assert choices[key] == want[key] / want["states"], key
    always_a = mdp.evaluate(lambda text, state: "A", eval_records)["choices"]
    assert always_a["repeat"] > 0.5                            # after its first probe, A splits nothing
    invalid = mdp.evaluate(lambda text, state: "?", eval_records)["choices"]
    assert invalid["states"] > 0 and all(invalid[k] == 0 for k in ("minimax_best", "oracle_best", "repeat"))


def _budget3_states(policy, record):
    """The three decision states of one budget-3 game."""
    state, out = mdp.new_state(record, 3), []
    for _ in range(3):
        out.append(state)
        state = mdp.advance(state, policy("", state))
    return out


def test_report_files(tmp_path, eval_records):
    results = mdp.baselines(eval_records[:8])
    paths = report.write_mdp_report(results, str(tmp_path / "report"))
    for name in ("overall_by_policy_budget", "regime_split"):
        rows = list(csv.reader(open(paths[f"{name}.csv"])))
        assert [r[0] for r in rows[1:]] == ["random", "minimax", "max-split", "oracle"]
        assert open(paths[f"{name}.md"]).read().startswith("| policy |")
    choices = {r["policy"]: r for r in csv.DictReader(open(paths["probe_choices.csv"]))}
    assert list(choices) == ["random", "minimax", "max-split", "oracle"]
    assert float(choices["minimax"]["minimax-best"]) == 100.0 and float(choices["oracle"]["oracle-best"]) == 100.0
    assert int(choices["random"]["states"]) == results["random"]["choices"]["states"]
    assert "| minimax | " in open(paths["probe_choices.md"]).read()
    assert open(paths["solve_rate_vs_budget.png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_baselines_command(tmp_path, capsys):
    """`python mdp.py baselines --planner --out DIR`: the tables with the planner between the heuristics and the
    oracle, and the report files; a bad --per-cell is refused with a one-line message."""
    import importlib
    cli = importlib.import_module("mdp")                   # the repo-root script, not minigrpo.tasks.mdp.world
    cli.main(["baselines", "--per-cell", "1", "--seed", "5", "--planner", "--out", str(tmp_path)])
    assert "8 eval records (1 per regime x library size), seed 5" in capsys.readouterr().out
    rows = list(csv.reader(open(tmp_path / "overall_by_policy_budget.csv")))
    assert [r[0] for r in rows[1:]] == ["random", "minimax", "max-split", "planner", "oracle"]
    solved3 = {r[0]: float(r[4]) for r in rows[1:]}
    assert solved3["planner"] <= solved3["oracle"]          # the planner is optimal in expectation, not per record
    with pytest.raises(SystemExit) as e:
        cli.main(["baselines", "--per-cell", "0"])
    assert e.value.code == 2 and "--per-cell must be at least 1" in capsys.readouterr().err


def test_task_prompt_reward_and_helpers():
    task = MDPTask(train_per_cell=1, val_per_cell=1, eval_per_cell=1)
    exs = task.examples("train")
    assert len({e["id"] for e in exs}) == len(exs) > 0
    for ex in exs:
        text = task.messages(ex)[0]["content"]
        assert len(text.encode()) < 600 and text.endswith("Probe? One letter A-H.")
        assert task.score(ex, task.sft_target(ex)) == pytest.approx(max(ex["values"]))
        assert task.score(ex, "Because") == 0.0 and task.score(ex, "") == 0.0
        for chosen, rejected in task.dpo_pairs(ex):
            assert task.score(ex, chosen) > task.score(ex, rejected)
    assert [parse_letter(s) for s in ("C", " (D).", "**E**", "<think>hm A?</think>\n\nB", "Probe C", "c", "H2")] \
        == ["C", "D", "E", "B", None, None, "H"]
    scrambled = MDPTask(train_per_cell=1, scramble=True)
    changed = [task.text(e) != scrambled.text(e) for e in scrambled.examples("train")]
    assert any(changed)
    ex = exs[0]
    lines = lambda t: [ln.split()[:2] for ln in t.splitlines()[2:10]]    # noqa: E731  letter + probe list
    assert lines(task.text(ex)) == lines(scrambled.text(ex))            # only the summaries move


def test_task_evaluate_and_controls():
    task = MDPTask(eval_per_cell=1)
    oracle = task.evaluate(mdp.oracle_policy)
    rnd = task.evaluate(mdp.random_policy(0))
    assert set(oracle["by_regime"]) == set(mdp.REGIMES) and set(oracle["overall"]) == {0, 1, 2, 3}
    assert oracle["overall"][3]["solved"] >= rnd["overall"][3]["solved"]
    batched = task.evaluate(lambda texts, states: [mdp.oracle_policy(t, s) for t, s in zip(texts, states)],
                            batched=True)
    assert batched == oracle
    invalid = task.evaluate(lambda text, state: "?")
    assert invalid["overall"][3] == invalid["overall"][0]                # invalid answers probe nothing
    shuffled = MDPTask(train_per_cell=1, shuffle_rewards=True)
    plain = MDPTask(train_per_cell=1)
    both = list(zip(plain.examples("train"), shuffled.examples("train")))
    assert all(sorted(a["values"]) == sorted(b["values"]) for a, b in both)      # same values, other letters
    assert any(a["values"] != b["values"] for a, b in both)
