"""Running the audit: every property by name, the report and its text."""

import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Sequence

import mlx.core as mx
import mlx_lm

from ..backend import blas
from ..backend.census import WIDTHS, Row, census, format_table, summary, to_json
from ..backend.census_child import isolated
from ..errors import TreeRefused
from ..evidence.gate import configuration
from .attribution import attributed, mlx_lm_failure
from .e2e_props import check_e2e, drafter_note
from .head_props import check_head_state
from .long_props import check_long_context
from .probe_props import check_envelope, check_probe
from .records import FAIL, INCONCLUSIVE, SKIP, Check, Options, Report
from .rollback_props import check_rollback
from .states import cache_modes
from .subject import cache_summary
from .subject import Subject, subject, the_adapter, the_walk
from .verify_props import check_adapter, check_linear_verify, check_tree_verify
from .walk_props import check_walk_linear, check_walk_siblings

PROPERTIES = (
    "adapter",
    "linear-verify",
    "tree-verify",
    "rollback",
    "walk-linear",
    "walk-siblings",
    "e2e",
    "envelope",
    "probe",
    "long-context",
)
# With --draft-head, after the others: the head's state after every round
# (treespec.audit.head_props); without a head there is nothing to compare.
HEAD_PROPERTIES = ("head-state",)


def _per_mode(fn):
    """One row per cache mode: a mode where mlx-lm alone fails says so
    (treespec.audit.attribution) instead of running treespec in it, and a
    crash in one mode is that mode's row; the other modes still run."""
    prop = fn.__name__[6:].replace('_', '-')

    def run(s: Subject) -> List[Check]:
        modes, why_not = cache_modes(s.model)
        out = []
        for m in modes:
            t0 = time.perf_counter()
            why = mlx_lm_failure(s, m)
            if why is not None:
                out.append(Check(status=SKIP, **attributed(prop, m, why)))
            else:
                try:
                    out.append(fn(s, m))
                except Exception as e:
                    out.append(_crashed(f"{prop}[{m.name}]", e))
            out[-1].seconds = time.perf_counter() - t0
        if why_not:
            out.append(Check(f"{prop}[kv-quant]", SKIP, f"n/a: {why_not}"))
        return out

    return run


def _crashed(name: str, e: Exception) -> Check:
    tb = traceback.extract_tb(e.__traceback__)[-1]
    return Check(name, FAIL, f"crashed: {type(e).__name__}: {e} ({Path(tb.filename).name}:{tb.lineno})",
                 {"message": f"{type(e).__name__}: {e}"})


CHECKS = {
    "adapter": check_adapter,
    "linear-verify": check_linear_verify,
    "tree-verify": _per_mode(check_tree_verify),
    "rollback": _per_mode(check_rollback),
    "walk-linear": check_walk_linear,
    "walk-siblings": check_walk_siblings,
    "e2e": check_e2e,
    "envelope": check_envelope,
    "probe": check_probe,
    "long-context": check_long_context,
    "head-state": check_head_state,
}
NEEDS_ADAPTER = {"linear-verify", "tree-verify", "rollback", "e2e", "envelope", "probe", "long-context",
                 "head-state"}


def properties_for(s: Subject) -> tuple:
    """What a full audit of ``s`` runs: every property, and the head's with a head."""
    return PROPERTIES + (HEAD_PROPERTIES if s.draft_head is not None else ())


def check(prop: str, s: Subject) -> List[Check]:
    """Run one property; its rows. A crash is a failure of that property."""
    if prop not in CHECKS:
        raise ValueError(f"unknown property {prop!r}; known: "
                         f"{', '.join(PROPERTIES + HEAD_PROPERTIES)}")
    t0 = time.perf_counter()
    if prop in NEEDS_ADAPTER:
        try:
            the_adapter(s)
        except TreeRefused:
            return [Check(prop, SKIP, "no adapter (see the adapter row)")]
    try:
        out = CHECKS[prop](s)
    except Exception as e:
        out = [_crashed(prop, e)]
    dt = time.perf_counter() - t0
    for c in out:
        c.seconds = c.seconds or dt / len(out)
    return out


def header(s: Subject) -> dict:
    cfg = configuration(s.model)
    try:
        adapter = repr(the_adapter(s))
    except TreeRefused as e:
        adapter = f"refused: {e.reason}"
    return {
        "model": s.name,
        "model_type": cfg["model_type"],
        "dtypes": cfg["dtypes"],
        "weight_quant": cfg["weight_quant"],
        "weights": cfg["weights"],
        "caches": cache_summary(s.model),
        "adapter": adapter,
        "adapter_source": s.adapter_source,
        "walk": the_walk(s)[1],
        "drafter": drafter_note(s),
        "blas": blas.describe(blas.detect()),
        "device": cfg["device"],
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "options": asdict(s.options),
    }


def backend_census(s: Subject) -> dict:
    """The census of the model's own shapes on this backend
    (treespec.backend.census) at 1..16 rows and the long-context trees' sizes:
    which of its ops a wider verify computes with other bits. In child
    processes where the model can be loaded again from its checkpoint (a
    kernel that crashes one costs its row, not the audit)."""
    widths = sorted(set(WIDTHS) | set(s.options.tree_nodes))
    try:
        rows = (census(s.model, widths=widths, seed=s.options.seed) if s.checkpoint is None
                else isolated(s.checkpoint, widths=widths, seed=s.options.seed))
    except Exception as e:  # the audit's other rows still stand
        return {"error": f"{type(e).__name__}: {e}", "rows": [], "summary": ""}
    return {"rows": to_json(rows), "summary": summary(rows)}


def run(s: Subject, properties: Optional[Sequence[str]] = None) -> Report:
    """The properties given, default ``properties_for(s)``."""
    t0 = time.perf_counter()
    properties = properties_for(s) if properties is None else properties
    checks = []
    for prop in properties:
        checks += check(prop, s)
    head = {**header(s), "census": backend_census(s)}
    return Report(head, checks, s._memo.get("probe"), time.perf_counter() - t0)


def audit(model_path, draft_path=None, adapter: Optional[str] = None,
          properties: Sequence[str] = PROPERTIES, **options) -> Report:
    """In-process ``treespec audit``: load, run, return the :class:`Report`."""
    return run(subject(model_path, draft_path, adapter, Options(**options)), properties)


def format_report(report: Report) -> str:
    h = report.header
    quant = f", {'/'.join(h['weight_quant'])} weights" if h["weight_quant"] else ""
    lines = [
        f"treespec audit: {h['model']}",
        f"  model    {h['model_type']} ({', '.join(d.removeprefix('mlx.core.') for d in h['dtypes'])}{quant}); "
        f"caches {h['caches']}",
        f"  adapter  {h['adapter']} from {h['adapter_source']}; walk {h['walk']}",
        f"  drafter  {h['drafter']}",
        f"  BLAS     {h['blas'].removeprefix('BLAS: ')}",
        f"  device   {h['device']}; mlx {h['mlx']}, mlx-lm {h['mlx_lm']}",
        "",
    ]
    width = max([len("property")] + [len(c.name) for c in report.checks])
    vw = max([len("verdict")] + [len(c.verdict) for c in report.checks])
    lines.append(f"{'property':<{width}}  {'verdict':<{vw}}  detail")
    lines.append(f"{'-' * width}  {'-' * vw}  {'-' * 6}")
    for c in report.checks:
        lines.append(f"{c.name:<{width}}  {c.verdict:<{vw}}  {c.detail}")
    if report.probe is not None and report.probe.shapes:
        lines += ["", report.probe.table()]
    if "census" in h:
        c = h["census"]
        rows = [Row(**{**r, "widths": tuple(r["widths"])}) for r in c["rows"]]
        lines += ["", "census: a row of an M-row call against that row alone"]
        lines += [format_table(rows)] if rows else []
        lines.append(c.get("error") or c["summary"])
    words = []
    for c in report.checks:
        if c.verdict not in words:
            words.append(c.verdict)
    summary = ", ".join(f"{sum(c.verdict == w for c in report.checks)} {w}" for w in words)
    if not report.ok:
        verdict = f"FAILED ({', '.join(report.failed())})"
    elif report.unverified():
        verdict = (f"NOT VERIFIED (every row of {', '.join(report.unverified())} skipped: "
                   "nothing of the model's verify or rollback was compared)")
    elif report.verdict == INCONCLUSIVE:
        verdict = "INCONCLUSIVE (" + ", ".join(c.name for c in report.checks if c.status == INCONCLUSIVE) + ")"
    else:
        verdict = "PASSED"
    lines += ["", f"{verdict}: {summary} in {report.seconds:.1f} s"]
    return "\n".join(lines)
