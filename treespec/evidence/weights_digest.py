"""The identity of a model's weights, for the gate's probe key
(treespec.evidence.gate): a digest of every parameter's name, shape, dtype
and byte. A sampled hash could miss an edit and reuse a stale verdict, so
every byte is read, in pieces hashed on every core, and the digest is
remembered per model object until a parameter is replaced or edited in
place (docs/gate.md)."""

import copy
import hashlib
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

__all__ = ["PIECE", "weights_digest"]


def _address(w: mx.array) -> Optional[int]:
    """Where ``w``'s bytes live now (evaluating it if it is pending); None
    for a buffer that is not one contiguous block (a broadcast), which is
    then hashed every time."""
    view = memoryview(w)
    return np.frombuffer(view, dtype=np.uint8).ctypes.data if view.c_contiguous else None


class _Digest:
    """A model's weights digest and what it was computed over: each
    parameter's array object, a reference to its value then (``copy.copy``
    shares the buffer), and that buffer's address. An in-place edit
    (``w[0] = 0``) keeps the array object but must give it another buffer:
    the old one is still referenced here, so it cannot be reused for the
    write. So an unchanged address means unchanged bytes, without reading
    them. The reference can keep replaced weights alive until the next
    digest of the model, or until the model is collected."""

    def __init__(self, params):
        self.ids = tuple((name, id(w)) for name, w in params)
        self.values = [copy.copy(w) for _, w in params]
        self.addresses = [_address(w) for _, w in params]
        self.hex = _hash_weights(params)

    def holds(self, params) -> bool:
        return (tuple((name, id(w)) for name, w in params) == self.ids
                and all(a is not None and _address(w) == a
                        for (_, w), a in zip(params, self.addresses)))


_DIGESTS: Dict[int, _Digest] = {}  # id(model) -> its last digest, dropped with the model


def weights_digest(model: nn.Module, params=None) -> str:
    """Identity of the weights: every name, shape, dtype and byte. A sampled
    hash could miss an edit and reuse a stale verdict. Hashing costs ~0.4 s
    per GB on two cores (:func:`_hash_weights`), so it is remembered per
    model until a parameter is replaced (loading, updating) or edited in
    place (see :class:`_Digest`).
    ``params``: ``tree_flatten(model.parameters())`` if the caller has it."""
    if params is None:
        params = tree_flatten(model.parameters())
    held = _DIGESTS.get(id(model))
    if held is None or not held.holds(params):
        if held is None:
            weakref.finalize(model, _DIGESTS.pop, id(model), None)
        held = _DIGESTS[id(model)] = _Digest(params)
    return held.hex


# Bytes hashed per piece: a large array is cut so that its pieces hash in parallel.
PIECE = 1 << 26


def _sha(piece) -> bytes:
    return hashlib.sha256(piece).digest()  # releases the GIL for a large buffer


def _hash_weights(params) -> str:
    """A tree of sha256 digests: every parameter's name, shape and dtype,
    then each PIECE bytes of it hashed apart, on every core (hashing one
    stream took about 1 s per GB on one core). Every byte is read: any edit
    changes its piece's digest and so the whole."""
    heads, pieces = [], []  # per parameter: its header and how many pieces it has
    for name, w in params:
        c = mx.contiguous(w)  # row-major: the logical order, whatever the strides
        data = memoryview(c.view(mx.uint8) if c.dtype == mx.bfloat16 else c).cast("B")
        mine = [data[i:i + PIECE] for i in range(0, len(data), PIECE)]
        heads.append((f"{name}:{w.shape}:{w.dtype}:{len(data)}".encode(), len(mine)))
        pieces += mine
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        digests = iter(pool.map(_sha, pieces))
        h = hashlib.sha256()
        for head, n in heads:
            h.update(head)
            h.update(b"".join(next(digests) for _ in range(n)))
    return h.hexdigest()[:16]
