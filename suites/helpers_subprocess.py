"""The environment a test's subprocess (pytest, treespec, python -c) runs
in: this one's, with the project first on PYTHONPATH and the parent's own
entries kept (on the H200 MLX lives in a private site dir named there), and
no xdist worker identity (the child is its own pytest session)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def project_env(*drop: str, **extra) -> dict:
    """This environment without ``drop`` (names), with ``extra`` (a None
    value sets nothing), the project first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "PYTEST_XDIST_WORKER"}
    env.update({k: v for k, v in extra.items() if v is not None})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env
