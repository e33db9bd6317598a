"""The package's public names: ``treespec.decode`` is the decoding entry point
(not a module that shadows it), and ``import treespec`` stays light (no
mlx-lm) until ``decode`` is first used."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, importlib
import treespec
light = "mlx_lm" not in sys.modules
import treespec.decoding  # binds the submodule on the package: must not shadow the function
from treespec import decode, detokenize
print("LIGHT", light, "FUNC", decode is treespec.decoding.decode and callable(decode),
      "SAME", treespec.decode is decode, detokenize is treespec.decoding.detokenize)
try:
    treespec.no_such_name
except AttributeError as e:
    print("ERR", e)
"""


def test_decode_is_exported_lazily_as_the_function():
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "LIGHT True FUNC True SAME True True" in run.stdout, run.stdout
    assert "ERR module 'treespec' has no attribute 'no_such_name'" in run.stdout
