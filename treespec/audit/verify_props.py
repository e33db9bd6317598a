"""Audit properties of the adapter and its verify: the adapter exists and
only reads in ``check``; a linear tree's rows equal one plain forward
(contract 6 on chains); every node of a branching tree equals a plain
forward over its root path, in every cache mode (contract 6). On a
sliding-window ring the reference is classic decoding's one-token steps
(``states.classic``): the verify lays the ring out as they see it."""

import functools
import random
from typing import List

import mlx.core as mx

from ..evidence import numerics
from ..evidence.isolation import isolation, leak
from ..evidence.node_rows import against
from ..evidence.same_width import width_reason
from ..errors import TreeRefused
from ..tree import DraftTree
from .records import FAIL, PASS, Check, Tally, once
from .states import (
    CacheMode,
    base_cache,
    branching_trees,
    classic,
    clone,
    envelope,
    fingerprint,
    histories,
    random_tree,
    root_path_forwards,
)
from .subject import Subject, the_adapter, the_walk, vocab, window


def check_adapter(s: Subject) -> List[Check]:
    """The adapter exists (or the family's refusal, by name), has the
    TreeAdapter interface, and its ``check`` only reads."""
    try:
        adapter = the_adapter(s)
    except TreeRefused as e:
        return [Check("adapter", FAIL, f"refused ({s.adapter_source}): {e}",
                      {"message": str(e), "family": e.family})]
    missing = [m for m in ("verify", "commit", "check") if not callable(getattr(adapter, m, None))]
    if missing:
        return [Check("adapter", FAIL, f"{adapter!r} from {s.adapter_source} lacks "
                      f"{', '.join(missing)} (TreeAdapter interface)", {"missing": missing})]
    hist = histories(s)[3]
    cache = base_cache(s, hist, CacheMode())
    before = fingerprint(cache)
    tree = random_tree(random.Random(f"{s.options.seed}:adapter"), vocab(s), 7)
    note = ""
    try:
        adapter.check(tree, cache)
    except TreeRefused as e:
        note = f"; check refuses a branching tree: {e.reason}"
    if fingerprint(cache) != before:
        return [Check("adapter", FAIL, "check() wrote into the cache (it must only read)",
                      {"message": "check() changed the cache", "history": hist.label(window(s.model))})]
    walk = the_walk(s)[1]
    return [Check("adapter", PASS, f"{adapter!r} from {s.adapter_source}; walk {walk}{note}")]


def check_linear_verify(s: Subject) -> List[Check]:
    """A linear tree's verify rows equal one plain forward over the chain
    (what mlx-lm's speculative decoding runs; on a sliding-window ring the
    chain's one-token steps, as classic decoding and the ring layout see
    it), from the same cache state."""
    adapter, model = the_adapter(s), s.model
    rng = random.Random(f"{s.options.seed}:linear")
    v, w = vocab(s), window(model)
    lengths = sorted({1, 2, s.options.block, s.options.block + 2} | ({w + 3} if w and w <= 32 else set()))
    tally = Tally(s.options)
    for hist in histories(s):
        base = base_cache(s, hist, CacheMode())
        for n in lengths:
            tree = DraftTree.linear([rng.randrange(v) for _ in range(n)])
            logits = _verify_copy(tally, adapter, tree, base, hist, w, f"chain of {n}", "refused")
            if logits is None:
                continue
            ref = classic(model, clone(base), tree.tokens)
            where = {"history": hist.label(w), "chain": n, "tree": list(tree.parents)}
            if logits.shape != ref.shape:
                tally.fail({**where, "message": f"verify returned {tuple(logits.shape)}, "
                            f"expected {tuple(ref.shape)}"})
                continue
            env = envelope(s, hist.offset, (n,))
            for i in range(n):
                tally.compare(logits[i], ref[i], {**where, "node": i, "path": list(range(i + 1))},
                              env=env)
    if tally.refused:
        tally.note(f"{len(tally.refused)} chains refused ({tally.refused[0]})")
    return [tally.check("linear-verify", f"rows of chains {lengths} at {len(histories(s))} offsets")]


def _verify_copy(tally, adapter, tree, base, hist, w, what, refused):
    """The evaluated verify logits of ``tree`` on a copy of ``base``, or None
    when the adapter refuses: the refusal is noted and (contract 8) the copy
    must be left as it was."""
    cache = clone(base)
    try:
        logits = adapter.verify(tree, cache)
        mx.eval(logits)
        return logits
    except TreeRefused as e:
        tally.refused.append(f"{refused}: {e.reason}")
        if fingerprint(cache) != fingerprint(base):
            tally.fail({"message": f"a refused verify of a {what} changed the cache",
                        "history": hist.label(w)})
        return None


def check_tree_verify(s: Subject, mode: CacheMode = CacheMode()) -> Check:
    """Every node's verify row equals the last row of a plain forward over
    that node's root path from a copy of the same cache (contract 6)."""
    rng = random.Random(f"{s.options.seed}:tree:{mode.name}")
    hists = histories(s)
    trees = {hist: branching_trees(s, rng) for hist in hists}
    tally, count = verify_trees(s, mode, trees)
    return tally.check(f"tree-verify[{mode.name}]", f"nodes of {count // len(hists)} trees x "
                       f"{len(hists)} offsets")


def verify_trees(s: Subject, mode: CacheMode, trees: dict):
    """Verify each tree of ``trees`` (history -> trees) on a copy of that
    history's cache and compare every node with a plain forward over its
    root path, judged against the envelope at that history's offset.
    Returns (Tally, trees verified)."""
    adapter, model = the_adapter(s), s.model
    w = window(model)
    tally = Tally(s.options)
    count = proven = 0
    unproven = set()  # why a same-width reference proved nothing (treespec.evidence.same_width)
    for hist, hist_trees in trees.items():
        base = base_cache(s, hist, mode)
        for tree in hist_trees:
            count += 1
            logits = _verify_copy(tally, adapter, tree, base, hist, w, f"{len(tree)}-node tree",
                                  "adapter refuses branching trees")
            if logits is None:
                continue
            where = {"history": hist.label(w), "mode": mode.name, "tree": list(tree.parents)}
            if logits.shape[0] != len(tree):
                tally.fail({**where, "message": f"verify returned {logits.shape[0]} rows "
                            f"for {len(tree)} nodes"})
                continue
            refs = root_path_forwards(model, base, tree)
            env = envelope(s, hist.offset, numerics.widths_of(tree, 2), mode)
            # Proven where the rows equal the same root-path forwards at the
            # verify's width, else judged (treespec.evidence.node_rows).
            found = against(model, base, tree, logits, refs, env, verify=adapter.verify)
            if found.rows is not None:
                refs, proven = found.rows, proven + 1
            elif found.why:
                unproven.add(found.why)
            controls = once(functools.partial(numerics.controls, model, base, tree, refs))
            proof = once(functools.partial(isolation, model, base, tree))
            zero = functools.partial(width_reason, model, len(tree))
            leaked = once(functools.partial(leak, model, base, tree))
            taught = None if found.attention is None else once(found.attention)
            for i in range(len(tree)):
                tally.compare(logits[i], refs[i], {**where, "node": i, "path": tree.path_to(i)},
                              env=env, controls=controls, placement=found.placement, isolation=proof,
                              census=zero, leak=leaked, attention=taught)
    if tally.refused and tally.count:
        tally.note(f"{len(tally.refused)} trees refused ({tally.refused[0]})")
    for why in sorted(unproven):
        tally.note(f"judged against the envelope: {why}")
    if proven:
        tally.note(f"{proven} trees bit-exact against mlx-lm's plain forward over each root path "
                   "padded to the verify's width (their own widths differ on this backend; past a "
                   "sliding-window ring, the ring in time order)")
    return tally, count
