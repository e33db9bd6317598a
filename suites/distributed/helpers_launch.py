"""Running a program on two local ranks with MLX's own launcher
(``mlx.launch -n 2 --backend ring``), from a test: each launch listens on
ports of its own, from its pytest worker's own block, so launches of parallel
pytest workers never meet."""

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from suites.helpers_subprocess import project_env

RANKS = 2
# A launch that outlives this is taken for ranks out of step (a collective waiting
# for a peer that will never call it: docs/distributed.md), killed, and failed.
# The slowest launch here takes about 70 s on 2 cores under a load of 9; on an
# H100 with 12 pytest workers launching at once (24 ranks compiling CUDA kernels
# on one GPU) a pipelined launch passed 300 s and passed alone. So the guard
# grows with the workers sharing the machine (xdist names their count).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
TIMEOUT_S = 300 * max(1, -(-WORKERS // 4))
WORKER = Path(__file__).with_name("helpers_worker.py")
LAUNCH = "mlx.launch"  # MLX's console script


def launcher() -> str:
    """mlx.launch: beside this interpreter (a venv's bin), else on PATH, else in
    the bin folder beside MLX's package (``pip install --target DIR`` puts
    scripts in DIR/bin, on no PATH). None of them: the test fails saying
    where it looked; a skip would pass the distributed tests unrun."""
    beside = Path(sys.executable).with_name(LAUNCH)
    target_bin = Path(mx.__file__).resolve().parents[1] / "bin" / LAUNCH
    for found in (beside, shutil.which(LAUNCH), target_bin):
        if found and os.access(found, os.X_OK) and Path(found).is_file():
            return str(found)
    pytest.fail(f"{LAUNCH} (MLX's console script) was not found: not beside the interpreter "
                f"({beside}), not on PATH, not in {target_bin.parent}", pytrace=False)


# The ring's ports: a block of its own per pytest worker, below Linux's
# ephemeral range (32768 up), walked in turn. A port the OS hands out (a bind
# to port 0) and released is free for a parallel worker to be handed too, or
# its neighbour: two launches could then listen on one port and their ranks
# meet. (A CI run where one sharded launch's probe "found" 5.66 at M=1 and the
# ranks' reports differed was first blamed on that; a later one, 7.1 and 6.64,
# had another cause: classic decoding's forward left running beside the probe,
# docs/distributed.md#why-the-ranks-can-drift, test_classic_drained.py.)
PORT_BASE, PORT_BLOCK = 20000, 150
_turn = itertools.count()


def worker_index() -> int:
    """This pytest-xdist worker's number (gw3: 3), 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def free_port() -> int:
    """A base port whose RANKS ports (the ring listens on one per rank) are
    free now, from this worker's block (PORT_BASE + index x PORT_BLOCK): no
    two workers of one run ever take the same port."""
    start, slots = PORT_BASE + worker_index() * PORT_BLOCK, PORT_BLOCK // RANKS
    for _ in range(slots):
        base = start + next(_turn) % slots * RANKS
        if all(_bindable(base + r) for r in range(RANKS)):
            return base
    pytest.fail(f"no {RANKS} free ports in this worker's block {start}..{start + PORT_BLOCK - 1}",
                pytrace=False)


def launch(args, tmp_path: Path, env=None) -> subprocess.CompletedProcess:
    """``mlx.launch -n 2 --backend ring`` of ``args`` (a python script and its
    arguments, or ``-m module ...``), run in the repository root."""
    cmd = [launcher(), "-n", str(RANKS), "--backend", "ring", "--starting-port",
           str(free_port()), "--python", sys.executable, *map(str, args)]
    full_env = project_env(**(env or {}))
    # Its own process group, which the ranks mlx.launch starts join: on a
    # timeout every one of them is killed, none left waiting on the ring.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=full_env, cwd=Path(__file__).resolve().parents[2],
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"mlx.launch of {args} ran past {TIMEOUT_S} s (ranks out of "
                             f"step?), killed:\n{out[-2000:]}{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def run_worker(spec: dict, tmp_path: Path) -> list:
    """Every rank's report of helpers_worker.py for ``spec``, rank order."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    done = launch([WORKER, spec_file, out], tmp_path)
    # mlx.launch can exit 0 when a rank died after its peer: a missing report fails too.
    missing = [r for r in range(RANKS) if not (out / f"rank{r}.json").exists()]
    assert done.returncode == 0 and not missing, (
        f"rc {done.returncode}, no report from rank(s) {missing}:\n"
        + done.stdout[-3000:] + done.stderr[-3000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
