"""Audit properties of the walk: on linear trees it is mlx-lm's chain accept
loop (contract 2); on branching trees with duplicate siblings it is the
greedy descent, first child wins (contract 3)."""

import random
from typing import List, Optional, Sequence

from ..tree import DraftTree
from ..walk import chain_walk
from .records import PASS, Check, Tally
from .states import random_tree
from .subject import Subject, the_walk


def check_walk_linear(s: Subject) -> List[Check]:
    """On linear trees the walk accepts and emits exactly what mlx-lm's
    chain accept loop does, at every accept length (contract 2)."""
    walk, source = the_walk(s)
    rng = random.Random(f"{s.options.seed}:walk-linear")
    tally = Tally(s.options)
    for n in range(0, 9):
        for accept in range(0, n + 1):
            drafts = [rng.randrange(16) for _ in range(n)]
            targets = drafts[:accept]
            if accept < n:
                targets.append((drafts[accept] + 1 + rng.randrange(15)) % 16)
            targets += [rng.randrange(16) for _ in range(n + 1 - len(targets))]
            tree = DraftTree.linear([rng.randrange(16)] + drafts)
            want = chain_walk(drafts, targets)
            try:
                got = walk(tree, targets)
                got = (tuple(got.path), tuple(got.emitted))
            except Exception as e:  # a walk that crashes fails the property
                got = f"{type(e).__name__}: {e}"
            if got == (want.path, want.emitted):
                tally.count += 1
            else:
                tally.fail({"message": f"drafts {drafts}, targets {targets}: {source} gave "
                            f"{_walk_str(got)}, the chain walk path {list(want.path)} "
                            f"emitted {list(want.emitted)}"})
    check = tally.check("walk-linear", "linear walks")
    if check.status == PASS:
        check.detail = (f"{tally.count} linear walks (0-8 drafts, every accept length) by "
                        f"{source} equal mlx-lm's chain accept loop")
    return [check]


def _walk_str(got) -> str:
    if isinstance(got, str):
        return got
    return f"path {list(got[0])} emitted {list(got[1])}"


def walk_violation(tree: DraftTree, targets: Sequence[int], path, emitted) -> Optional[str]:
    """Why (path, emitted) is not the greedy descent of contract 3 (a root
    path; at each node the FIRST child carrying the target's token; stop when
    none does; emit the accepted tokens then the target's token), or None."""
    path, emitted = list(path), list(emitted)
    if not path or path[0] != 0:
        return f"path {path} does not start at the root"
    for a, b in zip(path, path[1:]):
        if not 0 <= b < len(tree) or tree.parents[b] != a:
            return f"path {path} is not a root path (node {b} is not a child of {a})"
    for a, b in zip(path, path[1:]):
        first = next((c for c in tree.children(a) if tree.tokens[c] == targets[a]), None)
        if first is None:
            return f"at node {a} the walk took child {b} though no child carries the target's {targets[a]}"
        if b != first:
            return (f"at node {a} the walk took child {b}, but child {first} comes first with "
                    f"the same token {targets[a]} (first child wins)")
    last = path[-1]
    match = [c for c in tree.children(last) if tree.tokens[c] == targets[last]]
    if match:
        return f"the walk stopped at node {last} though child {match[0]} carries the target's {targets[last]}"
    want = [tree.tokens[i] for i in path[1:]] + [targets[last]]
    if emitted != want:
        return f"emitted {emitted}, expected the accepted tokens then the target's: {want}"
    return None


def check_walk_siblings(s: Subject) -> List[Check]:
    """Random branching trees over a 3-token vocabulary (duplicate siblings
    everywhere): the walk is the greedy descent, first child wins (contract 3)."""
    walk, source = the_walk(s)
    rng = random.Random(f"{s.options.seed}:walk-siblings")
    tally = Tally(s.options)
    for k in range(300):
        tree = random_tree(rng, 3, rng.randrange(2, 16), ("random", "mixed", "fan")[k % 3])
        targets = []
        for i in range(len(tree)):
            kids = tree.children(i)
            targets.append(tree.tokens[rng.choice(kids)] if kids and rng.random() < 0.8
                           else rng.randrange(3))
        try:
            got = walk(tree, targets)
            why = walk_violation(tree, targets, got.path, got.emitted)
        except Exception as e:
            why = f"the walk raised {type(e).__name__}: {e}"
        if not why:
            tally.count += 1
        else:
            tally.fail({"message": f"tree {list(tree.parents)} tokens {list(tree.tokens)}, "
                        f"targets {targets}: {why}", "tree": list(tree.parents)})
    check = tally.check("walk-siblings", "walks")
    if check.status == PASS:
        check.detail = f"{tally.count} walks over duplicate siblings by {source} are greedy, first child wins"
    return [check]
