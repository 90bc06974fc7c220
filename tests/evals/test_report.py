"""The mdp report states DPO - SFT and GRPO - SFT with paired bootstrap 95% intervals over the eval records, in
Markdown and CSV, and reads "within noise" when an interval covers 0."""
import csv
import math

import numpy as np
import pytest

from minigrpo.evals import report
from minigrpo.pretrained import load_pretrained
from minigrpo.tasks.mdp import world as mdp


def test_paired_bootstrap_by_hand():
    assert report.paired_bootstrap([1, 0, 1, 0], [1, 0, 1, 0]) == (0.0, 0.0, 0.0)
    # 40 of 400 records solved by a only, 10 by b only, the rest the same: +7.5 points
    a = np.zeros(400)
    b = np.zeros(400)
    a[:40] = 1
    b[40:50] = 1
    a[100:200] = b[100:200] = 1
    diff, lo, hi = report.paired_bootstrap(a, b)
    assert diff == pytest.approx(7.5)
    d = a - b
    half = 1.96 * 100 * d.std() / math.sqrt(len(d))          # the normal approximation of the same interval
    assert lo == pytest.approx(diff - half, abs=0.25 * half) and hi == pytest.approx(diff + half, abs=0.25 * half)
    assert lo > 0
    assert report.paired_bootstrap(a, b) == (diff, lo, hi)     # seeded: the report does not move on a rerun


def test_pairing_cancels_what_both_policies_share():
    """Two policies that solve the same 200 hard-won records and differ on 4: the paired interval is a few points
    wide at most, far narrower than two independent proportions near 50% would give (about +-7 points)."""
    a = np.zeros(400)
    a[:200] = 1
    b = a.copy()
    b[:4] = 0
    diff, lo, hi = report.paired_bootstrap(a, b)
    assert diff == pytest.approx(1.0) and hi - lo < 2.5 and lo >= 0


def fake_results():
    """Baseline policies played on real records, renamed as the pipeline's stages: SFT = max-split, process-DPO =
    minimax (nearly the same play), GRPO = random (far below)."""
    records = mdp.build_records("eval", 8, seed=0)
    base = mdp.baselines(records)
    return {"SFT": base["max-split"], "process-DPO": base["minimax"], "GRPO": base["random"],
            "oracle": base["oracle"]}, len(records)


def test_difference_table_rows_in_markdown_and_csv(tmp_path):
    results, n = fake_results()
    assert all(len(v) == n for v in results["SFT"]["solved_by_record"].values())
    paths = report.write_mdp_report(results, str(tmp_path))
    rows = list(csv.DictReader(open(paths["differences.csv"])))
    assert [(r["difference"], r["budget"]) for r in rows] == \
        [("process-DPO - SFT", str(b)) for b in range(4)] + [("GRPO - SFT", str(b)) for b in range(4)]
    for r in rows:
        a, b = r["difference"].split(" - ")
        budget = int(r["budget"])
        want = 100 * (results[a]["overall"][budget]["solved"] - results[b]["overall"][budget]["solved"])
        assert float(r["points"]) == pytest.approx(want, abs=0.01)            # the difference of the table's rates
        assert float(r["95% low"]) <= float(r["points"]) <= float(r["95% high"])
        covers = float(r["95% low"]) <= 0 <= float(r["95% high"])
        assert r["reading"] == ("within noise" if covers else "above" if float(r["95% low"]) > 0 else "below")
    at = {(r["difference"], r["budget"]): r for r in rows}
    assert at[("process-DPO - SFT", "0")]["reading"] == "within noise"      # budget 0: nobody has probed
    assert float(at[("process-DPO - SFT", "0")]["95% high"]) == 0.0
    assert at[("GRPO - SFT", "3")]["reading"] == "below"                   # random play vs max-split
    md = open(paths["differences.md"]).read()
    assert md.startswith("| difference | budget | points | 95% low | 95% high | reading |")
    assert "| GRPO - SFT | 3 | " in md and "within noise" in md


def test_pairs_need_the_same_records():
    results, _ = fake_results()
    results["GRPO"] = {**results["GRPO"], "solved_by_record": {b: v[:-1] for b, v in
                                                               results["GRPO"]["solved_by_record"].items()}}
    with pytest.raises(ValueError, match="different records"):
        report.mdp_difference_table(results)


def test_no_pairs_no_rows(tmp_path):
    results, _ = fake_results()
    del results["SFT"]
    assert report.mdp_difference_table(results)[1] == []


def test_eval_py_reports_adapter_minus_base(tmp_path):
    """eval.py --task mdp --adapter: the adapter column against its base, paired on the same records."""
    import torch

    import eval as ev
    from minigrpo.lora import inject_lora
    from minigrpo.run.lora_files import save_adapter
    model = load_pretrained("tiny")
    for p in inject_lora(model, r=2, alpha=4):
        torch.nn.init.normal_(p, std=0.5, generator=torch.Generator().manual_seed(0))
    save_adapter(model, str(tmp_path / "adapter"), base_model_name_or_path="tiny")
    ev.main(["--task", "mdp", "--model", "tiny", "--adapter", str(tmp_path / "adapter"), "--limit", "1",
             "--max-new-tokens", "2", "--out", str(tmp_path / "out"), "--quiet"])
    rows = list(csv.DictReader(open(tmp_path / "out" / "differences.csv")))
    assert [r["difference"] for r in rows] == ["adapter - base"] * 4
    assert "| adapter - base | 3 |" in (tmp_path / "out" / "report.md").read_text()
