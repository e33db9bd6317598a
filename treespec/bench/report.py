"""`treespec bench`'s report: the machine it ran on, the table, the treespec-vs-mlx-lm
comparison, the verify cost curve and the PNGs; and ``summarize``, which turns the raw
timed runs of ``treespec.bench.measure.bench`` into that report. Nothing here runs a model."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence

import mlx.core as mx
import mlx_lm

from ..backend.blas import describe, detect
from ..backend.cuda import describe as describe_attention
from ..draft import shape_name

EXACT = "probe+text"


def _merge(stats_list: Sequence[dict]) -> dict:
    out = {"rounds": 0, "proposed": 0, "accepted": 0, "emitted": 0,
           "depth_accepted": [], "depth_reached": [], "time_ms": None}
    for s in stats_list:
        for k in ("rounds", "proposed", "accepted", "emitted"):
            out[k] += s[k]
        for k in ("depth_accepted", "depth_reached"):
            cur = out[k]
            cur += [0] * (len(s[k]) - len(cur))
            for i, v in enumerate(s[k]):
                cur[i] += v
        if s.get("time_ms") is not None:
            tm = out["time_ms"] or {}
            for k, v in s["time_ms"].items():
                tm[k] = tm.get(k, 0.0) + v
            out["time_ms"] = tm
    return out


def summarize(rows: dict, configs: Sequence, prompts, max_tokens, repeats) -> dict:
    """Medians, acceptance and speedups from the raw runs."""
    out = []
    for c in configs:
        row = rows[c.name]
        res = {k: row[k] for k in ("name", "kind", "block", "budget", "branching", "exact",
                                   "checks", "reason", "probe")}
        res["skipped"] = row.get("skipped")
        res["text_diff"] = row.get("text_diff")
        if c.kind == "auto":
            res["choice"] = {k: v for k, v in (c.choice or {}).items() if k != "details"}
        if row["exact"] and row["runs"]:
            tok_s = [sum(len(x.tokens) for x in runs) / w for runs, w in zip(row["runs"], row["wall"])]
            res["tok_s"] = statistics.median(tok_s)
            res["tok_s_all"] = tok_s
            dec = [sum(len(x.tokens) for x in runs) / w
                   for runs, w in zip(row["runs"], row["decode"])]
            res["decode_tok_s"] = statistics.median(dec)
            res["decode_all"] = dec
            res["tokens"] = sum(len(x.tokens) for x in row["runs"][0])
            cpu = [1e3 * sum(x.cpu_s for x in runs) / sum(len(x.tokens) for x in runs)
                   for runs in row["runs"] if all(x.cpu_s is not None for x in runs)]
            res["cpu_ms_per_token"] = statistics.median(cpu) if cpu else None
            res["cpu_all"] = cpu
            st = _merge([x.stats for x in row["runs"][0]]) if row["runs"][0][0].stats else None
            if st and c.speculative:
                res["rounds"] = st["rounds"]
                res["acceptance"] = st["accepted"] / st["proposed"] if st["proposed"] else None
                res["emitted_per_verify"] = (res["tokens"] / st["rounds"]) if st["rounds"] else None
                res["per_depth_acceptance"] = [a / n if n else None for a, n in
                                               zip(st["depth_accepted"], st["depth_reached"])]
                res["mean_nodes"] = 1 + st["proposed"] / st["rounds"] if st["rounds"] else None
                # ms per round, median over repeats, per part
                parts = {}
                for runs, wall in zip(row["runs"], row["wall"]):
                    m = _merge([x.stats for x in runs])
                    if m["time_ms"]:
                        for k in ("draft", "verify", "walk", "commit"):
                            parts.setdefault(k, []).append(m["time_ms"][k] / m["rounds"])
                    parts.setdefault("round", []).append(wall * 1e3 / m["rounds"])
                res["ms_per_round"] = {k: statistics.median(v) for k, v in parts.items()}
            elif not c.speculative:
                res["ms_per_token"] = statistics.median(
                    w * 1e3 / sum(len(x.tokens) for x in runs)
                    for runs, w in zip(row["runs"], row["wall"]))
        out.append(res)
    # Speedups: medians of per-repeat ratios (the runs of one repeat are interleaved).
    by = {r["name"]: r for r in out}
    base = by[configs[0].name]
    # On decode tok/s: the speed a long generation sees (prefill is one-off).
    chains = [r for r in out if r["kind"] == "chain" and r.get("tok_s")]
    best_chain = max(chains, key=lambda r: r["decode_tok_s"]) if chains else None
    for r in out:
        if not r.get("tok_s"):
            continue
        if base.get("decode_all"):
            r["x_classic"] = _per_repeat(r, base)
        if best_chain:
            r["x_best_chain"] = _per_repeat(r, best_chain)
    auto_against_rows(out, configs)
    return {"rows": out, "best_chain": best_chain["name"] if best_chain else None,
            "prompts": len(prompts), "max_tokens": max_tokens, "repeats": repeats}


def _per_repeat(a: dict, b: dict) -> float:
    """Median over repeats of a's decode tok/s over b's in the same repeat."""
    return statistics.median(x / y for x, y in zip(a["decode_all"], b["decode_all"]))


def auto_against_rows(out: list, configs: Sequence) -> None:
    """On auto's row: how it ran against the best other row (``x_best_row``,
    ``best_row``); and, where the table also times the configuration auto
    chose (same decode options, not mlx-lm's), that row's name
    (``same_as``), how that row ran against the best row
    (``chosen_x_best_row``: whether the choice was the best) and auto's row
    against it (``x_same``: two timings of one configuration in one run, the
    run's spread between identical rows). Per-repeat ratios, as every
    speedup."""
    timed = [(r, c) for r, c in zip(out, configs) if r.get("decode_all")]
    for r, c in timed:
        if r["kind"] != "auto":
            continue
        others = [(o, oc) for o, oc in timed if o["kind"] != "auto"]
        if not others:
            return
        best = max(others, key=lambda t: t[0]["decode_tok_s"])[0]
        r["best_row"], r["x_best_row"] = best["name"], _per_repeat(r, best)
        want = c.decode_kwargs()
        same = next((o for o, oc in others if o["kind"] != "mlx-lm"
                     and oc.decode_kwargs() == want), None)
        if same is not None:
            r["same_as"], r["x_same"] = same["name"], _per_repeat(r, same)
            r["chosen_x_best_row"] = _per_repeat(same, best)


def auto_line(report: dict) -> str:
    """auto against the best row, and its choice's own row against it."""
    r = next((r for r in report["rows"] if r["kind"] == "auto" and r.get("best_row")), None)
    if r is None:
        return ""
    line = f"{r['name']}: {r['x_best_row']:.2f}x the best row ({r['best_row']})"
    if r.get("same_as"):
        chosen = ("is the best row" if r["same_as"] == r["best_row"] else
                  f"ran {r['chosen_x_best_row']:.2f}x it")
        line += (f"; the row of the configuration it chose, {r['same_as']}, {chosen}; auto's "
                 f"row ran {r['x_same']:.2f}x that row, the same configuration timed twice in "
                 "this run (this run's spread between identical rows)")
    return line + " (medians of per-repeat decode tok/s ratios)."


def machine_info() -> dict:
    info = {"mlx": mx.__version__, "device": str(mx.default_device()),
            "python": platform.python_version(), "cpus": os.cpu_count()}
    info["mlx_lm"] = mlx_lm.__version__
    try:
        b = detect()
        info["blas"], info["blas_key"] = describe(b), b.key()
    except Exception as e:  # detection must never stop a bench
        info["blas"] = f"BLAS: unknown ({type(e).__name__}: {e})"
    # A copied working tree (a device's) may carry a stale .git: the runner
    # names the commit it copied.
    info["git"] = (os.environ.get("TREESPEC_COMMIT")
                   or _git_commit(Path(__file__).resolve().parent.parent))
    if attention := describe_attention():
        info["attention"] = attention
    try:
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def _git_commit(root: Path) -> str:
    """The checkout's short commit, '+dirty' with uncommitted tracked changes,
    or 'unknown' (no git, not a checkout)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _f(v, fmt="{:.2f}", none="-"):
    return none if v is None else fmt.format(v)


def format_table(report: dict) -> str:
    # as wide as the longest name: parent lists of deep spines differ only at their ends
    w = max([26] + [len(r["name"]) for r in report["rows"]])
    head = (f"{'config':<{w}} {'exact':<11} {'accept':>6} {'emit/v':>6} {'nodes':>5} "
            f"{'draft':>6} {'verify':>6} {'walk':>5} {'commit':>6} {'round':>6} "
            f"{'tok/s':>7} {'decode':>7} {'x clas':>6} {'x chain':>7} {'cpu/tok':>7}")
    lines = [head, f"{'':<{w}} {'':<11} {'':>6} {'':>6} {'':>5} "
             f"{'-- ms per verify round (median) --':^34} {'e2e':>7} {'tok/s':>7} {'':>6} "
             f"{'':>7} {'ms':>7}"]
    for r in report["rows"]:
        name = r["name"]
        if r.get("skipped"):
            lines.append(f"{name:<{w}} SKIPPED    {r['skipped']}")
            continue
        if not r["exact"]:
            lines.append(f"{name:<{w}} GATED      {r['reason']}")
            continue
        if r.get("tok_s") is None:
            lines.append(f"{name:<{w}} {'-':<11} no runs")
            continue
        ms = r.get("ms_per_round") or {}
        checks = f"exact: {r['checks']}" if r["checks"] == EXACT else r["checks"]
        if r.get("ms_per_token") is not None:  # classic: one "round" per token
            ms = {"verify": r["ms_per_token"], "round": r["ms_per_token"]}
        lines.append(
            f"{name:<{w}} {checks:<11} {_f(r.get('acceptance'), '{:.3f}'):>6} "
            f"{_f(r.get('emitted_per_verify') or (1.0 if r['kind'] == 'classic' else None)):>6} "
            f"{_f(r.get('mean_nodes') or (1.0 if r['kind'] == 'classic' else None), '{:.1f}'):>5} "
            f"{_f(ms.get('draft')):>6} {_f(ms.get('verify')):>6} {_f(ms.get('walk')):>5} "
            f"{_f(ms.get('commit')):>6} {_f(ms.get('round')):>6} {r['tok_s']:>7.1f} "
            f"{r['decode_tok_s']:>7.1f} "
            f"{_f(r.get('x_classic')):>6} {_f(r.get('x_best_chain')):>7} "
            f"{_f(r.get('cpu_ms_per_token')):>7}")
    return "\n".join(lines).replace("exact: probe+text", "probe+text ")


def format_report(report: dict) -> str:
    out = [format_table(report)]
    out.append("exact column: 'probe+text' = the exactness probe passed and every run's tokens "
               "equal classic's on every prompt, in this run (contract 10).")
    inexact = [r for r in report["rows"] if str(r.get("checks", "")).startswith("INEXACT")]
    if inexact:
        out.append("INEXACT (--allow-inexact): timed past a failed check, not an exact figure; "
                   "p = the probe found logits differing from single-token steps, t = the text "
                   "differed from classic's (first: "
                   + next((r["text_diff"] for r in inexact if r.get("text_diff")), "none") + ").")
    if report.get("warmed_up") is False:
        out.append("warm-up cut short by --max-seconds: some configurations' first timed runs "
                   "ran cold.")
    pf = report.get("prefill_ms") or []
    pf_txt = ", ".join(f"{p['target']:.0f}+{p['draft']:.0f}" for p in pf)
    out.append("tok/s: end to end (prefill included), median over repeats. decode tok/s: the same "
               "runs less the prefill of each prompt, measured apart (target ms + draft ms: "
               f"{pf_txt}; the draft's only for speculative rows). x clas / x chain: medians of "
               "per-repeat decode tok/s ratios to classic / to the best chain "
               f"({report.get('best_chain')}). round: wall ms per verify round, prefill included. "
               "mlx-lm rows: no split. cpu/tok: process CPU ms per token (median), less at the "
               "mercy of other processes than tok/s.")
    if line := auto_line(report):
        out.append(line)
    check = calibration_check(report)
    if check:
        out.append(check)
    if cmp := format_chain_vs_mlx_lm(report):
        out.append(cmp)
    return "\n".join(out)


# auto's predictions are from the fastest calibration repeat, so a timed row a little under its
# prediction is normal; far under it, the timed rows ran slower than the same configuration outside
# the bench (docs/numerics.md#tf32-and-cudnn-attention-on-cuda: cuDNN attention's graph builds did
# that).
SUSPECT_BELOW = 0.7


def calibration_check(report: dict) -> str:
    """A warning when auto's row ran far slower than auto's own calibration
    predicted for the same configuration minutes earlier in this process:
    the timed runs then do not measure what the calibration did."""
    for r in report["rows"]:
        choice = r.get("choice") or {}
        if r["kind"] != "auto" or not r.get("decode_tok_s"):
            continue
        chosen = r["name"][len("auto ("):-1]
        predicted = next((c["tok_s"] for c in choice.get("predicted") or []
                          if c.get("name") == chosen), None)
        if predicted and r["decode_tok_s"] < SUSPECT_BELOW * predicted:
            return (f"WARNING: {r['name']} ran {r['decode_tok_s']:.1f} decode tok/s, "
                    f"{r['decode_tok_s'] / predicted:.2f}x what auto's calibration predicted for "
                    f"{chosen} ({predicted:.1f}) in this process: the timed runs are much slower "
                    "than the calibration's; read every figure above with care.")
    return ""


class Matched(NamedTuple):
    """treespec's chain against mlx-lm's at one block (``chain_vs_mlx_lm``)."""

    block: int
    ours: float  # decode tok/s, median over repeats
    theirs: float
    ratio: float  # ours over theirs, median of per-repeat ratios
    cpu_ratio: Optional[float]  # their CPU ms per token over ours (> 1: ours cheaper)
    rounds: Optional[int]  # verify rounds over the prompts
    their_rounds: Optional[int]
    round_cost: Optional[float]  # our decode ms per round over theirs, median of per-repeat ratios


def chain_vs_mlx_lm(report: dict) -> List[Matched]:
    """Each block both decoders ran at. The same text can take a different
    number of rounds (the two chains draft by different argmax rules, docs/drafting.md#the-chain),
    so beside the speed ratio: both round counts and what a round costs, each decoder's decode time
    over its rounds."""
    by = {(r["kind"], r["block"]): r for r in report["rows"]}
    out = []
    for (kind, b), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if kind != "chain" or not r.get("tok_s"):
            continue
        m = by.get(("mlx-lm", b))
        if m and m.get("tok_s"):
            ratio = statistics.median(a / c for a, c in zip(r["decode_all"], m["decode_all"]))
            cpu = None
            if r.get("cpu_all") and m.get("cpu_all"):
                cpu = statistics.median(c / a for a, c in zip(r["cpu_all"], m["cpu_all"]))
            rounds, theirs = r.get("rounds"), m.get("rounds")
            cost = None
            if rounds and theirs:
                # decode ms per round = tokens / decode tok/s / rounds, per repeat
                cost = statistics.median(
                    (r["tokens"] / a / rounds) / (m["tokens"] / c / theirs)
                    for a, c in zip(r["decode_all"], m["decode_all"]))
            out.append(Matched(b, r["decode_tok_s"], m["decode_tok_s"], ratio, cpu, rounds,
                               theirs, cost))
    return out


def format_chain_vs_mlx_lm(report: dict) -> str:
    """The lines of ``chain_vs_mlx_lm`` ('' where no block has both)."""
    cmp = chain_vs_mlx_lm(report)
    if not cmp:
        return ""
    out = ["\ntreespec chain vs mlx-lm at the same block (decode tok/s; medians of per-repeat "
           "ratios; cpu ratio = mlx-lm CPU ms/token over treespec's, > 1 when treespec is "
           "cheaper; rounds over the prompts, treespec/mlx-lm, and treespec's decode ms per "
           "round over mlx-lm's: what a round costs, apart from how many the drafts took):"]
    for m in cmp:
        flag = "" if m.ratio >= 0.97 else "   <- treespec slower (wall)"
        rounds = ("" if m.round_cost is None else
                  f"  rounds {m.rounds}/{m.their_rounds}, a round {m.round_cost:.2f}x")
        out.append(f"  b={m.block}: treespec {m.ours:7.1f} tok/s  mlx-lm {m.theirs:7.1f} tok/s  "
                   f"ratio {m.ratio:.2f}  cpu ratio {_f(m.cpu_ratio)}{rounds}{flag}")
    return "\n".join(out)


def format_curve(rows: List[dict], label: str) -> str:
    lines = [f"verify cost curve ({label}): one target forward over T tokens, context 64, "
             f"median and min of 7",
             f"{'T':>4} {'median ms':>10} {'x T=1':>7} {'min ms':>8} {'x T=1':>7}"]
    m1 = rows[0].get("min_ms") or 1.0
    for r in rows:
        mn = r.get("min_ms")
        lines.append(f"{r['T']:>4} {r['median_ms']:>10.2f} {r['ratio_to_T1']:>7.2f} "
                     f"{_f(mn):>8} {_f(mn / m1 if mn else None):>7}")
    return "\n".join(lines)


def write_plots(report: dict, directory, curve=None) -> List[str]:
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib, which is not installed: "
                           "pip install matplotlib (or the project's 'plot' extra)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    rows = [r for r in report["rows"] if r.get("tok_s")]
    series = {"chain": ("treespec chain", "o-"), "confidence": ("confidence tree", "s-"),
              "mlx-lm": ("mlx-lm chain", "^--"), "fixed": ("fixed tree", "D")}
    m = report.get("machine", {})
    title = (f"{m.get('blas_key', '?')}, mlx {m.get('mlx', '?')}, git {m.get('git', '?')}; "
             f"{report.get('prompts')} prompts x {report.get('max_tokens')} tokens, "
             f"median of {report.get('repeats')}")
    for metric, ylabel, fname in (("decode_tok_s", "decode tokens / s (median; prefill excluded)",
                                   "tok_s_vs_budget.png"),
                                  ("emitted_per_verify", "emitted per verify",
                                   "emitted_per_verify_vs_budget.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for kind, (label, style) in series.items():
            pts = sorted((r["budget"], r[metric]) for r in rows
                         if r["kind"] == kind and r.get(metric) is not None)
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        for r in rows:
            if r["kind"] == "fixed" and r.get(metric) is not None:
                ax.annotate(shape_name(r["branching"]), (r["budget"], r[metric]), fontsize=7)
            if r["kind"] == "auto" and r.get(metric) is not None:
                ax.plot([r["budget"]], [r[metric]], "*", markersize=14, label=r["name"])
        classic = next((r for r in rows if r["kind"] == "classic"), None)
        if classic and metric == "decode_tok_s":
            ax.axhline(classic["decode_tok_s"], color="gray", ls=":", label="classic")
        ax.set_xlabel("draft nodes per verify (node budget; chain block - 1)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:  # every speculative row gated (the trained pair on the H200)
            ax.text(0.5, 0.5, "no speculative configuration passed the gate:\nsee the table",
                    transform=ax.transAxes, ha="center", va="center")
        fig.tight_layout()
        fig.savefig(d / fname, dpi=110)
        plt.close(fig)
        written.append(str(d / fname))
    if curve:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ts = [r["T"] for r in curve]
        ax.plot(ts, [r["median_ms"] for r in curve], "o-", label="median")
        if all("min_ms" in r for r in curve):
            ax.plot(ts, [r["min_ms"] for r in curve], ".--", alpha=0.6, label="min")
        c1 = curve[0]["median_ms"]
        top = max(r["median_ms"] for r in curve)
        ax.plot(ts, [c1 * t for t in ts], ":", color="gray", label="T x cost(1) (linear)")
        ax.set_ylim(0, top * 1.3)
        ax.set_xlabel("T (tokens in one target forward)")
        ax.set_ylabel("ms")
        ax.set_title(f"one target forward over T tokens, context 64; "
                     f"{m.get('blas_key', '?')}, mlx {m.get('mlx', '?')}", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(d / "verify_cost_vs_T.png", dpi=110)
        plt.close(fig)
        written.append(str(d / "verify_cost_vs_T.png"))
    return written
