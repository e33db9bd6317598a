"""The suite's verdict: per contract x family x dtype, one of bit-exact /
within envelope / declined by gate / inconclusive / FAIL, printed as a
terminal summary section at the end of every pytest run and written as JSON
with ``--verdict-json PATH`` (loaded by the root conftest.py).

A test hands each judged comparison to :func:`expect` (a
``treespec.evidence.numerics.Verdict`` and where it belongs); the records of one test
merge to the worst per (contract, family, dtype) and travel with its report
(``report.user_properties``), so they reach the controller under
pytest-xdist. An exactness test that records nothing (pure logic,
refusals, data movement asserted directly) is counted by its outcome:
passed = bit-exact, failed = FAIL, under the contract its folder names.
"""

import functools
import json
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import pytest

from treespec.evidence import numerics
from suites.goldens import GOLDEN_MISSING
from treespec.backend import census_child
from treespec.backend.blas import describe, regime

PROPERTY = "treespec-verdicts"

# Contracts named in the table (docs/contracts.md#the-verdict-table).
VERIFY = "verify: tree nodes = root-path forwards"
CHAIN = "verify: chain = mlx-lm chain verify"
KERNELS = "tree path kernels = plain forward"
ROLLBACK_ROWS = "rollback: kept rows = verify's rows"
ROLLBACK_DECODE = "rollback: decoding on = path-only cache"
E2E = "e2e: text = mlx_lm.generate"
GATE = "gate: decision = its probe"
HYBRID_LAYER = "hybrid: tree recurrence = path (mixer)"
DRAFTING = "drafting: device rounds = host rounds"
AUDIT = "audit"
SOUND = "backend: quantized products sound"
BACKEND_GAP = "backend: kernel exists"



@functools.lru_cache(maxsize=None)
def exact_backend() -> bool:
    """Whether this backend computes every multi-token forward bit-identical
    to single-token steps: measured, never named. The census
    (treespec.backend.census) runs each op the suite's models use (matmul,
    quantized matmul, attention with and without a mask, norms, RoPE, the
    recurrent kernels and conv) on its default shapes, in every dtype, and
    this is True only where no row of any M-row call differs from that row
    alone (or an op raised). Once per process (each xdist worker measures
    it: about a second here). There a backend fault is a regression, never a reason to
    withhold a verdict; elsewhere every comparison is judged against the
    envelope measured in the same run (docs/numerics.md#the-backend-census).

    Rows of a T=M recurrent call against M chained steps are not counted:
    mlx-lm's multi-token mamba2 SSM is another algorithm than its step (a
    chunked scan), different on every backend, the reference included; the
    tree path never runs it (its depths are T=1 batches, which are counted)
    and the families sweep pins, per family, where mlx-lm's chain does."""
    return not _differing()


def exact_dtype(dtype: str) -> bool:
    """:func:`exact_backend` for one dtype ("float16", ...): no census row of
    that dtype differs from its row alone (measured, as there)."""
    return not any(r.dtype == dtype for r in _differing())


@functools.lru_cache(maxsize=None)
def _differing() -> tuple:
    """The census rows that deny exactness: a row that differs from the row
    alone, or an op that could not run here (nothing measured is nothing
    proven). Measured in child processes (a kernel that crashes one is a row
    that could not run, not a crashed run: treespec.backend.census_child),
    under the session's plant if any (suites/census_child.py)."""
    return tuple(r for r in census_child.isolated(child="suites.census_child")
                 if (r.first_differs is not None or r.error) and r.how != "steps")


def census_line() -> str:
    """The census in a line: exact, or the first ops that differ."""
    rows = _differing()
    if not rows:
        return "census: every op row-invariant (an exact backend)"
    first = ", ".join(f"{r.op} {r.dtype} " + (f"from M={r.first_differs}" if r.first_differs
                                               else f"raised: {r.error}") for r in rows[:3])
    return f"census: {len(rows)} op rows differ ({first}{', ...' if len(rows) > 3 else ''})"

# Contracts of the tests that record nothing, by folder (or module).
_BY_MODULE = {"test_refusals": "refusals", "test_malformed": "refusals",
              "test_device_drafting": DRAFTING, "test_cache_commit": "rollback: cache-level commits"}
_BY_FOLDER = {
    "topology": "topology, masks, walks (pure logic)",
    "sampling": "sampling rule and laws",
    "rollback": "rollback: instruments",
    "hybrid": "hybrid: tree recurrence",
    "verify": "verify: instruments and hooks",
    "e2e": E2E,
    "regimes": GATE,
    "audit": AUDIT,
    "zoo": "zoo checkpoints",
    "blas": "BLAS detection",
    "numerics": "numerics: the rule",
    "plants": "plants: planted regressions caught",
}

_current = None  # the item whose call phase is running


def cfg_label(cfg) -> tuple:
    """(family, dtype) of a suite config tuple (family, dtype, bits[, kv_bits])."""
    family, dtype = cfg[0], cfg[1]
    bits = cfg[2] if len(cfg) > 2 else None
    kv = cfg[3] if len(cfg) > 3 else None
    return family, dtype + (f"-q{bits}" if bits else "") + (f"-kv{kv}" if kv else "")


def record(verdict: numerics.Verdict, contract: str, family: str = "-", dtype: str = "-"):
    """Add ``verdict`` to the running test's records (merged to the worst)."""
    item = _current
    if item is None:
        return
    store = next((v for k, v in item.user_properties if k == PROPERTY), None)
    if store is None:
        store = {}
        item.user_properties.append((PROPERTY, store))
    key = f"{contract}\x1f{family}\x1f{dtype}"
    old = store.get(key)
    new = verdict if old is None else numerics.worst([_from_json(old), verdict])
    store[key] = {**new.to_json(), "n": (old or {}).get("n", 0) + 1}


@contextmanager
def unrecorded():
    """Run suite checks without recording their verdicts: a planted
    regression's FAILs, provoked on purpose, are not this run's verdict
    (suites/planted.py)."""
    global _current
    saved, _current = _current, None
    try:
        yield
    finally:
        _current = saved


def _unsound(word: str, detail: str) -> bool:
    """An inconclusive verdict left so by the backend's own unsound products
    (treespec.evidence.verdicts.unsound), not by a contract that could not decide."""
    return word == numerics.INCONCLUSIVE and numerics.UNSOUND in detail


def expect(verdict: numerics.Verdict, contract: str, family: str = "-", dtype: str = "-"):
    """Record ``verdict``; fail the test on FAIL, skip it (with the figures)
    when inconclusive; return it otherwise. Inconclusive for unsound kernels
    (treespec.backend.soundness) is a FAIL on a backend measured exact."""
    if _unsound(verdict.word, verdict.detail) and exact_backend():
        verdict = numerics.Verdict(numerics.FAIL, verdict.max_diff, detail=(
            f"on {regime()}, measured exact by the census: {verdict.detail}"))
    record(verdict, contract, family, dtype)
    if verdict.word == numerics.FAIL:
        pytest.fail(f"{contract} [{family} {dtype}]: {verdict.detail}", pytrace=False)
    if verdict.word == numerics.INCONCLUSIVE:
        pytest.skip(f"inconclusive, {contract} [{family} {dtype}]: {verdict.detail}")
    return verdict


def _from_json(d: dict) -> numerics.Verdict:
    fields = {k: d.get(k) for k in ("word", "max_diff", "envelope", "bound", "control", "detail")}
    fields["max_diff"] = float("nan") if fields["max_diff"] is None else fields["max_diff"]
    return numerics.Verdict(**fields)


def _derived_contract(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    module = parts[-1].removesuffix(".py")
    folder = parts[-2] if len(parts) > 1 else ""
    return _BY_MODULE.get(module) or _BY_FOLDER.get(folder, folder or module)


@pytest.fixture(scope="session")
def envelope():
    """``treespec.evidence.numerics.envelope(model, context, widths, kv_bits, kv_group)``:
    the session's measured envelopes, keyed by model, cache mode, context
    bucket and widths (measured once per process, on first use). Judge with
    ``treespec.evidence.numerics.judge`` and record with :func:`expect`, or call
    ``suites.helpers_numerics.check``, which does all three."""
    return numerics.envelope


# -- hooks ------------------------------------------------------------------------


def pytest_addoption(parser):
    parser.addoption("--verdict-json", default=None, metavar="PATH",
                     help="write the treespec verdict table (per contract x family x dtype) as JSON")
    parser.addoption("--strict-verdicts", action="store_true",
                     help="fail the run (exit 1) when a contract row is inconclusive, a golden is "
                     "not recorded for this backend, or fewer rows than --min-proven are proven "
                     "(bit-exact or within envelope): green then means every contract concluded")
    parser.addoption("--min-proven", type=int, default=None, metavar="N",
                     help="with --strict-verdicts: the fewest verdict rows that must be proven")




_COLLECTOR = []


def pytest_configure(config):
    floor = config.getoption("--min-proven")
    if floor is not None and not config.getoption("--strict-verdicts"):
        raise pytest.UsageError("--min-proven: it is a floor of --strict-verdicts, which is off; "
                                "add --strict-verdicts or drop --min-proven")
    if floor is not None and floor < 0:
        raise pytest.UsageError(f"--min-proven {floor}: a count of rows, 0 or more")
    config._treespec_verdicts = _Collector()
    _COLLECTOR[:] = [config._treespec_verdicts]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    global _current
    _current = item
    try:
        yield
    finally:
        _current = None


def pytest_runtest_logreport(report):
    if _COLLECTOR:
        _COLLECTOR[0].add(report)


class _Collector:
    def __init__(self):
        self.rows = defaultdict(lambda: {"records": [], "tests": 0, "words": defaultdict(int)})
        self.skipped = 0
        self.goldens = defaultdict(int)  # golden_missing's message -> tests that said it

    def add(self, report):
        if "exactness" not in report.keywords:
            return
        recorded = next((v for k, v in report.user_properties if k == PROPERTY), None)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            missing = _golden_missing(report)
            if missing:
                self.goldens[missing] += 1
            if report.skipped and not recorded:
                self.skipped += 1
                return
            if not recorded:
                recorded = {f"{_derived_contract(report.nodeid)}\x1f-\x1f-": {
                    "word": numerics.BIT_EXACT, "max_diff": 0.0, "detail": "", "n": 1}}
            for key, rec in recorded.items():
                rec = dict(rec)
                if report.failed and rec["word"] != numerics.FAIL:
                    rec["word"] = numerics.FAIL
                    rec["detail"] = _crash(report)
                row = self.rows[tuple(key.split("\x1f"))]
                row["records"].append(rec)
                row["tests"] += 1
                row["words"][rec["word"]] += 1

    def table(self) -> list:
        out = []
        for (contract, family, dtype), row in sorted(self.rows.items()):
            recs = row["records"]
            w = min(recs, key=lambda r: numerics.WORDS.index(r["word"]))
            diffs = [r.get("max_diff") for r in recs if r.get("max_diff") is not None]
            envs = [r.get("envelope") for r in recs if r.get("envelope") is not None]
            ctl = [r.get("control") for r in recs if r.get("control") is not None]
            out.append({
                "contract": contract, "family": family, "dtype": dtype, "verdict": w["word"],
                "max_diff": max(diffs) if diffs else None, "envelope": max(envs) if envs else None,
                "weakest_control": min(ctl) if ctl else None, "tests": row["tests"],
                "counts": dict(row["words"]), "detail": w.get("detail", ""),
            })
        return out


    def proven(self) -> int:
        return sum(r["verdict"] in (numerics.BIT_EXACT, numerics.WITHIN) for r in self.table())

    def strict_failures(self, floor) -> list:
        """Why --strict-verdicts fails this run ([] where it does not)."""
        rows = self.table()
        # A row left inconclusive because the backend's own product does not
        # repeat its bits (treespec.backend.soundness) still fails the run:
        # it is the backend's defect, not a pass, and is named as such.
        out = [(f"unsound kernel: {r['contract']} [{r['family']} {r['dtype']}]: {r['detail']}"
                if _unsound(r["verdict"], r["detail"]) else
                f"inconclusive: {r['contract']} [{r['family']} {r['dtype']}]")
               for r in rows if r["verdict"] == numerics.INCONCLUSIVE]
        out += [f"{n} test(s): {msg}" for msg, n in sorted(self.goldens.items())]
        if floor is not None and self.proven() < floor:
            out.append(f"{self.proven()} rows proven (bit-exact or within envelope), "
                       f"fewer than --min-proven {floor}")
        return out


def _golden_missing(report) -> str:
    """golden_missing's message, where this report is that skip."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return ""
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    return reason if reason.startswith(GOLDEN_MISSING) else ""


def _crash(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message.splitlines()[0][:200] if crash is not None else str(report.longrepr)[:200]


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    collector = getattr(config, "_treespec_verdicts", None)
    if collector is None or hasattr(config, "workerinput"):
        return
    rows = collector.table()
    if not rows:
        return
    tr = terminalreporter
    tr.write_sep("=", "treespec verdict (per contract x family x dtype)")
    tr.write_line(f"{_header()}")
    cw = max(len("contract"), *(len(r["contract"]) for r in rows))
    fw = max(len("family"), *(len(r["family"]) for r in rows))
    dw = max(len("dtype"), *(len(r["dtype"]) for r in rows))
    tr.write_line(f"{'contract':<{cw}}  {'family':<{fw}}  {'dtype':<{dw}}  {'verdict':<16}  "
                  f"{'max|diff|':>9}  {'envelope':>9}  {'control':>9}  tests")
    for r in rows:
        counts = ", ".join(f"{n} {w}" for w, n in sorted(r["counts"].items()) if w != r["verdict"])
        tr.write_line(f"{r['contract']:<{cw}}  {r['family']:<{fw}}  {r['dtype']:<{dw}}  "
                      f"{r['verdict']:<16}  {_fmt(r['max_diff']):>9}  {_fmt(r['envelope']):>9}  "
                      f"{_fmt(r['weakest_control']):>9}  {r['tests']}" + (f" ({counts})" if counts else ""))
    tally = defaultdict(int)
    for r in rows:
        tally[r["verdict"]] += 1
    tr.write_line("rows: " + ", ".join(f"{tally[w]} {w}" for w in numerics.WORDS if tally[w])
                  + (f"; {collector.skipped} skipped tests recorded nothing" if collector.skipped else ""))
    for r in rows:
        if r["verdict"] in (numerics.FAIL, numerics.INCONCLUSIVE, numerics.DECLINED):
            tr.write_line(f"  {r['verdict']} {r['contract']} [{r['family']} {r['dtype']}]: {r['detail'][:300]}")
    for msg, n in sorted(collector.goldens.items()):
        tr.write_line(f"  not recorded ({n} tests): {msg}")
    failures = getattr(config, "_treespec_strict", None)
    if failures:
        tr.write_line(f"--strict-verdicts: this run fails ({len(failures)} reasons):")
        for why in failures:
            tr.write_line(f"  {why}")


def _header() -> str:
    return f"regime {regime()}; {describe()}; {census_line()}"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    collector = getattr(config, "_treespec_verdicts", None)
    if collector is None or hasattr(config, "workerinput"):
        return
    if config.getoption("--strict-verdicts"):
        failures = collector.strict_failures(config.getoption("--min-proven"))
        config._treespec_strict = failures
        if failures and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    path = config.getoption("--verdict-json")
    if path:
        Path(path).write_text(json.dumps({
            "header": _header(), "rows": collector.table(),
            "skipped_without_verdict": collector.skipped, "proven": collector.proven(),
            "goldens_not_recorded": dict(collector.goldens),
            "strict_failures": getattr(config, "_treespec_strict", None)}, indent=1))
