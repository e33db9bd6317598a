"""How the suite's tests reach pytest-xdist's workers (a pytest plugin,
loaded by the root conftest.py): the longest first, and the tests that need
the same freshly compiled kernels on one worker, one after another.

Why the second. MLX's CUDA backend compiles (NVRTC) a quantized-matmul
kernel the first time a process multiplies with a new (dtype, bits, group,
tile), then keeps it in memory and in its disk cache: measured on the H200,
15 to 50 s per kernel (results/h200-exactness/kernel-compiles-qmm.txt).
Under xdist's plain load scheduling the tests of one quantized model ran on
several workers at once, each compiling the same kernels: at e7abd7e seven
of llama bfloat16-q4's verify tests took 67-79 s each, five of them at the
same time, and the rest of its 42 under a second. Sent to one worker as one
unit, the first compiles and the rest find the kernels there.

And the tests of one file on one model and dtype (a parameter id starting
``family-dtype`` or ``family/dtype``) share what a process builds once: the
model, and the envelope measurements treespec.evidence.numerics memoizes per model and
context bucket, which an inexact backend measures for every comparison.

Both groups are read off the node id, the only thing the xdist controller
knows of a test. Its kernel group: the quantization its parameter id names,
``qB`` or ``qB-gG`` for weights (mlx-lm's default group is 64), ``Bbit-gG``
for a KV cache, with the float dtype it names, if any. A test in neither
group is a unit of its own, balanced test by test as under plain load
scheduling.
"""

import itertools
import re
from collections import Counter
from typing import Optional

import pytest
from xdist.scheduler import LoadScopeScheduling

_KV = re.compile(r"(?:^|-)([2-8])bit-g(\d+)(?:-|$)")
_WEIGHTS = re.compile(r"(?:^|-)q([2-8])(?:-g(\d+))?(?:-|$)")
_DTYPE = re.compile(r"(?:^|-)(float32|bfloat16|float16)(?:-|$)")


def _params(nodeid: str) -> Optional[str]:
    """The parameter id of a test's node id (``a.py::t[x-y]`` -> ``x-y``), or None."""
    name = nodeid.rpartition("::")[2]
    return name[name.index("[") + 1:-1] if name.endswith("]") and "[" in name else None


def kernel_group(nodeid: str) -> Optional[str]:
    """``"kernels bfloat16 weights q4 g64"`` for a test whose parameter id
    names bfloat16 weights quantized at 4 bits in groups of 64; None where it
    names no quantization."""
    params = _params(nodeid)
    if params is None:
        return None
    dtype = _DTYPE.search(params)
    dtype = dtype.group(1) if dtype else "-"
    found = _KV.search(params)
    if found:
        return f"kernels {dtype} kv q{found.group(1)} g{found.group(2)}"
    found = _WEIGHTS.search(params)
    if found:
        return f"kernels {dtype} weights q{found.group(1)} g{found.group(2) or 64}"
    return None


_MODEL = re.compile(r"^([a-z][a-z0-9_]*)[-/](float32|bfloat16|float16)(?:[-/]|$)")


def model_group(nodeid: str) -> Optional[str]:
    """``"model suites/verify/test_x.py gemma3_text bfloat16"`` for a test of
    that file whose parameter id starts with a family and a dtype; None
    otherwise."""
    params = _params(nodeid)
    found = _MODEL.match(params) if params is not None else None
    path = nodeid.partition("::")[0]
    return f"model {path} {found.group(1)} {found.group(2)}" if found else None


def unit(nodeid: str) -> str:
    """The scheduling unit a test belongs to: its kernel group, else its
    file's model group, else itself."""
    return kernel_group(nodeid) or model_group(nodeid) or nodeid


def _rank(item) -> int:
    mark = item.get_closest_marker("slow")
    return 2 if mark is None else 0 if "minutes" in mark.args else 1


def scheduled(items: list) -> list:
    """``items`` in the order workers get them: slow('minutes') tests each
    paired with a merely slow one, then the rest, so every worker starts on
    one of the longest instead of one worker getting them all and the run
    ending with the others idle; each unit (:func:`unit`) gathered at its
    first member's place; among the units with no slow test, the larger
    first (the most tests: a long unit handed out last would end the run on
    one worker). Deterministic, as xdist requires of every worker's
    collection."""
    tiers = ([], [], [])
    for item in items:
        tiers[_rank(item)].append(item)
    paired = [i for pair in itertools.zip_longest(tiers[0], tiers[1]) for i in pair if i is not None]
    order = paired + tiers[2]
    units = [unit(item.nodeid) for item in order]
    first, size, rank = {}, Counter(units), {}
    for i, (u, item) in enumerate(zip(units, order)):
        first.setdefault(u, i)
        rank[u] = min(rank.get(u, 2), _rank(item))

    def place(i):
        u = units[i]
        return (0, first[u], 0) if rank[u] < 2 else (1, -size[u], first[u])
    return [order[i] for i in sorted(range(len(order)), key=place)]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes more than a few seconds on some backend (scheduled first); "
                   "slow('minutes'): a minute or more (scheduled before those)")


def pytest_collection_modifyitems(config, items):
    items[:] = scheduled(items)


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`unit` as the scope: each kernel
    or model group one unit, every other test a unit of its own, handed out
    in collection order (the order :func:`scheduled` made)."""

    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # no hook without xdist (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":  # an explicit --dist is the caller's choice
        return None
    # Scope scheduling would otherwise sort units by size, biggest first,
    # and undo the longest-first order above.
    config.option.loadscopereorder = False
    return UnitScheduling(config, log)
