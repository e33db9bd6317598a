"""Contract 8 for rollback: a commit that cannot be exact raises
RollbackRefused naming the cache class, the layer and the reason, before any
cache is written: every array and field of every cache is as it was.

The caches are a mixture of every mode, all holding a verified tree whose
committed path would move rows; the offending cache sits last, so any layer
mutated before validation finished would show.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from suites.rollback.helpers_caches import BUSH, Mode, feed, fingerprint, rows
from suites.rollback.helpers_models import make_caches, model, prefill
from treespec.rollback import Captures, RollbackRefused, commit_path, snapshot
from treespec.tree import DraftTree

pytestmark = pytest.mark.exactness

ROWS = Mode(KVCache, head_dim=32)
PATH = [0, 2, 5]  # moves rows: node 5 sits at flattened index 5, its slot is 2


class SubclassedKV(KVCache):
    """A subclass may change the layout: refused like any unknown class."""


def mixture(extra=None, history=10, chunk=32):
    """Every supported mode, fed ``history`` rows then BUSH's rows (one
    update), plus ``extra`` last. Returns (caches, offset, snapshot)."""
    caches = [
        KVCache(),
        RotatingKVCache(max_size=8),
        RotatingKVCache(max_size=8, keep=2),
        QuantizedKVCache(group_size=32, bits=4),
        ConcatenateKVCache(),
        CacheList(KVCache(), RotatingKVCache(max_size=6)),
        ChunkedKVCache(chunk),
    ] + ([extra] if extra is not None else [])
    rng = np.random.RandomState(0)
    attention = [c for c in caches if not isinstance(c, (ArraysCache, BatchKVCache))]
    kv = rows(ROWS, history, rng)
    for c in attention:
        feed(c, kv)
    snap = snapshot(caches)
    kv = rows(ROWS, len(BUSH), rng)
    for c in attention:
        feed(c, kv)
    return caches, history, snap


def arrays_cache():
    c = ArraysCache(size=2)
    c[0], c[1] = mx.ones((1, 3, 8)), mx.zeros((1, 2, 4, 4))
    return c


def batch_cache():
    c = BatchKVCache(left_padding=[0])
    c.update_and_fetch(*rows(ROWS, 4, np.random.RandomState(1)))
    return c


@dataclass
class Case:
    commit: Callable  # (offset, snapshot) -> the faulty commit_path arguments
    reason: str  # in the message
    cls: Optional[str] = None  # the refusing cache, None when the path is at fault
    layer: Optional[int] = None
    extra: Callable = lambda: None  # a cache appended last
    history: int = 10


def plain(**kw):
    return lambda o, s: {"offset": o, "path": PATH, "snapshot": s, **kw}


CASES = {
    "not a root path": Case(plain(path=[0, 1, 2]), "not a root path"),
    "path not from the root": Case(plain(path=[2, 5]), "does not start at the root"),
    "empty path": Case(plain(path=[]), "does not start at the root"),
    "node outside the tree": Case(plain(path=[0, 9]), "outside the tree"),
    "malformed tree": Case(plain(path=[0], tree=[-1, 3]), "malformed tree"),
    "negative offset": Case(lambda o, s: dict(offset=-1, path=PATH), "negative"),
    "offset + n beyond the cache": Case(
        lambda o, s: dict(offset=o + 1, path=PATH), "not the last rows", "KVCache", 0
    ),
    "offset short of the tail": Case(
        lambda o, s: dict(offset=o - 1, path=PATH), "not the last rows", "KVCache", 0
    ),
    "unknown cache class": Case(
        plain(), "unknown cache class", "BatchKVCache", 7, extra=lambda: batch_cache()
    ),
    "subclass of a known class": Case(
        plain(), "unknown cache class", "SubclassedKV", 7, extra=SubclassedKV
    ),
    "tree across a chunk boundary": Case(
        plain(), "chunk boundary", "ChunkedKVCache", 6, history=28
    ),
    "recurrent without snapshot": Case(
        plain(snapshot=None, recurrent=Captures()), "pre-verify snapshot", "ArraysCache", 7,
        extra=lambda: arrays_cache(),
    ),
    "recurrent without captures": Case(
        plain(), "captured mixer inputs", "ArraysCache", 7, extra=lambda: arrays_cache()
    ),
    "recurrent input never captured": Case(
        plain(recurrent=Captures()), "captured 0 calls", "ArraysCache", 7,
        extra=lambda: arrays_cache(),
    ),
    "rotating root-only path without snapshot": Case(
        plain(path=[0], snapshot=None), "pre-verify ring", "RotatingKVCache", 1
    ),
    "snapshot of another cache list": Case(
        lambda o, s: dict(offset=o, path=PATH, snapshot=mixture()[2]),
        "different cache object", "KVCache", 0,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refusal_names_the_cache_and_leaves_every_cache_unchanged(case):
    case = CASES[case]
    caches, offset, snap = mixture(case.extra(), case.history)
    before = fingerprint(caches)
    with pytest.raises(RollbackRefused) as info:
        commit_path(caches, **{"tree": BUSH, **case.commit(offset, snap)})
    assert fingerprint(caches) == before
    err = info.value
    assert (err.cache_class, err.layer) == (case.cls, case.layer), str(err)
    assert case.reason in str(err) and (case.cls is None or case.cls in str(err))


def test_the_same_mixture_commits_when_nothing_is_wrong():
    """The refusals above are about the one defect each introduces."""
    caches, offset, snap = mixture()
    assert commit_path(caches, offset, PATH, BUSH, snapshot=snap) == len(PATH)


def test_stale_snapshot_is_refused():
    caches, offset, snap = mixture()
    stale = snapshot(caches)  # taken after the verify, not before it
    before = fingerprint(caches)
    with pytest.raises(RollbackRefused, match="not taken right before"):
        commit_path(caches, offset, [0], BUSH, snapshot=stale)
    assert fingerprint(caches) == before


def test_refusal_is_a_value_error():
    assert issubclass(RollbackRefused, ValueError)


def test_model_with_recurrent_layers_refuses_without_captures_and_keeps_its_state():
    family = "qwen3_5"
    caches = make_caches(family, "native")
    prefill(family, "native", caches, [5, 6, 7, 8])
    snap = snapshot(caches)
    tree = DraftTree.linear([1, 2, 3])
    model(family)(mx.array([tree.tokens]), cache=caches)
    before = fingerprint(caches)
    with pytest.raises(RollbackRefused) as info:
        commit_path(caches, 4, [0, 1], tree, snapshot=snap)
    assert (info.value.cache_class, info.value.layer) == ("ArraysCache", 0)
    assert fingerprint(caches) == before
