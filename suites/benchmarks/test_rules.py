"""The benchmarks measure treespec as a user runs it: read from their source,
no benchmark imports or reads a private name of treespec (``_x``) and none
assigns an attribute of a module it imported (``mx.eval = ...``,
``setattr(rollback, ...)``): what they time is the package's public code,
unpatched. Each check is first shown to fire on planted source."""

import ast
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[2]


def findings(source: str) -> List[str]:
    """What ``source`` does against the rules, one line each."""
    tree = ast.parse(source)
    modules, treespec_modules, out = set(), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                local = a.asname or a.name.split(".")[0]
                modules.add(local)
                if a.name.split(".")[0] == "treespec":
                    treespec_modules.add(local)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                modules.add(a.asname or a.name)  # possibly a module: patching it counts too
                if node.module.split(".")[0] == "treespec":
                    treespec_modules.add(a.asname or a.name)
                    if a.name.startswith("_"):
                        out.append(f"line {node.lineno}: imports {node.module}.{a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                out.append(f"line {node.lineno}: assigns {node.value.id}.{node.attr}")
            elif node.value.id in treespec_modules and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                out.append(f"line {node.lineno}: reads {node.value.id}.{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("setattr", "delattr") and node.args
              and isinstance(node.args[0], ast.Name) and node.args[0].id in modules):
            out.append(f"line {node.lineno}: {node.func.id}({node.args[0].id}, ...)")
    return out


def test_the_checks_fire_on_planted_source():
    planted = "\n".join([
        "import mlx.core as mx",
        "from treespec import caches, rollback",
        "from treespec.models import _VOCAB",
        "from treespec.verify import adapter as adapter_module",
        "def timed(f):",
        "    return f",
        "mx.eval = timed(mx.eval)",
        "rollback.snapshot = timed(rollback.snapshot)",
        "setattr(caches, 'hold', None)",
        "cls = adapter_module._checked",
        "fine = caches.hold, rollback.__name__",
    ])
    assert findings(planted) == [
        "line 3: imports treespec.models._VOCAB", "line 7: assigns mx.eval",
        "line 8: assigns rollback.snapshot", "line 9: setattr(caches, ...)",
        "line 10: reads adapter_module._checked"]


def test_no_benchmark_imports_a_private_name_or_patches_a_module():
    files = sorted((ROOT / "benchmarks").rglob("*.py"))
    assert len(files) > 5 and ROOT / "benchmarks" / "harness.py" in files
    found = {str(p.relative_to(ROOT)): findings(p.read_text()) for p in files}
    assert {p: f for p, f in found.items() if f} == {}
