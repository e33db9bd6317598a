"""The census measured in child processes, so that a kernel that crashes the
process costs the row it was measuring, not the run that asked.

Why: on an H200 (MLX 0.32.4 CUDA, results/half-power) measuring the
default census segfaulted the pytest process that printed the verdict
table, after every test had passed; the run hung and gave no verdict. A
backend whose kernel faults is a backend the census must report, not one
that takes the report down. So :func:`isolated` runs the census's rows
(:func:`treespec.backend.census.census`, treespec.backend.census_position's
with ``kind="position"``, or both with ``kind="both"``: a checkpoint loaded
once for the two) in a child (``python -m
treespec.backend.census_child``) that first says how many rows it plans,
then announces each row (op, how, dtype, shape) before measuring it and
prints it after; where the child dies, the row it had announced becomes a
row that could not run ("crashed the process: SIGSEGV"; a row that could
not run already denies exactness), and a fresh child measures the rows
after it. Same rows, same order, same seeded inputs as in-process.

A model's own shapes: the child loads the checkpoint from its path
(``mlx_lm.load(path, lazy=True)``: only what a row reads is read from
disk), so ``model`` is a path mlx_lm.load gives the model from, not a model
object (those do not cross to another process). The child computes on the
parent's default device, inherits its environment (a preloaded BLAS,
MLX_ENABLE_TF32) and imports from its path.
"""

import json
import os
import signal
import subprocess
import sys
from typing import List, Optional, Sequence

import mlx.core as mx
import mlx_lm

from . import census_position
from .census import MEASURES, WIDTHS, Row, checked_dtypes, checked_widths, measure_row, plan, to_json

__all__ = ["KINDS", "isolated"]


def _crash(returncode: int, stderr: str) -> str:
    """What killed a child, in a row's one-line error."""
    if returncode < 0:
        try:
            return f"crashed the process: {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    tail = (stderr.strip().splitlines() or [""])[-1][:160]
    return f"crashed the process: exit status {returncode}" + (f" ({tail})" if tail else "")


# the rows per op each kind measures, in turn
KINDS = {"ops": (MEASURES,), "position": (census_position.MEASURES,),
         "both": (MEASURES, census_position.MEASURES)}


def isolated(model: Optional[str] = None, dtypes: Optional[Sequence[str]] = None,
             widths: Sequence[int] = WIDTHS, seed: int = 0, kind: str = "ops",
             child: str = __name__) -> List[Row]:
    """The census's rows of the default shapes or of the checkpoint at
    ``model`` (``kind``: "ops", its ``position`` rows, or "both", the ops'
    first), each measured in a child process; a row whose child died is a
    row that could not run, naming the signal. ``child``: the module run as
    ``python -m child SPEC``, whose main is :func:`main` (the suite's
    installs its plant first)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    ws = checked_widths(widths)
    if dtypes is not None:
        checked_dtypes(dtypes)  # before any child
    spec = {"model": None if model is None else str(model), "kind": kind,
            "dtypes": None if dtypes is None else list(dtypes), "widths": list(ws), "seed": seed,
            "device": "gpu" if mx.default_device() == mx.gpu else "cpu"}
    # the child imports what this process imports, from wherever it was started
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    rows: List[Row] = []
    planned = None
    while planned is None or len(rows) < planned:
        args = [sys.executable, "-m", child, json.dumps({**spec, "skip": len(rows)})]
        run = subprocess.run(args, capture_output=True, text=True, env=env)
        started = None
        for line in run.stdout.splitlines():
            msg = json.loads(line)
            if "planned" in msg:
                planned = msg["planned"]
            elif "start" in msg:
                started = msg["start"]
            else:
                rows.append(Row(**{**msg["row"], "widths": tuple(msg["row"]["widths"])}))
                started = None
        if planned is not None and len(rows) == planned:
            break
        if started is None:  # died outside any row: nothing to attribute, nothing to skip
            raise RuntimeError(f"the census child {_crash(run.returncode, run.stderr)} before "
                               f"measuring row {len(rows) + 1}"
                               + (f" of {planned}" if planned is not None else ""))
        # the announced row, as one that could not run (as measure_row makes one)
        rows.append(Row(**started, widths=ws, first_differs=None, max_diff=0.0,
                        error=_crash(run.returncode, run.stderr)))
    return rows


def main(argv: Sequence[str], measures: Optional[dict] = None) -> None:
    """The child: the rows of :func:`isolated`'s spec (``argv[0]``, JSON)
    from its ``skip``-th on, each announced, measured, then printed.
    ``measures``: the rows per op (default: the census's, its position
    rows, or both in turn, as the spec's ``kind`` asks)."""
    spec = json.loads(argv[0])
    mx.set_default_device(mx.gpu if spec["device"] == "gpu" else mx.cpu)
    model = None if spec["model"] is None else mlx_lm.load(spec["model"], lazy=True)[0]
    ws = checked_widths(spec["widths"])
    planned = [p for m in ((measures,) if measures is not None else KINDS[spec["kind"]])
               for p in plan(model, spec["dtypes"], m)]
    print(json.dumps({"planned": len(planned)}), flush=True)
    for i in range(spec["skip"], len(planned)):
        p, op, how, name, _ = planned[i]
        print(json.dumps({"start": {"op": op, "how": how, "dtype": name, "shape": p.shape}}),
              flush=True)
        print(json.dumps({"row": to_json([measure_row(planned[i], ws, spec["seed"])])[0]}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
