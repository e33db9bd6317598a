"""treespec bench: its structure and its gating, not its timings.

Contract 10 (a figure only next to the exactness checks it passed in the same
run) is pinned with fake runners and a fake gate, so a failing probe and a
failing text diff can be staged; one small run on the trained pair checks the
real paths (treespec decode, mlx-lm's speculative decoding, the shared probe)."""

import json
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from suites.helpers_numerics import exact_backend
from suites.verdict import census_line
from treespec.bench import measure as B
from treespec.cli import main as cli
from treespec import zoo
from treespec.bench import command as bench_cli
from treespec.bench import report as R
from treespec.bench import shared_probe
from treespec.bench.shared_probe import SharedProbe
from treespec.checkpoints import default_pair, load_default_pair
from treespec.cli.main import build_parser, command
from treespec.evidence.gate import Decision, ShapeResult

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- parsing


def test_blocks_parse_ranges_and_lists():
    assert B.parse_blocks("2..8") == [2, 3, 4, 5, 6, 7, 8]
    assert B.parse_blocks("6,2,4") == [2, 4, 6]
    for bad in ("1..4", "x", "", "3..2"):
        with pytest.raises(Exception):
            B.parse_blocks(bad)


def test_trees_parse_branching_lists():
    assert B.parse_trees("2,1,1 2,2,1") == [(2, 1, 1), (2, 2, 1)]
    assert B.parse_trees("3,1;2") == [(3, 1), (2,)]
    assert B.parse_trees("") == []
    with pytest.raises(Exception):
        B.parse_trees("2,0")


def test_trees_parse_parent_lists_told_apart_by_the_roots_minus_one():
    assert B.parse_trees("2,1 -1,0,0,1,1") == [(2, 1), (-1, 0, 0, 1, 1)]
    args = build_parser().parse_args(["bench", "--trees=-1,0,0,1,1,3,3 2,1,1"])
    assert args.trees == [(-1, 0, 0, 1, 1, 3, 3), (2, 1, 1)]
    for bad in ("-1,0,5", "-1,-1", "-1,0,x"):  # a forward parent, a second root, not a number
        with pytest.raises(Exception, match="--trees"):
            B.parse_trees(bad)


def test_the_bench_command_and_its_defaults():
    args = build_parser().parse_args(["bench"])
    assert command(args.command) is bench_cli.cmd_bench
    assert args.blocks == [2, 3, 4, 5, 6, 7, 8]
    assert args.trees == [(2, 1, 1), (2, 2, 1), (3, 1, 1, 1)]
    assert (args.prompts, args.repeats, args.model, args.plot) == (3, 5, None, None)
    assert not args.verify_curve and not args.json and args.blas == "auto"
    args = build_parser().parse_args(["bench", "--blocks", "2,4", "--verify-curve", "--json",
                                      "--plot", "out", "--blas", "openblas"])
    assert args.blocks == [2, 4] and args.verify_curve and args.plot == "out"


def test_configurations_cover_every_mode_at_matching_budgets():
    configs = B.build_configs([2, 4], [(2, 2, 1)])
    names = [c.name for c in configs]
    assert names == ["classic", "chain b=2", "chain b=4", "fixed [2,2,1]", "conf n=1",
                     "conf n=3", "mlx-lm b=2", "mlx-lm b=4"]
    budgets = {c.name: c.budget for c in configs}
    assert budgets["chain b=4"] == budgets["conf n=3"] == budgets["mlx-lm b=4"] == 3
    assert budgets["fixed [2,2,1]"] == 2 + 4 + 4
    by = {c.name: c for c in configs}
    assert by["chain b=4"].decode_kwargs() == {"mode": "chain", "block": 4}
    assert by["conf n=3"].decode_kwargs() == {"mode": "tree", "budget": 3, "width": 4}
    assert by["fixed [2,2,1]"].decode_kwargs() == {"mode": "tree", "branching": [2, 2, 1]}
    # --no-mlx-lm and --no-confidence leave out those rows and nothing else
    assert [c.name for c in B.build_configs([2, 4], [(2, 2, 1)], mlx_lm=False,
                                            confidence=False)] == names[:4]
    spine = B.build_configs([2], [(-1, 0, 0, 1, 1)], mlx_lm=False)[2]
    assert spine.name == "fixed p[-1,0,0,1,1]" and spine.budget == 4
    assert spine.decode_kwargs() == {"mode": "tree", "parents": [-1, 0, 0, 1, 1]}
    # --batch-levels: a second row for each tree with a level of two or more
    # fed nodes ([2,2,1] and [2,1] are; a spine and [1,2] feed one chain)
    rows = B.build_configs([2], [(2, 2, 1), (-1, 0, 0, 1, 1), (1, 2), (2, 1)], mlx_lm=False,
                           confidence=False, batch_levels=True)
    assert [c.name for c in rows[2:]] == ["fixed [2,2,1]", "fixed [2,2,1] rows",
                                          "fixed p[-1,0,0,1,1]", "fixed [1,2]", "fixed [2,1]",
                                          "fixed [2,1] rows"]
    assert rows[3].decode_kwargs() == {"mode": "tree", "branching": [2, 2, 1],
                                       "batch_levels": True}
    assert rows[3].drafter().batch_levels and not rows[2].drafter().batch_levels
    assert rows[3].budget == rows[2].budget and rows[3].probe_shapes() == rows[2].probe_shapes()
    # mlx-lm's chain verify is probed with the chain shapes of its block
    assert by["mlx-lm b=4"].probe_shapes() == by["chain b=4"].probe_shapes()
    assert not by["classic"].speculative and by["classic"].probe_shapes() is None


def test_auto_rows_decode_as_their_choice():
    chain = B.auto_config({"mode": "chain", "block": 3, "budget": 2, "branching": None,
                           "width": None, "reason": "r"})
    # a chain's size is its block: decode refuses a budget beside it
    assert chain.name == "auto (chain b=3)" and chain.decode_kwargs() == {
        "mode": "chain", "block": 3}
    tree = B.auto_config({"mode": "tree", "block": None, "budget": 5, "branching": None,
                          "width": 4, "reason": "r"})
    assert tree.name == "auto (conf n=5)" and tree.effective_kind() == "confidence"
    classic = B.auto_config({"mode": "classic", "reason": "r"})
    assert classic.name == "auto (classic)" and not classic.speculative


# ----------------------------------------------------------------------------- gating (fakes)


REF = [[5, 6, 7, 8], [9, 10, 11]]


def fake(tokens_of, rounds=2, wall=0.01):
    """A runner returning fixed tokens per prompt and plausible stats."""

    def runner(target, draft, prompt, max_tokens, eos):
        toks = tokens_of(prompt)
        stats = {"rounds": rounds, "proposed": 2 * rounds, "accepted": rounds, "emitted": len(toks),
                 "depth_accepted": [rounds, 0], "depth_reached": [rounds, rounds],
                 "time_ms": {"prefill": 0.1, "draft": 1.0, "verify": 2.0, "walk": 0.1,
                             "commit": 0.2}}
        return B.Run(list(toks), wall, stats)

    return runner


def staged_configs():
    good = fake(lambda p: REF[p[0]])
    bad_text = fake(lambda p: REF[p[0]][:2] + [99] + REF[p[0]][3:])
    return [
        B.Config("classic", "classic", runner=fake(lambda p: REF[p[0]], rounds=4)),
        B.Config("chain b=3", "chain", block=3, budget=2, runner=good, shapes=[(-1, 0, 1)]),
        B.Config("conf n=2", "confidence", budget=2, runner=bad_text, shapes=[(-1, 0, 0)]),
        B.Config("fixed [9]", "fixed", branching=(9,), budget=9, runner=good,
                 shapes=[("inexact",)]),
    ]


def staged_decide(model, shapes, allow_inexact=False):
    if shapes == [("inexact",)]:
        return Decision(False, False, "declined to classic decode: 1 of 1 shapes differ (staged)")
    return Decision(True, True, "probe passed (staged)")


@pytest.fixture(scope="module")
def staged():
    return B.bench(None, None, [[0], [1]], staged_configs(),
                   B.BenchOptions(max_tokens=4, repeats=3), decide=staged_decide)


def test_a_failing_probe_prints_no_figure_only_its_reason(staged):
    row = next(r for r in staged["rows"] if r["name"] == "fixed [9]")
    assert row["exact"] is False and row["reason"].startswith("probe: declined")
    assert "tok_s" not in row
    line = next(ln for ln in R.format_table(staged).splitlines() if ln.startswith("fixed [9]"))
    assert "GATED" in line and "staged" in line and "probe+text" not in line


def test_a_text_diff_against_classic_prints_no_figure_only_where_it_differs(staged):
    row = next(r for r in staged["rows"] if r["name"] == "conf n=2")
    assert row["exact"] is False
    assert row["reason"] == ("text: tokens differ from classic on prompt 0 at token 2 "
                             "(got 99, classic 7; repeat 0)")
    assert "tok_s" not in row
    line = next(ln for ln in R.format_table(staged).splitlines() if ln.startswith("conf n=2"))
    assert "GATED" in line and "token 2" in line


def test_a_passing_configuration_says_which_checks_stand_behind_its_figure(staged):
    row = next(r for r in staged["rows"] if r["name"] == "chain b=3")
    assert row["exact"] and row["checks"] == "probe+text" and row["tok_s"] > 0
    assert len(row["tok_s_all"]) == 3
    line = next(ln for ln in R.format_table(staged).splitlines() if ln.startswith("chain b=3"))
    assert "probe+text" in line
    classic = next(ln for ln in R.format_table(staged).splitlines() if ln.startswith("classic"))
    assert "reference" in classic


def paced(walls):
    """A runner returning classic's tokens, each repeat's two prompts in
    ``walls[r]`` seconds each, after the warm-up's two untimed calls."""
    calls = iter([walls[0]] * 2 + [w for w in walls for _ in range(2)])
    good = fake(lambda p: REF[p[0]])

    def runner(*args):
        run = good(*args)
        run.wall_s = next(calls)
        return run
    return runner


def test_auto_is_set_against_the_best_row_and_its_choice_against_its_own_row():
    """auto's row against the fastest other row, and, where the table times
    the configuration auto chose, that row against the fastest (was the
    choice the best?) and auto's row against it (one configuration timed
    twice: the run's spread), each the median of per-repeat ratios,
    recomputed here from the paces the runs were given."""
    walls = {"classic": [0.04] * 3, "chain b=3": [0.010, 0.012, 0.011],
             "chain b=5": [0.009, 0.013, 0.010], "auto": [0.011, 0.011, 0.012]}
    auto = B.auto_config({"mode": "chain", "block": 3, "budget": 2, "branching": None,
                          "width": None, "reason": "r"})
    auto.runner, auto.shapes = paced(walls["auto"]), [(-1, 0, 1)]
    configs = [B.Config("classic", "classic", runner=paced(walls["classic"])),
               B.Config("chain b=3", "chain", block=3, budget=2, runner=paced(walls["chain b=3"]),
                        shapes=[(-1, 0, 1)]),
               B.Config("chain b=5", "chain", block=5, budget=4, runner=paced(walls["chain b=5"]),
                        shapes=[(-1, 0, 1)]),
               auto]
    report = B.bench(None, None, [[0], [1]], configs, B.BenchOptions(max_tokens=4, repeats=3),
                     decide=staged_decide)
    row = next(r for r in report["rows"] if r["kind"] == "auto")

    def ratio(a, b):  # per repeat, both prompts of a repeat at one pace
        return statistics.median(wb / wa for wa, wb in zip(walls[a], walls[b]))
    assert row["best_row"] == "chain b=5" and row["same_as"] == "chain b=3"
    assert row["x_best_row"] == pytest.approx(ratio("auto", "chain b=5"))
    assert row["chosen_x_best_row"] == pytest.approx(ratio("chain b=3", "chain b=5"))
    assert row["x_same"] == pytest.approx(ratio("auto", "chain b=3"))
    line = R.auto_line(report)
    assert line.startswith(f"auto (chain b=3): {ratio('auto', 'chain b=5'):.2f}x the best row "
                           "(chain b=5)") and "chain b=3, ran " in line, line


def test_round_statistics_and_speedups_are_aggregated_over_prompts(staged):
    row = next(r for r in staged["rows"] if r["name"] == "chain b=3")
    assert row["tokens"] == 7 and row["rounds"] == 4
    assert row["emitted_per_verify"] == 7 / 4 and row["acceptance"] == 0.5
    assert row["per_depth_acceptance"] == [1.0, 0.0]
    assert row["ms_per_round"]["verify"] == pytest.approx(2.0 / 2)
    # no model, no prefill: decode tok/s is end to end here
    assert row["decode_tok_s"] == row["tok_s"] == pytest.approx(7 / 0.02)
    assert staged["prefill_ms"] == [{"target": 0.0, "draft": 0.0}] * 2
    # equal walls per run: classic and chain emit the same tokens in the same time
    assert row["x_classic"] == pytest.approx(1.0)
    assert row["x_best_chain"] == pytest.approx(1.0)
    assert staged["best_chain"] == "chain b=3"


def allowing_decide(model, shapes, allow_inexact=False):
    """staged_decide, honouring --allow-inexact as treespec.evidence.gate.decide does."""
    if shapes == [("inexact",)]:
        return Decision(allow_inexact, False, "1 of 1 shapes differ (staged)")
    return Decision(True, True, "probe passed (staged)")


def test_allow_inexact_times_past_a_failed_check_and_labels_the_figure():
    report = B.bench(None, None, [[0], [1]], staged_configs(),
                     B.BenchOptions(max_tokens=4, repeats=2, allow_inexact=True),
                     decide=allowing_decide)
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["conf n=2"]["checks"] == "INEXACT:t" and rows["conf n=2"]["tok_s"] > 0
    assert "token 2" in rows["conf n=2"]["text_diff"]
    assert rows["fixed [9]"]["checks"] == "INEXACT:p" and rows["fixed [9]"]["tok_s"] > 0
    assert rows["chain b=3"]["checks"] == "probe+text"
    text = R.format_report(report)
    for name in ("conf n=2", "fixed [9]"):
        line = next(ln for ln in text.splitlines() if ln.startswith(name))
        assert "INEXACT" in line and "probe+text" not in line
    assert "not an exact figure" in text


class WorkClock:
    """A clock that only moves when the bench does work: every probe and
    every run costs one second. Records when each run started."""

    def __init__(self):
        self.now, self.starts = 0.0, []

    def __call__(self):
        return self.now

    def runner(self, inner, name):
        def run(*args):
            self.starts.append((name, self.now))
            self.now += 1.0
            return inner(*args)
        return run

    def decide(self, model, shapes, allow_inexact=False):
        self.now += 1.0
        return staged_decide(model, shapes, allow_inexact)


def clocked(max_seconds, repeats=3):
    clock = WorkClock()
    configs = staged_configs()
    for c in configs:
        c.runner = clock.runner(c.runner, c.name)
    report = B.bench(None, None, [[0], [1]], configs,
                     B.BenchOptions(max_tokens=4, repeats=repeats, max_seconds=max_seconds),
                     decide=clock.decide, clock=clock)
    return report, clock, {r["name"]: r for r in report["rows"]}


@pytest.mark.parametrize("max_seconds", [0.5, 2.5, 9.5, 15.5, 1000])
def test_max_seconds_bounds_the_whole_bench_probes_and_warm_up_included(max_seconds):
    report, clock, rows = clocked(max_seconds)
    # Nothing starts past the limit but classic's first repeat (the reference).
    late = [(name, t) for name, t in clock.starts if t > max_seconds]
    assert all(name == "classic" for name, _ in late) and len(late) <= 2
    assert rows["classic"]["tok_s"] > 0
    for name in ("chain b=3", "conf n=2"):
        row = rows[name]
        assert row["skipped"] or row["probe"] is not None
    if max_seconds < 2:  # the third probe starts at 2 s: skipped, said so
        assert any("not probed: --max-seconds" in (r["skipped"] or "") for r in rows.values())
    if max_seconds < 1000:
        assert report["repeats"] < report["repeats_asked"] or not report["warmed_up"]
    else:
        assert report["repeats"] == 3 and report["warmed_up"] and not any(
            r["skipped"] for r in rows.values())
    text = R.format_report(report)
    for name, row in rows.items():
        if row["skipped"]:
            assert f"SKIPPED    {row['skipped']}" in text


def test_max_seconds_stops_between_repeats_and_says_how_many_ran():
    # probes 0-3 s, warm-up 3-9, repeat 0 9-14, repeat 1 from 14 until past 16.5
    report, _, rows = clocked(16.5)
    assert report["repeats"] == 2 and report["repeats_asked"] == 3
    assert len(rows["chain b=3"]["tok_s_all"]) == 2


def test_classic_must_come_first():
    configs = staged_configs()
    with pytest.raises(ValueError, match="classic"):
        B.bench(None, None, [[0]], configs[1:], B.BenchOptions(max_tokens=4, repeats=1),
                decide=staged_decide)


def test_plots_are_written(tmp_path, staged):
    pytest.importorskip("matplotlib")
    curve = [{"T": 1, "median_ms": 1.0, "ratio_to_T1": 1.0},
             {"T": 2, "median_ms": 1.5, "ratio_to_T1": 1.5}]
    written = R.write_plots(staged, tmp_path / "plots", curve)
    assert sorted(Path(p).name for p in written) == [
        "emitted_per_verify_vs_budget.png", "tok_s_vs_budget.png", "verify_cost_vs_T.png"]
    assert all(Path(p).stat().st_size > 1000 for p in written)


def test_plots_of_a_run_where_every_speculative_row_is_gated_say_so(tmp_path):
    pytest.importorskip("matplotlib")
    configs = [c for c in staged_configs() if c.name in ("classic", "fixed [9]")]
    report = B.bench(None, None, [[0]], configs, B.BenchOptions(max_tokens=4, repeats=1),
                     decide=staged_decide)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns of a legend with nothing in it
        written = R.write_plots(report, tmp_path, None)
    assert len(written) == 2


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["bench", "--plot", "somewhere"]) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_model_without_draft_model_is_refused(capsys):
    target, _ = default_pair()
    assert cli.main(["bench", "--model", str(target)]) == 2
    assert "--draft-model" in capsys.readouterr().err


def test_scaled_with_a_checkpoint_is_refused(capsys):
    target, draft = default_pair()
    assert cli.main(["bench", "--scaled", "128x4", "--model", str(target),
                     "--draft-model", str(draft)]) == 2
    assert "--scaled builds its own pair" in capsys.readouterr().err


@pytest.mark.parametrize("flags,says", [
    (["--scaled", "64x2"], "--draft-layers must be in 1..1 for --scaled 64x2"),
    (["--scaled", "128x4", "--alpha", "0"], "--alpha must be in (0, 1], got 0"),
    (["--scaled", "96x4", "--bits", "4"], "--scaled's hidden size must be a multiple of 64, got 96"),
    (["--bits", "4"], "--bits quantizes the --scaled pair"),
    (["--scaled-dtype", "float32"], "--scaled-dtype sets the --scaled pair's dtype"),
], ids=["draft layers", "alpha", "bits group", "bits without scaled", "dtype without scaled"])
def test_a_scaled_pair_that_cannot_be_built_is_refused_before_building(capsys, flags, says):
    assert cli.main(["bench", *flags]) == 2
    assert says in capsys.readouterr().err


def test_a_scaled_pair_is_built_in_the_dtype_asked_for():
    out = subprocess.run(
        [sys.executable, "-m", "treespec", "bench", "--scaled", "128x4", "--scaled-dtype",
         "float32", "--prompts", "1", "--max-tokens", "4", "--repeats", "1", "--blocks", "2",
         "--trees", "", "--no-auto", "--no-mlx-lm", "--no-confidence", "--json"],
        cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["model"].startswith("scaled llama 128x4 float32 "), report["model"]
    assert [r["name"] for r in report["rows"]] == ["classic", "chain b=2"]


# ----------------------------------------------------------------------------- the real paths


@pytest.fixture(scope="module")
def pair():
    return load_default_pair()


@pytest.mark.slow
def test_a_small_bench_on_the_trained_pair_passes_every_check(pair):
    target, draft, tok = pair
    configs = B.build_configs([3], [(2, 1), (-1, 0, 0, 1, 1)], batch_levels=True)
    prompts = [tok.encode(B.PROMPTS[0])]
    report = B.bench(target, draft, prompts, configs,
                     B.BenchOptions(max_tokens=10, repeats=1, eos=list(tok.eos_token_ids),
                                    warmup_tokens=2))
    rows = {r["name"]: r for r in report["rows"]}
    assert set(rows) == {"classic", "chain b=3", "fixed [2,1]", "fixed [2,1] rows",
                         "fixed p[-1,0,0,1,1]", "conf n=2", "mlx-lm b=3"}
    for name, r in rows.items():
        if not r["exact"]:
            # Only where the census measures the backend inexact: a row is then timed
            # only if its own probe and text diff passed, else gated saying why.
            assert not exact_backend(), (name, r["reason"], census_line())
            assert r["reason"].startswith(("probe:", "text:")), (name, r)
            continue
        assert r["tokens"] == 10 and r["decode_tok_s"] > r["tok_s"] > 0
        assert name == "classic" or r["checks"] == "probe+text", (name, r)
    assert rows["classic"]["exact"]
    assert all(p["target"] > 0 and p["draft"] > 0 for p in report["prefill_ms"])
    # mlx-lm's rounds, recovered from from_draft, add up like treespec's
    m = rows["mlx-lm b=3"]
    if m["exact"]:
        assert m["rounds"] >= 1 and m["acceptance"] is not None
        assert 1.0 <= m["emitted_per_verify"] <= 3.0
    if rows["chain b=3"]["exact"]:
        assert rows["chain b=3"]["ms_per_round"].keys() >= {"draft", "verify", "walk", "commit"}


@pytest.mark.slow
def test_bench_command_json(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "treespec", "bench", "--prompts", "1", "--max-tokens", "4",
         "--repeats", "1", "--blocks", "2", "--trees", "", "--no-auto", "--json"],
        cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [r["name"] for r in report["rows"]] == ["classic", "chain b=2", "conf n=1",
                                                   "mlx-lm b=2"]
    assert report["machine"]["blas"].startswith("BLAS:")
    assert "mlx" in report["machine"] and "git" in report["machine"]
    assert all(r["exact"] or (not exact_backend() and r["reason"].startswith(("probe:", "text:")))
               for r in report["rows"]), report["rows"]


def test_a_width_or_batch_levels_with_nothing_to_act_on_is_refused_naming_it():
    """--width shapes confidence trees: with their rows and auto's calibration
    both left out it would act on nothing, so the command refuses it (before
    building any pair), while either alone keeps it meaningful. So is
    --batch-levels where no tree of --trees has a level to batch."""
    def bench_cli(*flags):
        return subprocess.run([sys.executable, "-m", "treespec", "bench", *flags, "--prompts=0"],
                              cwd=ROOT, capture_output=True, text=True)
    refused = bench_cli("--no-confidence", "--no-auto", "--width", "3")
    assert refused.returncode == 2 and "--width" in refused.stderr \
        and "--no-confidence" in refused.stderr, refused.stderr
    # without --no-auto the width reaches auto: the run goes on to the next check
    went_on = bench_cli("--no-confidence", "--width", "3")
    assert went_on.returncode == 2 and "--prompts must be" in went_on.stderr, went_on.stderr
    # --batch-levels where no tree of --trees has a level of several fed nodes
    refused = bench_cli("--batch-levels", "--trees=-1,0,0,1,1 1,1,2")
    assert refused.returncode == 2 and "--batch-levels: no tree of --trees" in refused.stderr
    went_on = bench_cli("--batch-levels", "--trees=-1,0,0,1,1 2,1")
    assert went_on.returncode == 2 and "--prompts must be" in went_on.stderr, went_on.stderr


def test_the_shared_probe_reports_a_nan_difference_as_nan(monkeypatch):
    """A shape whose verify gave NaN is the worst difference, never hidden
    behind a finite one by max()."""
    diffs = {(-1,): float("nan"), (-1, 0): 0.5}
    monkeypatch.setattr(shared_probe, "compare_shape",
                        lambda model, shape, draws, adapter=None: ShapeResult(
                            shape, False, diffs[shape], 0, 0, draws))
    d = SharedProbe()(zoo.build("llama"), [(-1, 0), (-1,)])
    assert not d.run and "max |diff| nan" in d.reason, d.reason
