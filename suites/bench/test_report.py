"""treespec bench's report (treespec.bench.report) from rows given by hand:
the table's layout, auto's calibration warning, treespec's chain against
mlx-lm's. The report of a staged run: test_bench.py."""

import pytest

from treespec.bench import report as R


def test_rows_whose_names_share_a_long_start_stay_told_apart():
    """Parent lists of deep spines differ only at their ends: every name is
    printed whole, its columns still aligned with the header's."""
    names = ["fixed p[-1,0,0,1,1,3,3,5,5,7,7]", "fixed p[-1,0,0,1,1,3,3,5,5,7,7,9,9]"]
    rows = [{"name": n, "exact": False, "reason": "staged"} for n in names]
    lines = R.format_table({"rows": rows}).splitlines()
    assert [" ".join(ln.split()[:2]) for ln in lines[2:]] == names, lines
    assert all(ln.index("GATED") == lines[0].index("exact") for ln in lines[2:]), lines


def auto_report(decode_tok_s, predicted_tok_s):
    row = {"name": "auto (chain b=7)", "kind": "auto", "decode_tok_s": decode_tok_s,
           "choice": {"mode": "chain", "block": 7, "predicted": [
               {"name": "chain b=5", "tok_s": 10 * predicted_tok_s},
               {"name": "chain b=7", "tok_s": predicted_tok_s}]}}
    return {"rows": [row]}


def test_an_auto_row_far_under_its_calibrated_prediction_is_flagged():
    # The H200 run at af03c15: auto predicted chain b=7 at 548 tok/s, its row ran 168.3.
    warning = R.calibration_check(auto_report(168.3, 548.0))
    assert "0.31x" in warning and "chain b=7 (548.0)" in warning
    # This CPU at ca285ec: predicted 241, ran 260.2: no warning.
    assert R.calibration_check(auto_report(260.2, 241.0)) == ""
    assert R.calibration_check(auto_report(0.69 * 100, 100.0)) != ""
    assert R.calibration_check(auto_report(0.71 * 100, 100.0)) == ""


def test_chain_vs_mlx_lm_is_matched_by_block_with_what_a_round_costs_apart_from_how_many():
    rows = [{"kind": "chain", "block": 3, "tok_s": 1.0, "decode_tok_s": 90.0, "tokens": 96,
             "rounds": 40, "decode_all": [90.0, 80.0], "cpu_all": [10.0, 10.0]},
            {"kind": "mlx-lm", "block": 3, "tok_s": 1.0, "decode_tok_s": 100.0, "tokens": 96,
             "rounds": 36, "decode_all": [100.0, 100.0], "cpu_all": [9.0, 9.0]},
            {"kind": "chain", "block": 4, "tok_s": 1.0, "decode_tok_s": 90.0, "decode_all": [90.0]}]
    (m,) = R.chain_vs_mlx_lm({"rows": rows})
    assert (m.block, m.ours, m.theirs) == (3, 90.0, 100.0)
    assert m.ratio == pytest.approx(0.85) and m.cpu_ratio == pytest.approx(0.9)
    assert (m.rounds, m.their_rounds) == (40, 36)
    # By hand: per repeat, (96 tokens / 90 tok/s / 40 rounds) / (96 / 100 / 36) = 1.0 and
    # (96 / 80 / 40) / (96 / 100 / 36) = 1.125: slower overall, as cheap a round in one repeat.
    assert m.round_cost == pytest.approx((1.0 + 1.125) / 2)
    assert "ratio 0.85  cpu ratio 0.90  rounds 40/36, a round 1.06x" in \
        R.format_chain_vs_mlx_lm({"rows": rows})
