"""Accept walks: which drafted tokens the target agreed with.

``chain_walk`` is the accept loop of ``mlx_lm.generate.speculative_generate_step``;
``tree_walk`` is its generalisation, a greedy descent. A linear tree walks
exactly as the chain (pinned in suites/topology).
"""

from dataclasses import dataclass
from typing import Sequence

from .checks import INT32_MAX, integer_array, is_integer
from .tree import DraftTree


def _ids(values, name: str) -> list:
    """Token ids as ints: a -1, a NaN or a None is no token and must not be
    emitted as one."""
    ids = list(integer_array(values, name))
    for i, v in enumerate(ids):
        if type(v) is not int or not 0 <= v <= INT32_MAX:
            if not is_integer(v):
                raise TypeError(f"{name}[{i}]: {v!r} is not an integer token id")
            if not 0 <= v <= INT32_MAX:
                raise ValueError(f"{name}[{i}]: {v} is not a token id (ids are 0..{INT32_MAX})")
            ids[i] = int(v)
    return ids


@dataclass(frozen=True)
class Walk:
    path: tuple  # accepted node indices, starting at the root (0)
    emitted: tuple  # accepted draft tokens, then the target's own token

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def chain_walk(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> Walk:
    """Accept the longest prefix of ``draft_tokens`` that the target agrees with.

    ``target_tokens[i]`` is the target's token after the root and the first
    i drafts, so there is one more of them than of drafts. The emitted tokens
    are the accepted drafts followed by the target's token at the first
    mismatch (or its bonus token when every draft was accepted).
    """
    draft_tokens = _ids(draft_tokens, "draft_tokens")
    target_tokens = _ids(target_tokens, "target_tokens")
    if len(target_tokens) != len(draft_tokens) + 1:
        raise ValueError(
            f"chain_walk needs one target token per draft plus one: "
            f"{len(draft_tokens)} drafts, {len(target_tokens)} target tokens"
        )
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_tokens[n]:
        n += 1
    return Walk(path=tuple(range(n + 1)), emitted=tuple(target_tokens[: n + 1]))


def tree_walk(tree: DraftTree, target_tokens: Sequence[int]) -> Walk:
    """Descend from the root to the child whose token the target chose.

    ``target_tokens[i]`` is the target's token after node i. At most one
    child can match the target's single token; when siblings carry the same
    token the first in node order wins, so the accepted set is a root path.
    """
    if not isinstance(tree, DraftTree):
        # A token list has a length too: refuse it by name before it is read as a tree.
        raise TypeError(f"tree_walk: tree must be a DraftTree, got {type(tree).__name__} "
                        f"(a chain of tokens is DraftTree.linear(tokens); its walk is chain_walk)")
    target_tokens = _ids(target_tokens, "target_tokens")
    if len(target_tokens) != len(tree):
        raise ValueError(
            f"tree_walk needs one target token per node: "
            f"{len(tree)} nodes, {len(target_tokens)} target tokens"
        )
    tokens, parents = tree.tokens, tree.parents
    children = [[] for _ in range(len(tree))]
    for i in range(1, len(tree)):
        children[parents[i]].append(i)
    path = [0]
    while True:
        want = target_tokens[path[-1]]
        nxt = next((c for c in children[path[-1]] if tokens[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
    emitted = [tokens[i] for i in path[1:]] + [target_tokens[path[-1]]]
    return Walk(path=tuple(path), emitted=tuple(emitted))
