"""Audit property of the commit (contract 7): after verify + commit of a
random root path, every cache holds exactly the rows (and recurrent states)
the verify wrote for the path (data movement, bit for bit on every backend:
treespec.audit.movement), and later decode steps give the logits of a cache
that was only ever fed the paths (bit for bit where the backend is exact,
within its envelope elsewhere), in every cache mode."""

import functools
import random
from typing import List

import mlx.core as mx
import numpy as np

from .. import caches
from ..errors import RollbackRefused, TreeRefused
from ..evidence.attention_rows import decode_proof
from ..tree import DraftTree
from .movement import mismatches, moved, recorded
from .records import Check, Tally, once
from .states import (
    CacheMode,
    base_cache,
    classic,
    clone,
    envelope,
    fingerprint,
    histories,
    plain,
    random_tree,
)
from .subject import Subject, the_adapter, vocab, window


def _rollback_paths(tree: DraftTree, d: int, rng) -> List[int]:
    """Root only, the deepest branch in full, or the path to a random node."""
    choice = d % 3
    node = 0 if choice == 0 else int(np.argmax(tree.depths())) if choice == 1 else rng.randrange(len(tree))
    return tree.path_to(node)


def _fed(model, cache, tokens):
    """``cache`` after the reference's forwards over ``tokens``
    (treespec.audit.states.classic)."""
    classic(model, cache, tokens)
    return cache


def check_rollback(s: Subject, mode: CacheMode = CacheMode()) -> Check:
    """Two rounds of verify + commit of a random root path, each leaving
    exactly the rows the verify wrote; then single- and multi-token decode
    steps give the logits of a cache that was only ever fed the paths
    (contract 7)."""
    adapter, model = the_adapter(s), s.model
    rng = random.Random(f"{s.options.seed}:rollback:{mode.name}")
    v, w = vocab(s), window(model)
    tally = Tally(s.options)
    linear_only = None
    verify_differs = None
    moves = 0
    for hist in histories(s)[1:]:
        base = base_cache(s, hist, mode)
        for d in range(s.options.draws):
            ours, ref = clone(base), clone(base)
            committed, widths = [], {1}
            for r in range(2):
                offset = caches.offset(ours)
                tree = random_tree(rng, v, rng.randrange(5, 10), ("random", "mixed")[r])
                before, pre_cache = fingerprint(ours), clone(ours)
                try:
                    with recorded(ours) as writes:
                        logits = adapter.verify(tree, ours)
                except TreeRefused as e:
                    if fingerprint(ours) != before:
                        tally.fail({"message": "a refused verify changed the cache",
                                    "history": hist.label(w), "mode": mode.name})
                    linear_only = linear_only or e.reason
                    tree = DraftTree.linear(tree.tokens[: rng.randrange(2, 6)])
                    try:
                        with recorded(ours) as writes:
                            logits = adapter.verify(tree, ours)
                    except TreeRefused as e:
                        tally.refused.append(f"the adapter refuses chains here too: {e.reason}")
                        break
                mx.eval(logits)
                last = getattr(adapter, "last_verified", None)  # None from an adapter without one
                captures = getattr(last, "captures", None)
                path = _rollback_paths(tree, d + r, rng)
                widths |= {len(tree), len(path)}
                pre = fingerprint(ours)
                try:
                    adapter.commit(ours, tree, path, offset)
                except RollbackRefused as e:
                    if fingerprint(ours) != pre:
                        tally.fail({"message": f"a refused commit changed the cache ({e})",
                                    "history": hist.label(w), "mode": mode.name})
                    tally.refused.append(f"commit refused: {e}")
                    break
                moves += _moved_exactly(tally, ours, pre_cache, writes, path, tree, captures,
                                        {"history": hist.label(w), "mode": mode.name,
                                         "committed": committed + [path]})
                # The reference takes the path as classic decoding would
                # (one-token steps on a sliding-window ring); the proof at the
                # attentions' control, the same with another first token, is
                # fed only if a comparison asks for it.
                tokens = [tree.tokens[j] for j in path]
                branch = once(functools.partial(_fed, model, clone(ref),
                                                [(tokens[0] + 1) % v] + tokens[1:]))
                ref_rows = classic(model, ref, tokens)
                committed.append(path)
                if r == 0 and verify_differs is None and not mx.array_equal(
                        logits[mx.array(path)], ref_rows).item():
                    verify_differs = path
            else:
                where = {"history": hist.label(w), "mode": mode.name, "committed": committed}
                chunks = [[rng.randrange(v)] for _ in range(2)] + [[rng.randrange(v) for _ in range(3)],
                                                                    [rng.randrange(v)]]
                # Where the envelope cannot decide: the caches differ in rows only
                # the attentions read (treespec.evidence.attention_rows); the proof
                # replays the chunks up to the judged one from the states before
                # them (each forward below moves the caches on).
                first = (clone(ours), clone(ref))
                for k, chunk in enumerate(chunks):
                    widths.add(len(chunk))
                    env = envelope(s, caches.offset(ours), tuple(widths), mode)
                    taught = once(lambda calls=chunks[:k + 1], first=first, stale=branch:
                                  decode_proof(model, *first, calls, stale()))
                    a, b = plain(model, ours, chunk), plain(model, ref, chunk)
                    tally.compare(a, b, {**where, "step": k, "tokens": chunk}, env=env,
                                  attention=taught)
    if linear_only:
        tally.note(f"linear trees only: the adapter refuses branching trees ({linear_only})")
    if tally.refused:
        tally.note(f"{len(tally.refused)} commits refused ({tally.refused[0]})")
    if moves:
        tally.note(f"{moves} commits kept exactly the rows the verify wrote")
    if tally.failures and verify_differs is not None:
        tally.note(f"the verify rows along path {verify_differs} already differed from the "
                   "reference's (see tree-verify)")
    return tally.check(f"rollback[{mode.name}]", "later decode steps")


def _moved_exactly(tally, ours, pre, writes, path, tree, captures, where) -> int:
    """Data movement: the committed caches hold exactly what the verify wrote
    for ``path`` (bit for bit, every backend). 1 if checked, 0 if the adapter
    exposes no recurrent captures to check a recurrent layer with."""
    try:
        bad = mismatches(ours, moved(pre, writes, path, len(tree), captures, ours))
    except ValueError:
        return 0
    if bad:
        tally.fail({**where, "message": f"the commit left other rows than the verify wrote "
                    f"({', '.join(bad[:3])})"})
    return 1
