"""DraftTree: the topology of one speculative round, and the masks and
positions a verify forward needs.

Node 0 is the root: the last committed token, which the target has not seen
yet. Nodes are in topological order (``parents[i] < i``), so a node's depth,
its ancestors and its mask row are all known when it is added.

Everything here is plain Python/numpy; ``mask``, ``additive_mask`` and
``positions`` convert to ``mx.array`` at the very end.
"""

from numbers import Integral
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

from .checks import INT32_MAX, is_integer
from .errors import TreeError


def _as_token(value, node: int) -> int:
    if type(value) is int and 0 <= value <= INT32_MAX:  # the common case, without the ABC checks
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise TreeError(f"node {node}: token {value!r} is not an integer")
    if value < 0:
        raise TreeError(f"node {node}: token {value} is negative")
    if value > INT32_MAX:
        raise TreeError(f"node {node}: token {value} does not fit an int32 token id")
    return int(value)


def _count(value, name: str, minimum: int) -> int:
    """An offset, history length or window: an integer (never a bool or a
    float: a NaN window would mask every key) at least ``minimum``."""
    if type(value) is not int:
        if not is_integer(value):
            raise TreeError(f"{name} must be an integer, got {value!r}")
        value = int(value)
    if value < minimum:
        raise TreeError(f"{name} must be >= {minimum}, got {value}")
    return value


def _as_parent(value, node: int) -> int:
    if type(value) is int and (value == -1 if node == 0 else 0 <= value < node):
        return value  # the common case: every check below would pass
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise TreeError(f"node {node}: parent {value!r} is not an integer")
    value = int(value)
    if node == 0:
        if value != -1:
            raise TreeError(f"node 0 is the root and must have parent -1, got {value}")
    elif value == -1:
        raise TreeError(f"node {node}: a second root (parent -1); only node 0 is a root")
    elif not 0 <= value < node:
        raise TreeError(
            f"node {node}: parent {value} must be an earlier node (0 <= parent < {node})"
        )
    return value


class DraftTree:
    """Tokens and parent links of a draft tree, validated on construction."""

    def __init__(self, tokens: Sequence[int], parents: Sequence[int]):
        tokens, parents = list(tokens), list(parents)
        if len(tokens) == 0:
            raise TreeError("a tree needs at least the root node (node 0); got no tokens")
        if len(parents) != len(tokens):
            raise TreeError(
                f"parents has {len(parents)} entries for {len(tokens)} tokens; "
                f"node {min(len(parents), len(tokens))} is the first without a match"
            )
        # Validate everything before storing anything: no partial object.
        toks = [_as_token(t, i) for i, t in enumerate(tokens)]
        pars = [_as_parent(p, i) for i, p in enumerate(parents)]
        self._tokens = toks
        self._parents = pars
        self._depths = [0]
        for p in pars[1:]:
            self._depths.append(self._depths[p] + 1)
        self._ancestry = None
        self._derived = {}  # device arrays derived from the topology (see derived)

    def with_tokens(self, tokens: Sequence[int]) -> "DraftTree":
        """A tree of this topology carrying ``tokens``: only the tokens are
        validated (the topology was, once), and the topology's derived
        arrays (ancestry, masks, depths) are shared, not rebuilt. What a
        drafter does every round with the tokens of a fixed shape."""
        tokens = list(tokens)
        if len(tokens) != len(self._tokens):
            raise TreeError(f"{len(tokens)} tokens for a tree of {len(self._tokens)} nodes")
        out = object.__new__(DraftTree)
        out._tokens = [_as_token(t, i) for i, t in enumerate(tokens)]
        # Copies: push_child on either tree must not grow the other.
        out._parents, out._depths = list(self._parents), list(self._depths)
        out._ancestry = self.ancestry()
        out._derived = self._derived
        return out

    def derived(self, key, build):
        """``build()`` once per topology and ``key`` (a mask for one history
        length and window, the depths as a device array, ...): what every
        verify of the same shape would otherwise rebuild. Shared by the
        trees ``with_tokens`` makes; dropped when a node is pushed."""
        d = self._derived
        if key not in d:
            d[key] = build()
        return d[key]

    @classmethod
    def linear(cls, tokens: Sequence[int]) -> "DraftTree":
        """A chain: ``tokens[0]`` is the root, each node the child of the last."""
        return cls(tokens, list(range(-1, len(tokens) - 1)))

    def push_child(self, parent: int, token: int) -> int:
        """Add a node below ``parent`` and return its index."""
        node = len(self._tokens)
        token = _as_token(token, node)
        if isinstance(parent, (bool, np.bool_)) or not isinstance(parent, Integral):
            raise TreeError(f"node {node}: parent {parent!r} is not an integer")
        if not 0 <= parent < node:
            raise TreeError(
                f"node {node}: parent {parent} must be an existing node (0 <= parent < {node})"
            )
        self._tokens.append(token)
        self._parents.append(int(parent))
        self._depths.append(self._depths[parent] + 1)
        self._ancestry = None
        self._derived = {}
        return node

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"DraftTree(tokens={self._tokens}, parents={self._parents})"

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, DraftTree)
            and self._tokens == other._tokens
            and self._parents == other._parents
        )

    @property
    def tokens(self) -> tuple:
        return tuple(self._tokens)

    @property
    def parents(self) -> tuple:
        return tuple(self._parents)

    def depths(self) -> np.ndarray:
        return np.array(self._depths, dtype=np.int64)

    def depth(self) -> int:
        """Depth of the deepest node (0 for a root-only tree)."""
        return max(self._depths)

    def is_linear(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self._parents))

    def _node(self, node) -> int:
        if type(node) is not int:
            if not is_integer(node):
                raise TreeError(f"node {node!r} is not an integer node index")
            node = int(node)
        if not 0 <= node < len(self):
            raise TreeError(f"node {node} is not in a tree of {len(self)} nodes")
        return node

    def path_to(self, node: int) -> list:
        """Node indices from the root to ``node``, inclusive."""
        node = self._node(node)
        path = []
        while node != -1:
            path.append(node)
            node = self._parents[node]
        return path[::-1]

    def children(self, node: int) -> list:
        """Children of ``node`` in node order (the walk's tie-break order)."""
        node = self._node(node)
        return [i for i, p in enumerate(self._parents) if p == node]

    def leaves(self) -> list:
        has_child = set(self._parents[1:])
        return [i for i in range(len(self)) if i not in has_child]

    def ancestry(self) -> np.ndarray:
        """``[n, n]`` bool: row i is True at i and at each ancestor of i."""
        if self._ancestry is None:
            n = len(self)
            anc = np.zeros((n, n), dtype=bool)
            for i, p in enumerate(self._parents):
                if p >= 0:
                    anc[i, :i] = anc[p, :i]
                anc[i, i] = True
            self._ancestry = anc
        return self._ancestry

    def mask_np(
        self,
        offset: int = 0,
        window_size: Optional[int] = None,
        history: Optional[int] = None,
    ) -> np.ndarray:
        """The bool mask as numpy, ``[n, history + n]``.

        Node i sits at position ``offset + depth(i)``. The ``history`` cached
        keys (default: all ``offset`` of them) sit at positions
        ``offset - history .. offset - 1``; a rotating cache keeps fewer
        keys than it has seen, so its caller passes the kept count. A window
        keeps key position k for query position q when ``q - k < window``,
        exactly as ``create_causal_mask`` does.
        """
        offset = _count(offset, "offset", 0)
        history = offset if history is None else _count(history, "history", 0)
        if history > offset:
            raise TreeError(f"history {history} must lie in 0..offset ({offset})")
        if window_size is not None:
            window_size = _count(window_size, "window_size", 1)
        depths = np.asarray(self._depths)
        n = len(self)
        mask = np.empty((n, history + n), dtype=bool)
        mask[:, history:] = self.ancestry()
        if window_size is None:
            mask[:, :history] = True
        else:
            qpos = offset + depths
            kpos = np.arange(offset - history, offset)
            mask[:, :history] = qpos[:, None] < kpos[None, :] + window_size
            mask[:, history:] &= depths[:, None] < depths[None, :] + window_size
        return mask

    def mask(
        self,
        offset: int = 0,
        window_size: Optional[int] = None,
        history: Optional[int] = None,
    ) -> mx.array:
        """Bool ``mx.array`` ``[n, history + n]``, True where a node may attend,
        in the convention of ``mlx_lm.models.base.create_causal_mask``."""
        return mx.array(self.mask_np(offset, window_size, history))

    def additive_mask(
        self,
        offset: int = 0,
        window_size: Optional[int] = None,
        dtype: mx.Dtype = mx.float32,
        history: Optional[int] = None,
    ) -> mx.array:
        """0 where allowed, the dtype's most negative finite value elsewhere.

        Finite, not -inf, so that a fully masked row gives a uniform softmax
        instead of NaN."""
        allowed = self.mask_np(offset, window_size, history)
        neg = mx.array(mx.finfo(dtype).min, dtype)
        return mx.where(mx.array(allowed), mx.array(0, dtype), neg)

    def positions_np(self, offset: int = 0) -> np.ndarray:
        offset = _count(offset, "offset", 0)
        if offset + self.depth() > INT32_MAX:
            raise TreeError(f"offset {offset}: positions up to {offset + self.depth()} do not "
                            "fit int32 (mx.fast.rope's offsets)")
        return offset + np.asarray(self._depths, dtype=np.int32)

    def positions(self, offset: int = 0) -> mx.array:
        """int32 ``offset + depth`` per node: a node's position is its depth,
        never its flattened index."""
        return mx.array(self.positions_np(offset))


def first_choice_order(parents: Sequence[int]) -> list:
    """The node order that puts every node's first child right after it:
    a preorder in which each node's children are visited in their own order
    (a drafter numbers a node's children best first). ``order[k]`` is the
    old index of new node k. Its first nodes are then the path of first
    choices (root, its first child, that child's first child, ...), so a
    round that accepts first choices keeps a prefix of the verified block and
    its commit moves no cache row (treespec.rows.Tail.first_moved). A
    preorder is topological: every prefix of it is a tree."""
    parents = [int(p) for p in parents]
    children = [[] for _ in parents]
    for i, p in enumerate(parents[1:], 1):
        children[p].append(i)
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children[node]))
    return order


def renumbered(parents: Sequence[int], order: Sequence[int]) -> list:
    """The parent list of the same tree with node ``order[k]`` renamed k."""
    where = {old: new for new, old in enumerate(order)}
    return [-1] + [where[int(parents[old])] for old in order[1:]]


def consecutive(indices: Sequence[int]) -> Optional[slice]:
    """``indices`` as the slice that reads them when they are consecutive
    and increasing (a run of rows one slice reads, no gather), else None."""
    if indices and list(indices) == list(range(indices[0], indices[-1] + 1)):
        return slice(indices[0], indices[-1] + 1)
    return None
