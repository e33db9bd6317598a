"""What a lazy MLX graph holds, counted: its primitives by name.

MLX exposes an unevaluated graph only through ``mx.export_to_dot``, which
writes every primitive as a node ``label ="Name", shape=rectangle``. Counting
those is how a test pins an op a commit must not build (a Gather where a slice
suffices) and how a benchmark reports a graph's size beside its time.
Counts only: what the graph computes is checked elsewhere, against values.
"""

import os
import re
import tempfile
from collections import Counter

import mlx.core as mx

__all__ = ["difference", "primitives"]

_NODE = re.compile(r'label ="([^"]+)", shape=rectangle')


def primitives(*arrays: mx.array) -> Counter:
    """Primitive name -> how many the (unevaluated) graph of ``arrays`` holds;
    evaluated inputs are leaves and count nothing."""
    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *arrays)
        with open(path) as f:
            return Counter(_NODE.findall(f.read()))
    finally:
        os.remove(path)


def difference(counts: dict, base: dict) -> list:
    """``(name, counts[name] - base[name])`` for every primitive whose count
    differs, the largest change first (then by name)."""
    names = set(counts) | set(base)
    deltas = ((k, counts.get(k, 0) - base.get(k, 0)) for k in names)
    return sorted(((k, d) for k, d in deltas if d), key=lambda t: (-abs(t[1]), t[0]))
