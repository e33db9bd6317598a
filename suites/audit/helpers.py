"""Reading `treespec audit`'s rows on every backend (docs/numerics.md#the-verdict-words).

A row that compares forwards (verify, rollback, e2e, ...) passes where the
regime is exact (``suites.helpers_numerics.exact_backend``); elsewhere it may
also be ``inconclusive`` (the negative controls did not separate from the
backend's envelope: CUDA), and then it carries its figures. Rows that compare
no forward (the adapter, the walks) pass on every backend. Rows are the
audit's ``--json`` dicts or its ``Check`` objects."""

from suites.helpers_numerics import exact_backend
from treespec.evidence import numerics
from treespec.audit.records import INCONCLUSIVE, PASS


def field(row, key: str):
    return row[key] if isinstance(row, dict) else getattr(row, key)


def line(row) -> str:
    return f"{field(row, 'name')}: {field(row, 'status')}: {field(row, 'detail')}"


def numeric_statuses() -> tuple:
    """What a row comparing forwards may say in this regime."""
    return (PASS,) if exact_backend() else (PASS, INCONCLUSIVE)


def assert_numeric_row(row, context: str = ""):
    """``row`` passed, or (off the exact regimes) is inconclusive with its
    figures: the difference, the bound and the envelope it was judged by."""
    status, detail = field(row, "status"), field(row, "detail")
    assert status in numeric_statuses(), context or line(row)
    if status == INCONCLUSIVE:
        assert all(w in detail for w in ("max |diff|", "bound", "envelope")), line(row)


def rows_verdict(rows) -> numerics.Verdict:
    """The worst verdict of ``rows`` (those without one, skips, left out),
    naming the rows that gave it."""
    judged = [r for r in rows if field(r, "verdict") in numerics.WORDS]
    verdicts = [numerics.Verdict(field(r, "verdict"), field(r, "max_diff") or 0.0) for r in judged]
    w = numerics.worst(verdicts)
    named = [line(r) for r in judged if field(r, "verdict") == w.word]
    detail = "; ".join(named) if w.word != numerics.BIT_EXACT else f"{len(judged)} rows bit-exact"
    return numerics.Verdict(w.word, w.max_diff, detail=detail)
