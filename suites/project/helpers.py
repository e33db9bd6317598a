"""Static reading of a package's source with ``ast``: which of its modules
import which, where a module imports another inside a function, and where
a module assigns attributes of another at run time. Pure, so it is checked
on planted packages as well as on treespec."""

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple


@dataclass
class Module:
    name: str  # dotted, e.g. treespec.verify.adapter
    path: Path
    is_package: bool  # an __init__.py
    tree: ast.Module
    lines: int


@dataclass
class Findings:
    edges: Dict[str, Set[str]] = field(default_factory=dict)  # module -> package modules it imports
    function_imports: List[Tuple[str, int, str]] = field(default_factory=list)  # (module, line, what)
    patches: List[Tuple[str, int, str]] = field(default_factory=list)  # (module, line, target)
    # (module, line): calls of importlib.import_module / __import__, imports the graph cannot see
    run_time_imports: List[Tuple[str, int]] = field(default_factory=list)
    # module -> {command: "pkg.module:function"}, its module-level COMMANDS table; each
    # target module counts as an import of that module (an edge of the graph)
    dispatch: Dict[str, Dict[str, str]] = field(default_factory=dict)


def modules(root: Path, package: str) -> Dict[str, Module]:
    """Every module of the package rooted at ``root`` (the folder holding
    ``package/__init__.py``)."""
    out = {}
    base = root / package
    for path in sorted(base.rglob("*.py")):
        # A .py file in a folder without __init__.py is not a module of the
        # package: nothing can import it as one (treespec/pair/ is package
        # data, and its train.py the provenance of the shipped weights, a
        # script run by path), so the package's rules do not read it.
        if any(not (folder / "__init__.py").exists()
               for folder in [path.parent, *path.parent.parents] if folder.is_relative_to(base)):
            continue
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        text = path.read_text()
        out[".".join(parts)] = Module(".".join(parts), path, is_package, ast.parse(text),
                                      text.count("\n") + (not text.endswith("\n")))
    return out


def _resolve(mod: Module, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (``from ..x import y`` -> pkg.x)."""
    if node.level == 0:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(mod: Module, node, known: Dict[str, Module]) -> List[Tuple[str, Optional[str]]]:
    """(imported package module, local name bound to a module or None)."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name in known:
                out.append((a.name, a.asname or (a.name if "." not in a.name else None)))
    elif isinstance(node, ast.ImportFrom):
        src = _resolve(mod, node)
        for a in node.names:
            sub = f"{src}.{a.name}" if src else a.name
            if sub in known:  # ``from . import zoo``: the name is a module
                out.append((sub, a.asname or a.name))
            elif src in known:
                out.append((src, None))
    return out


def _dispatch_table(mod: Module) -> Dict[str, str]:
    """A module-level ``COMMANDS`` or ``EXPORTS`` table, ``{"name": "pkg.module:attr", ...}``:
    names resolved by importing the module at run time (the command line's
    subcommands, the package's lazy exports)."""
    for node in mod.tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in ("COMMANDS", "EXPORTS")
                and isinstance(node.value, ast.Dict)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def _is_run_time_import(node) -> bool:
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))


def read(root: Path, package: str) -> Tuple[Dict[str, Module], Findings]:
    known = modules(root, package)
    found = Findings()
    for name, mod in known.items():
        found.edges[name] = set()
        table = _dispatch_table(mod)
        if table:
            found.dispatch[name] = table
            found.edges[name] |= {t.partition(":")[0] for t in table.values()
                                  if t.partition(":")[0] in known}
        found.run_time_imports += [(name, n.lineno) for n in ast.walk(mod.tree)
                                   if _is_run_time_import(n)]
        module_names: Set[str] = set()  # local names bound to package modules
        in_function: Set[int] = set()
        for fn in ast.walk(mod.tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                in_function.update(id(n) for n in ast.walk(fn) if n is not fn)
        for node in ast.walk(mod.tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, local in _targets(mod, node, known):
                if target != name:
                    found.edges[name].add(target)
                if local:
                    module_names.add(local)
                if id(node) in in_function:
                    found.function_imports.append((name, node.lineno, target))
        for node in ast.walk(mod.tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                                and sub.value.id in module_names and isinstance(sub.ctx, ast.Store)):
                            found.patches.append((name, node.lineno, f"{sub.value.id}.{sub.attr}"))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("setattr", "delattr") and node.args
                  and isinstance(node.args[0], ast.Name) and node.args[0].id in module_names):
                found.patches.append((name, node.lineno, f"{node.func.id}({node.args[0].id}, ...)"))
    return known, found


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected group of more than one module (or a module
    importing itself), each as a cycle path."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges.get(v, ()):
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out
