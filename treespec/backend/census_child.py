"""The census measured in child processes, so that a kernel that crashes the
process costs the row it was measuring, not the run that asked.

Why: on an H200 (MLX 0.32.4 CUDA, results/half-power) measuring the
default census segfaulted the pytest process that printed the verdict
table, after every test had passed; the run hung and gave no verdict. A
backend whose kernel faults is a backend the census must report, not one
that takes the report down. So :func:`isolated` runs :func:`treespec.backend.
census.census`'s rows in a child (``python -m treespec.backend.census_child``)
that announces each row before measuring it and prints it after; where the
child dies, the row it had announced becomes a row that could not run
("crashed the process: SIGSEGV"; a row that could not run already denies
exactness), and a fresh child measures the rows after it. Same rows, same
order, same seeded inputs as the census in-process.

The child computes on the parent's default device, inherits its
environment (a preloaded BLAS, MLX_ENABLE_TF32) and imports from its path.
"""

import json
import os
import signal
import subprocess
import sys
from typing import List, Optional, Sequence

import mlx.core as mx

from .census import WIDTHS, Row, _checked_widths, measure_row, plan, to_json

__all__ = ["isolated"]


def _crash(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"crashed the process: {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    return f"crashed the process: exit status {returncode}"


def isolated(dtypes: Optional[Sequence[str]] = None, widths: Sequence[int] = WIDTHS,
             seed: int = 0, measures: Optional[dict] = None, child: str = __name__) -> List[Row]:
    """The default shapes' census (:func:`treespec.backend.census.census`
    with ``model=None``), each row measured in a child process; a row whose
    child died is a row that could not run, naming the signal. ``measures``
    (the rows per op; default: the census's own) with ``child``: the module
    run as ``python -m child``, whose main is :func:`main` with the same
    ``measures``."""
    ws = _checked_widths(widths)
    planned = plan(None, dtypes, measures)  # checks dtypes before any child
    spec = {"dtypes": None if dtypes is None else list(dtypes), "widths": list(ws), "seed": seed,
            "device": "gpu" if mx.default_device() == mx.gpu else "cpu"}
    # the child imports what this process imports, from wherever it was started
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    rows: List[Row] = []
    while len(rows) < len(planned):
        args = [sys.executable, "-m", child, json.dumps({**spec, "skip": len(rows)})]
        child_run = subprocess.run(args, capture_output=True, text=True, env=env)
        started = None
        for line in child_run.stdout.splitlines():
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
            else:
                rows.append(Row(**{**msg["row"], "widths": tuple(msg["row"]["widths"])}))
                started = None
        if len(rows) == len(planned):
            break
        if started is None:  # died outside any row: nothing to attribute, nothing to skip
            tail = (child_run.stderr.strip().splitlines() or [""])[-1][:200]
            raise RuntimeError(f"the census child {_crash(child_run.returncode)} before measuring "
                               f"row {len(rows) + 1} of {len(planned)}: {tail}")
        _, op, how, name, _ = planned[started]
        rows.append(Row(op, name, planned[started][0].shape, ws, None, 0.0, how,
                        _crash(child_run.returncode)))
    return rows


def main(argv: Sequence[str], measures: Optional[dict] = None) -> None:
    """The child: the rows of :func:`isolated`'s spec (``argv[0]``, JSON)
    from its ``skip``-th on, each announced, measured, then printed."""
    spec = json.loads(argv[0])
    mx.set_default_device(mx.gpu if spec["device"] == "gpu" else mx.cpu)
    ws = _checked_widths(spec["widths"])
    planned = plan(None, spec["dtypes"], measures)
    for i in range(spec["skip"], len(planned)):
        print(json.dumps({"start": i}), flush=True)
        print(json.dumps({"row": to_json([measure_row(planned[i], ws, spec["seed"])])[0]}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
