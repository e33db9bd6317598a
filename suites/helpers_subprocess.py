"""The environment a test's subprocess (pytest, treespec, python -c) runs
in: this one's, with the project first on PYTHONPATH and the parent's own
entries kept (on the H200 MLX lives in a private site dir named there), and
no xdist worker identity (the child is its own pytest session)."""

import os
from pathlib import Path

from treespec.backend.cuda import CUDNN_SDPA, WHY

ROOT = Path(__file__).resolve().parents[1]


def project_env(*drop: str, **extra) -> dict:
    """This environment without ``drop`` (names), with ``extra`` (a None
    value sets nothing), the project first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "PYTEST_XDIST_WORKER"}
    env.update({k: v for k, v in extra.items() if v is not None})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


# What every treespec command prints first on MLX CUDA (treespec.cli.process.prepare,
# from treespec.backend.cuda.prefer_mlx_attention's note): built here from the
# constants, so a note of another wording, or any other line, is still counted.
CUDA_ATTENTION_NOTE = f"note: {CUDNN_SDPA}=0 set by treespec: {WHY}"


def without_startup_notes(stderr: str) -> str:
    """``stderr`` of a treespec command without treespec's CUDA attention
    note: on CUDA every command says it before anything else, so a test that
    counts a refusal's lines would otherwise count it too. Only lines equal
    to that note go (a rank of mlx.launch says it once per process)."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if line.rstrip("\r\n") != CUDA_ATTENTION_NOTE)
