"""What a walk of a model's modules found stays valid while the module tree
does not change: a snapshot of the tree's edges that says so in one pass of
identity checks, cheaper than walking it again.

Every tree verify needs the modules holding a rope (treespec.verify.attention
``rope_owners``), and a rope or a whole layer may be swapped after the
adapter is made; walking the model on every verify costs a fixed share of
the host's graph building. :class:`ModuleTree` records, for the module tree
as ``rope_owners`` walks it (a module's Module values, and the Modules inside
its list, tuple and dict values), every container with its length and every
edge (container, key, value) with the value's identity. :meth:`changed` is
exact for any change of that tree: a module, list or dict put in, replaced or
removed anywhere makes an edge differ or a container's length change. What is
not structure (an array, a weight update, a plain attribute) never makes it
report a change, except an array added or removed (a length), which only
costs one walk more.
"""

import weakref
from operator import getitem, is_not
from typing import List, Tuple

import mlx.nn as nn

__all__ = ["ModuleTree"]


class ModuleTree:
    """A snapshot of ``model``'s module tree (see the module's docstring).

    ``weak_root``: hold the model itself by a weak reference (its children
    strongly, as always), so that a snapshot kept on the model (a plain
    instance attribute) makes no reference cycle: the model is freed when
    its last reference goes, not at the next cycle collection. A snapshot
    whose model is gone reports a change."""

    def __init__(self, model: nn.Module, weak_root: bool = False):
        self._root = weakref.ref(model) if weak_root else None
        self.containers: List[Tuple[object, int]] = []
        self.edges: List[Tuple[object, object, object]] = []
        seen = set()

        def visit(m):
            if id(m) in seen:  # a module shared by two parents: one record
                return
            seen.add(id(m))
            self.containers.append((m, len(m)))
            for key, value in m.items():
                if isinstance(value, nn.Module):
                    self.edges.append((m, key, value))
                    visit(value)
                elif isinstance(value, (list, tuple, dict)):
                    self.edges.append((m, key, value))
                    self.containers.append((value, len(value)))
                    items = value.items() if isinstance(value, dict) else enumerate(value)
                    for sub, child in items:
                        if isinstance(child, nn.Module):
                            self.edges.append((value, sub, child))
                            visit(child)

        visit(model)
        self._lengths = None
        if weak_root:
            # The root's own length and edges apart, by key; every other
            # record holds no path back to the root (children do not
            # reference their parents).
            self._root_len = len(model)
            self._root_edges = [(k, v) for h, k, v in self.edges if h is model]
            self.containers = [(c, n) for c, n in self.containers if c is not model]
            self.edges = [e for e in self.edges if e[0] is not model]

    def changed(self) -> bool:
        """Whether any container's length or any edge's value differs from
        the snapshot's (a tuple's elements cannot be replaced, only the tuple)."""
        if self._root is not None:
            root = self._root()
            if root is None or len(root) != self._root_len or any(
                    root.get(k) is not v for k, v in self._root_edges):
                return True
        if self._lengths is None:  # flat columns, so the checks below loop in C
            self._holders = [c for c, _ in self.containers]
            self._lengths = [n for _, n in self.containers]
            self._columns = [list(c) for c in zip(*self.edges)] or [[], [], []]
        if list(map(len, self._holders)) != self._lengths:
            return True
        holders, keys, values = self._columns
        try:
            return any(map(is_not, map(getitem, holders, keys), values))
        except (KeyError, IndexError):
            return True
