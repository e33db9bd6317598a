"""Naive references of the topology suite: ancestors and depths by chasing
parent links, independent of DraftTree's own bookkeeping."""


def ancestors_of(parents, i):
    """Naive: chase parent links; the node itself included."""
    seen = set()
    while i != -1:
        seen.add(i)
        i = parents[i]
    return seen


def depth_of(parents, i):
    return len(ancestors_of(parents, i)) - 1
