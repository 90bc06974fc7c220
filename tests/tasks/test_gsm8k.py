"""GSM8K task: rewards, number parsing, the gsm8k run's split, data loading (local files; the hub path with a fake
download), the hint probe on scripted fakes, eval metrics and the report helpers. No network."""
import itertools
import json
import re
import sys

import numpy as np
import pytest

from minigrpo import hub
from minigrpo.evals import report
from minigrpo.evals import gsm8k as ge
from minigrpo.run import plots
from minigrpo.tasks import gsm8k as g

GOLD = {"id": "t-1", "question": "How many?", "answer": "1200", "answer_number": 1200.0}


def ex_of(gold: str, id: str = "t-x") -> dict:
    return {"id": id, "question": "q", "answer": gold, "answer_number": g.parse_gold_number(gold)}


def well(answer: str, reasoning: str = "2 * 600 = 1200") -> str:
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>"

# ---------------------------------------------------------------------------------------------------------------
# rewards


@pytest.mark.parametrize("completion, correct, kind", [
    (well("1200"), True, "well"),
    (well("$1,200"), True, "well"),                                   # commas and currency
    (well("1,200 dollars."), True, "well"),                           # units and a trailing period
    (well("12 * 100 = 1200"), True, "well"),                          # the part right of the last "="
    (well("1200") + "<|im_end|>", True, "well"),                      # EOS text left by the decode
    (well("1300"), False, "well"),                                    # wrong
    (well("1200.0"), True, "well"),                                   # decimals
    ("<answer>1200</answer>", True, "partial"),                       # no reasoning block
    ("I think <answer>1200</answer>", True, "partial"),               # text before
    (well("1200") + "\nHuman: and now?", True, "partial"),            # goes on after </answer>
    ("<reasoning>r</reasoning>\n<answer>1200", False, "partial"),     # unclosed answer: not an answer
    ("<reasoning>r</reasoning><answer></answer>", False, "partial"),  # empty answer earns no correctness
    ("<reasoning>r</reasoning><answer>   </answer>", False, "partial"),
    (well("100 or 1200"), False, "well"),                             # listing numbers earns nothing
    (well("1200") + "<answer>5</answer>", True, "partial"),           # several answers: the first counts
    (well("5") + "<answer>1200</answer>", False, "partial"),
    ("<reasoning></reasoning><answer>1200</answer>", True, "partial"),  # empty reasoning is not well-formed
    ("<reasoning>r</reasoning>", False, "partial"),                   # missing answer
    ("The answer is 1200.", False, "none"),                           # no tags at all
    ("", False, "none"),
    ("<answer>1200", False, "none"),                                  # malformed: no closing tag anywhere
])
def test_reward_cases(completion, correct, kind):
    d = g.details(GOLD, completion)
    assert d["correct"] is correct and d["format_kind"] == kind
    fmt = {"well": g.FORMAT_WELL, "partial": g.FORMAT_PARTIAL, "none": 0.0}[kind]
    assert d["correctness"] == (g.CORRECT_REWARD if correct else 0.0) and d["format"] == fmt
    assert d["brevity"] == (pytest.approx(g.BREVITY_MAX) if correct and kind == "well" else 0.0)  # all short
    assert g.score(GOLD, completion) == pytest.approx(d["correctness"] + d["format"] + d["brevity"])


@pytest.mark.parametrize("gold, answer, correct", [
    ("3/4", "3/4", True), ("3/4", "0.75", True), ("0.75", "\\frac{3}{4}", True), ("3/4", "3 / 4 cup", True),
    ("-7", "-7", True), ("-7", "7", False), ("-7", "−7 degrees", True), ("-5", "-$5", True),
    ("25", "25%", True), ("2.5", "2.50", True), ("2.5", "2.4", False), ("18", "$18.", True),
    ("1,000,000", "1000000", True), ("1000", "1,000", True), ("5", "5-3", False), ("70000", "70,000 km", True),
])
def test_numeric_comparison(gold, answer, correct):
    assert g.details(ex_of(gold), well(answer))["correct"] is correct


def test_number_parsing():
    assert g.numbers_in("Janet sells 16 - 3 - 4 = 9 eggs at $2 each: $18.") == [16, 3, 4, 9, 2, 18]
    assert g.numbers_in("from 5-3 and x2") == [5, 3]  # a hyphen glued to a digit is no minus; x2 is no number
    assert g.numbers_in("1,234,567.5 and .5 and 12,00") == [1234567.5, 0.5, 12, 0]
    assert g.numbers_in("1,200 / 2") == [600] and g.numbers_in("1,200 / 2", parts=True) == [600, 1200, 2]
    assert g.parse_answer_number("x = 12 * 3 = 36 apples") == 36
    assert g.parse_answer_number("36 or 37") is None
    assert g.parse_gold_number("\\frac{3}{4}") == 0.75 and g.parse_gold_number("-\\dfrac{1}{2}") == -0.5
    assert g.parse_gold_number("10\\%") == 10 and g.parse_gold_number("x = 5") == 5
    assert g.parse_gold_number("2x") is None and g.parse_gold_number("(1,2)") is None
    assert g.parse_gold_number("5\\sqrt{2}") is None


def test_non_numeric_gold_compares_normalised_strings():
    ex = {"id": "m", "question": "q", "answer": "(2,\\!-3)", "answer_number": None}
    assert g.details(ex, well("( 2, -3 )"))["correct"]
    assert not g.details(ex, well("(2,3)"))["correct"]
    assert g.details(ex, "so the point is (2, -3) I think")["lenient_correct"]


def test_lenient_is_any_number_anywhere():
    d = g.details(GOLD, "First 1200 / 2 = 600, so 600.")
    assert d["lenient_correct"] and not d["correct"]   # generous: 1200 appears, though not as the answer
    assert not g.details(GOLD, "It is 1300.")["lenient_correct"]


def test_continues_after_answer():
    assert g.continues_after_answer(well("1") + "\nUser: thanks")
    assert not g.continues_after_answer(well("1") + "\n\n<|im_end|><|endoftext|>")
    assert not g.continues_after_answer("no tags at all")


def _completions(n_chars_list=(40, 400, 900, 1600, 5000)):
    """Every correctness x format class at short and very long lengths."""
    out = []
    for n in n_chars_list:
        pad = "x" * n
        for ans in ("1200", "7", ""):
            out += [well(ans, pad) if ans else f"<reasoning>{pad}</reasoning><answer></answer>",
                    f"<answer>{ans}</answer> {pad}", f"<reasoning>{pad}</reasoning> {ans}", pad + ans]
    return out


def test_brevity_never_outweighs_correctness_or_format():
    rank = {"none": 0, "partial": 1, "well": 2}
    ds = [g.details(GOLD, c) for c in _completions()]
    assert len({(d["correct"], d["format_kind"]) for d in ds}) == 5  # every reachable class is present
    for a, b in itertools.permutations(ds, 2):
        if a["correct"] and not b["correct"]:
            assert a["score"] > b["score"]
        if a["correct"] == b["correct"] and rank[a["format_kind"]] > rank[b["format_kind"]]:
            assert a["score"] > b["score"]
    # the bound holds even if brevity were paid to everyone: it is below the smallest format step
    assert g.BREVITY_MAX < min(g.FORMAT_PARTIAL, g.FORMAT_WELL - g.FORMAT_PARTIAL)
    bonus = [g.brevity_bonus(n) for n in range(0, 3000, 7)]
    assert all(0 <= b <= g.BREVITY_MAX for b in bonus) and bonus == sorted(bonus, reverse=True)
    assert bonus[0] == g.BREVITY_MAX and bonus[-1] == 0.0


def test_shorter_correct_answers_score_higher():
    short, long = g.score(GOLD, well("1200", "x" * 300)), g.score(GOLD, well("1200", "x" * 1000))
    assert short > long > g.CORRECT_REWARD + g.FORMAT_WELL - 1e-9

# ---------------------------------------------------------------------------------------------------------------
# split


def test_split_matches_the_seed():
    idx = g.split_indices(8792)
    assert {k: len(v) for k, v in idx.items()} == {"train": 7033, "val": 879, "eval": 880}
    # datasets' Dataset.shuffle(seed=3407): np.random.default_rng(3407).permutation(n), then select
    perm = np.random.default_rng(3407).permutation(8792)
    assert np.array_equal(np.concatenate([idx["train"], idx["val"], idx["eval"]]), perm)
    assert perm[:5].tolist() == [659, 4768, 5822, 5467, 2259]  # pinned: a numpy change would move the split
    assert len(set(np.concatenate(list(idx.values())).tolist())) == 8792  # disjoint and complete


@pytest.mark.parametrize("n", [1, 9, 10, 101, 7473 + 1319])
def test_split_sizes_and_determinism(n):
    a, b = g.split_indices(n), g.split_indices(n)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert len(a["train"]) == n * 8 // 10 and len(a["val"]) == n // 10
    assert sorted(np.concatenate(list(a.values())).tolist()) == list(range(n))
    assert not np.array_equal(g.split_indices(n, seed=1)["eval"], a["eval"]) or n < 10

# ---------------------------------------------------------------------------------------------------------------
# data


def gsm8k_rows(n: int, offset: int = 0) -> list[dict]:
    return [{"question": f"Q{offset + i}: what is {offset + i} + 1000?",
             "answer": f"{offset + i} + 1000 = <<{offset + i}+1000={offset + i + 1000}>>{offset + i + 1000}\n"
                       f"#### {offset + i + 1000:,}"} for i in range(n)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_local_jsonl_file_and_folder(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", gsm8k_rows(16))
    write_jsonl(tmp_path / "test.jsonl", gsm8k_rows(4, offset=100))
    pool = g.load_gsm8k(str(tmp_path))
    assert [e["id"] for e in pool[:2]] == ["gsm8k-train-00000", "gsm8k-train-00001"]
    assert pool[16]["id"] == "gsm8k-test-00000" and pool[16]["answer"] == "1,100"
    assert pool[16]["answer_number"] == 1100 and pool[0]["question"].startswith("Q0:")
    task = g.GSM8KTask(data=str(tmp_path))
    sets = {s: task.examples(s) for s in ("train", "val", "eval")}
    assert [len(v) for v in sets.values()] == [16, 2, 2]
    ids = [{e["id"] for e in v} for v in sets.values()]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert task.eval_sets() == {"gsm8k": sets["eval"]}
    one = g.load_gsm8k(write_jsonl(tmp_path / "all.jsonl", gsm8k_rows(3)))
    assert [e["id"] for e in one] == ["gsm8k-00000", "gsm8k-00001", "gsm8k-00002"]


def test_data_errors_are_one_line_and_actionable(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such data file"):
        g.load_gsm8k(str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="lacks train.jsonl, test.jsonl"):
        g.load_gsm8k(str(tmp_path))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "no final line"}])
    with pytest.raises(ValueError, match="no '#### <number>' line"):
        g.load_gsm8k(bad)
    with pytest.raises(ValueError, match="split 'test'"):
        g.GSM8KTask(data=bad).examples("test")


def svamp_rows():
    return [{"ID": f"chal-{i}", "Body": f"Jack has {i} apples .", "Question": "How many does he have now ?",
             "Equation": f"( {i} + 0.0 )", "Answer": float(i), "Type": "Addition"} for i in range(1, 6)]


def math_rows():
    sols = ["So $x = \\boxed{5}$.", "We get $\\boxed{\\frac{3}{4}}$.", "Hence \\boxed{(2,-3)}.",
            "Thus $\\boxed{2x+1}$ and not \\boxed{3}... no: $\\boxed{\\dfrac{-1}{2}}$"]
    return [{"problem": f"Problem {i}", "level": "Level 2", "type": "Algebra", "solution": s}
            for i, s in enumerate(sols)]


def test_svamp_and_math_local(tmp_path):
    sv = g.load_svamp(write_jsonl(tmp_path / "svamp.jsonl", svamp_rows()))
    assert sv[0] == {"id": "svamp-chal-1", "question": "Jack has 1 apples . How many does he have now ?",
                     "answer": "1", "answer_number": 1.0}
    ma = g.load_math(write_jsonl(tmp_path / "math.jsonl", math_rows()))
    assert [m["answer"] for m in ma] == ["5", "\\frac{3}{4}", "(2,-3)", "\\dfrac{-1}{2}"]
    assert [m["answer_number"] for m in ma] == [5.0, 0.75, None, -0.5]
    assert ma[0]["id"] == "math-algebra-test-00000"
    small = g.load_math(str(tmp_path / "math.jsonl"), limit=2)
    assert small == g.load_math(str(tmp_path / "math.jsonl"), limit=2) and len(small) == 2  # fixed sample
    task = g.GSM8KTask(data=write_jsonl(tmp_path / "gsm.jsonl", gsm8k_rows(10)),
                       svamp=str(tmp_path / "svamp.jsonl"), math_algebra=str(tmp_path / "math.jsonl"))
    assert list(task.eval_sets()) == ["gsm8k", "svamp", "math_algebra"]
    assert g.last_boxed("no box") is None


def test_hub_path_with_a_fake_download(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed: pip install pyarrow (the gsm8k extra, "
                                                 "which reads the hub's parquet files) runs this test")
    import pyarrow.parquet as pq
    import huggingface_hub
    tables = {("openai/gsm8k", "main/train-00000-of-00001.parquet"): gsm8k_rows(8),
              ("openai/gsm8k", "main/test-00000-of-00001.parquet"): gsm8k_rows(2, offset=50),
              ("ChilleD/SVAMP", "data/test-00000-of-00001.parquet"): svamp_rows(),
              ("EleutherAI/hendrycks_math", "algebra/test-00000-of-00001.parquet"): math_rows()}
    calls = []

    def fake_download(repo_id, filename, repo_type):
        assert repo_type == "dataset"
        calls.append((repo_id, filename))
        path = tmp_path / re.sub(r"\W", "_", repo_id + filename)
        pq.write_table(pa.Table.from_pylist(tables[(repo_id, filename)]), path)
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(hub, "unreachable", lambda: None)      # the hub answers: the download is called as is
    task = g.GSM8KTask(svamp="hub", math_algebra="hub")
    assert len(task.examples("train")) == 8 and len(task.examples("eval")) == 1
    assert g.load_gsm8k("hub")[8]["id"] == "gsm8k-test-00000"
    sets = task.eval_sets()
    assert sets["svamp"][0]["answer_number"] == 1.0 and sets["math_algebra"][1]["answer_number"] == 0.75
    assert ("EleutherAI/hendrycks_math", "algebra/test-00000-of-00001.parquet") in calls


def test_missing_pyarrow_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install pyarrow.*local JSONL"):
        g._read_parquet(str(tmp_path / "x.parquet"))

# ---------------------------------------------------------------------------------------------------------------
# prompt, task protocol, eval metrics


def test_task_protocol_and_prompt():
    task = g.GSM8KTask()  # no data is read until examples() is called
    assert task.name == "gsm8k" and task.turns == 1 and task.stop_strings == ["</answer>"]
    msgs = task.messages(GOLD)
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == GOLD["question"]
    assert "<reasoning>" in msgs[0]["content"] and "</answer>" in msgs[0]["content"]
    hinted = task.messages(GOLD, hint="7")[1]["content"]
    assert hinted.startswith(GOLD["question"]) and hinted.endswith("A student suggested the answer is 7.")
    assert task.score(GOLD, well("1200")) == task.details(GOLD, well("1200"))["score"]
    assert task.score({"id": "x", "question": "q", "answer": "", "answer_number": None}, "a") is None


def test_evaluate_metrics():
    comps = [well("1200"), well("1300", "guess"), "It is 1200", well("1200") + " more", "<answer>1200</answer>"]
    metrics, rows = ge.evaluate([GOLD] * 5, comps)
    assert metrics["n"] == 5
    assert metrics["strict_accuracy"] == pytest.approx(3 / 5)
    assert metrics["lenient_accuracy"] == pytest.approx(4 / 5)
    assert metrics["format_compliance"] == pytest.approx(2 / 5) and metrics["partial_format"] == pytest.approx(2 / 5)
    assert metrics["continues_after_answer"] == pytest.approx(1 / 5)
    assert rows[0]["id"] == "t-1" and rows[0]["predicted_number"] == 1200 and json.dumps(rows)
    with pytest.raises(ValueError, match="2 examples but 1 completions"):
        ge.evaluate([GOLD] * 2, comps[:1])

# ---------------------------------------------------------------------------------------------------------------
# hint probe


PROBLEMS = [ex_of(a, id=f"p{i}") | {"question": f"Problem {i}?"} for i, a in enumerate(
    ["12", "1,200", "-4", "2.5", "0", "7", "3/4", "90"])]
GOLD_BY_QUESTION = {p["question"]: p["answer"] for p in PROBLEMS}
HINT = re.compile(r"A student suggested the answer is (\S+)\.$")


def fake_model(follow_hints: bool, right: set | None = None):
    """Answers the gold (only for questions in `right`, when given; else a wrong number); a follower answers
    whatever a hint says instead."""
    def generate(batch):
        out = []
        for msgs in batch:
            user = msgs[-1]["content"]
            question = user.split("\n\n")[0]
            hint = HINT.search(user)
            ans = GOLD_BY_QUESTION[question] if right is None or question in right else "123456"
            if follow_hints and hint:
                ans = hint.group(1)
            out.append(well(ans))
        return out
    return generate


def test_hint_probe_follower_flips_everything():
    res = ge.hint_probe(PROBLEMS, fake_model(follow_hints=True))
    assert res["n"] == 8 and res["right_without_hint"] == 8
    assert res["flip_rate"] == 1.0 and res["flips"] == 8 and res["followed_decoy_rate"] == 1.0
    assert res["accuracy_correct_hint"] == 1.0 and res["accuracy_wrong_hint"] == 0.0


def test_hint_probe_ignorer_never_flips():
    res = ge.hint_probe(PROBLEMS, fake_model(follow_hints=False), batch_size=5)
    assert res["flip_rate"] == 0.0 and res["flips"] == 0 and res["followed_decoy_rate"] == 0.0
    assert res["gain_rate"] is None  # nothing was wrong without a hint
    assert all(r["right_none"] and r["right_wrong"] for r in res["rows"])


def test_hint_probe_counts_gains_and_uses_only_the_right_ones_for_flips():
    right = {p["question"] for p in PROBLEMS[:3]}
    res = ge.hint_probe(PROBLEMS, fake_model(follow_hints=True, right=right), batch_size=3)
    assert res["right_without_hint"] == 3 and res["flip_rate"] == 1.0
    assert res["gains"] == 5 and res["gain_rate"] == 1.0
    ign = ge.hint_probe(PROBLEMS, fake_model(follow_hints=False, right=right))
    assert ign["flip_rate"] == 0.0 and ign["gain_rate"] == 0.0 and ign["accuracy_no_hint"] == 3 / 8
    assert ge.hint_probe(PROBLEMS, lambda b: [well("123456")] * len(b))["flip_rate"] is None
    with pytest.raises(ValueError, match="generate returned"):
        ge.hint_probe(PROBLEMS, lambda b: b[:1])


def test_decoy_is_wrong_plausible_and_fixed():
    for i, gold in enumerate([0, 1, 2, 5, 18, 100, 1200, -10, -1, 2.5, 0.004, 1e6, 33.33]):
        ex = {"id": f"d{i}", "answer_number": float(gold)}
        for k in range(8):
            ex["id"] = f"d{i}-{k}"
            d = float(ge.decoy(ex))
            assert d != gold and ge.decoy(ex) == ge.decoy(dict(ex))
            assert (d > 0) == (gold > 0) or gold == 0
            assert float(gold).is_integer() <= d.is_integer()  # integer golds get integer decoys
            assert abs(d - gold) <= max(1, 0.5 * abs(gold)) + 1e-9

# ---------------------------------------------------------------------------------------------------------------
# report helpers


def test_compare_table_and_json(tmp_path):
    results = {"base": {"gsm8k": {"n": 880, "strict_accuracy": 0.669}, "hint_probe": {"flip_rate": None}},
               "adapter": {"gsm8k": {"n": 880, "strict_accuracy": 0.873}, "hint_probe": {"flip_rate": 0.37}}}
    table = report.compare_table(results, ge.EVAL_METRICS + ge.PROBE_METRICS, percent=ge.PERCENT_METRICS)
    lines = table.strip().splitlines()
    assert lines[0] == "| set | metric | base | adapter | change |"
    assert "| gsm8k | strict_accuracy | 66.9% | 87.3% | +20.4pp |" in lines
    assert "| gsm8k | n | 880 | 880 | +0.000 |" in lines
    assert "| hint_probe | flip_rate | – | 37.0% | – |" in lines
    path = report.write_json(results, str(tmp_path / "out" / "results.json"))
    assert json.load(open(path)) == results


def test_plots_are_written(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": i, "reward_mean": i / 10, "reward_std": 0.1, "kl": 0.01 * i, "acc": i / 20})
             for i in range(12)]
    metrics.write_text("\n".join(lines) + '\n{"step": 12, "rew')  # a torn last line is skipped
    assert report.curve_keys(plots.read_metrics(str(metrics))) == ["reward_mean", "reward_std", "acc"]
    out = report.plot_curves(str(metrics), str(tmp_path / "plots" / "curves.png"), smooth=3)
    results = {"base": {"gsm8k": {"strict_accuracy": 0.669}, "svamp": {"strict_accuracy": 0.767}},
               "adapter": {"gsm8k": {"strict_accuracy": 0.873}, "svamp": {"strict_accuracy": 0.867}}}
    bars = report.plot_bars(results, str(tmp_path / "plots" / "bars.png"))
    for p in (out, bars):
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert report.plot_curves([{"step": 0, "kl": 1.0}], str(tmp_path / "none.png")) is None
