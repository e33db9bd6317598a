"""A pytest plugin for timing the exactness suite where no per-test timing
survives a cut run (the H200, under ``timeout -s INT``): one TSV line per
test, written by the controller as the test's last report arrives, so the
lines of a run cut short are on disk. Columns: seconds since the session
started, outcome (the worst of its phases), seconds of setup + call +
teardown, node id, first error line or skip reason. The file is
``$TIMING_TSV``; ``$SELECT_FILE`` (node ids, one per line) restricts the run
to those tests. Load it with ``-p benchmarks.device.timing_plugin``, the
repository root on PYTHONPATH (benchmarks/device/exactness_timed.sh does)."""

import os
import time

_T0 = time.time()
_OUT = None
_OPEN = {}
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def pytest_configure(config):
    global _OUT
    if hasattr(config, "workerinput") or not os.environ.get("TIMING_TSV"):
        return
    _OUT = open(os.environ["TIMING_TSV"], "a", buffering=1)
    _OUT.write("# seconds since start\toutcome\tseconds (setup+call+teardown)\ttest\t"
               "first error line or skip reason\n")


def _why(report) -> str:
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple):
        return str(lr[2])
    lines = str(lr).strip().splitlines()
    errors = [line for line in lines if line.startswith("E ")]
    return errors[0] if errors else (lines[-1] if lines else "")


def pytest_runtest_logreport(report):
    if _OUT is None:
        return
    seconds, outcome, why = _OPEN.get(report.nodeid, (0.0, "passed", ""))
    seconds += report.duration
    if _RANK[report.outcome] > _RANK[outcome]:
        outcome, why = report.outcome, _why(report)
    if report.when != "teardown":
        _OPEN[report.nodeid] = (seconds, outcome, why)
        return
    _OPEN.pop(report.nodeid, None)
    why = why.replace("\t", " ").replace("\n", " ")[:400]
    _OUT.write(f"{time.time() - _T0:7.1f}\t{outcome}\t{seconds:.2f}\t{report.nodeid}\t{why}\n")


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("SELECT_FILE")
    if not path:
        return
    keep = {line.strip() for line in open(path) if line.strip()}
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in keep])
    items[:] = [i for i in items if i.nodeid in keep]
