"""The environment a test's subprocess (pytest, treespec, python -c) runs
in: this one's, with the project first on PYTHONPATH and the parent's own
entries kept (on the H200 MLX lives in a private site dir named there), and
no xdist worker identity (the child is its own pytest session)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def project_env(**extra: str) -> dict:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop("PYTEST_XDIST_WORKER", None)
    return env
