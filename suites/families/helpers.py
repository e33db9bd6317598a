"""The family sweep: every model module of the installed mlx-lm, built tiny from
its own ModelArgs (helpers_configs), seeded, verified through ``adapter_for``
against plain forwards over root paths, committed, decoded on.

References are mlx-lm's own forwards on deep copies of the same cache state,
with one rule for recurrent layers: a module handed an ``ArraysCache`` (the
outermost one: a decoder layer, or the mixer itself) runs its tokens one at a
time, as classic decoding runs them (``stepped``). For most mixers that is
bit for bit the multi-token forward; where mlx-lm's multi-token scan and its
one-token step differ (the Mamba2 family), classic decoding steps, and so
does the tree verify.

Each history also verifies a chain (mlx-lm's own chain verify: a plain
forward) and commits a prefix of it, which the recurrent layers replay; the
reference is a cache fed only the prefix. Where mlx-lm's forward over the
prefix alone differs from the same rows of its forward over the chain
(measured in the same run: bailing_hybrid's chunked linear attention) the
commit inherits that, and the line says so.

On a sliding-window ring the reference steps the whole model one token at
a time: a one-token step sums a wrapped ring's keys in slot order, a
multi-token forward in time order, and treespec verifies as the steps do
(treespec.ring).

Multi-head latent attention (a ``MultiLinear`` child: deepseek_v3 and the
families built on it) takes a code path of its own for one token (its
``L == 1`` branch), so classic decoding's rows are not a multi-token
forward's there: for those models the reference steps the whole model one
token at a time, as classic decoding does, and treespec verifies their
nodes as one-token steps (treespec.verify.per_node). Where it keeps the
multi-token path (an attention that selects its keys: deepseek_v32,
glm_moe_dsa) every row must instead equal mlx-lm's multi-token forward over
the node's root path, and that forward must itself differ from the steps
(mlx-lm disagreeing with itself, measured in the same run): verdict
MULTI_TOKEN, pinned per family by the test.

One more documented difference is accepted, and only where it is measured in
the same run: on a wrapped sliding window the ROOT row of a verify is
computed by the multi-token path over the ring in time order, and differs
from the root's own one-token forward. It is accepted when it equals row 0
of a two-token forward over the root and its first child and that row itself
differs from the one-token forward. Anything else that differs is WRONG.

Every branch commit is also checked as data movement, bit for bit on every
backend: the cache it leaves holds exactly the rows (and recurrent states)
the verify itself wrote for the path (treespec.audit.movement), whatever the
backend's arithmetic. Where a family's rows are not bit for bit the
references' and the backend is not exact, :func:`envelope_verdict` judges
them against the backend's envelope instead (suites/verify's rule).

    run(name, factory) Outcome: verdict, detail, notes, commits not kept exactly
    envelope_verdict(outcome)  the outcome's rows judged against the envelope

The models and the reference forwards are helpers_models'.
"""

import copy
from dataclasses import dataclass, field
from typing import Callable, List

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from suites.families.helpers_models import maxdiff, build, forward, latent
from treespec.evidence import node_rows, numerics
from treespec.audit.movement import mismatches, moved, recorded
from treespec.caches import leaves
from treespec.errors import RollbackRefused, TreeRefused
from treespec.tree import DraftTree
from treespec.verify import adapter_for

PARENTS = [-1, 0, 0, 1, 1, 2, 4]  # branching: siblings at depths 1 and 2
PATH = [0, 1, 4, 6]  # moves rows (node 4 at slot 2, node 6 at slot 3)
SHORT, LONG = 12, 28  # inside and past every window (helpers_configs.W = 16)

CONTRACT = "families: sweep = mlx-lm forwards"  # its row in the verdict table
EXACT, ROOT_ROW, MULTI_TOKEN, REFUSED, CANNOT_RUN, WRONG = (
    "exact", "exact (root row: multi-token path)", "exact (multi-token path)", "refused",
    "cannot run", "WRONG")


# -- one family ---------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    verdict: str
    detail: str = ""
    notes: List[str] = field(default_factory=list)
    unmoved: str = ""  # a commit that kept other rows than the verify wrote, and where
    model: object = field(default=None, repr=False)
    # per history: (label, context, cache before the verify, verify rows, references,
    # the verify that gave the rows)
    judged: list = field(default_factory=list, repr=False)

    def line(self) -> str:
        extra = "".join(f"; {n}" for n in self.notes)
        return f"{self.name:24s} {self.verdict}{': ' + self.detail if self.detail else ''}{extra}"


def _check_history(model, adapter, prompt, tree, decode) -> dict:
    """Verify, compare, commit, decode on, from one history."""
    cache = make_prompt_cache(model)
    forward(model, cache, prompt, stepped=False)
    before = copy.deepcopy(cache)
    with recorded(cache) as writes:
        rows = adapter.verify(tree, cache)
    mx.eval(rows)
    # the recurrent inputs the verify recorded (its commit consumes them)
    captures = getattr(getattr(adapter, "_last", None), "captures", None)
    steps = latent(model)  # the reference is classic decoding itself
    diffs, plain_ok, refs = [], {}, []
    for i in range(len(tree)):
        path = [tree.tokens[j] for j in tree.path_to(i)]
        ref = forward(model, copy.deepcopy(before), path, whole=steps)[-1]
        refs.append(ref)
        diffs.append(maxdiff(ref, rows[i]))
        if steps and diffs[-1] and len(path) > 1:
            # kept on the multi-token path: documented only where the row is
            # mlx-lm's multi-token forward and that differs from the steps
            plain = forward(model, copy.deepcopy(before), path)[-1]
            plain_ok[i] = maxdiff(plain, rows[i]) == 0.0 and maxdiff(plain, ref) > 0
    res = {"diffs": diffs, "judged": (before, rows, mx.stack(refs), adapter.verify), "wrapped": any(
        type(c) is RotatingKVCache and c.offset >= c.max_size for _, c in leaves(before))}
    if diffs[0]:
        two = forward(model, copy.deepcopy(before), [tree.tokens[0], tree.tokens[1]])[0]
        one = forward(model, copy.deepcopy(before), [tree.tokens[0]])[-1]
        res["root_documented"] = maxdiff(two, rows[0]) == 0.0 and maxdiff(two, one) > 0
    res["multi_token"] = bool(plain_ok) and all(
        plain_ok.get(i, False) or (i == 0 and res.get("root_documented", False))
        for i, d in enumerate(diffs) if d)
    deep = [tree.tokens[j] for j in tree.path_to(len(tree) - 1)]
    res["scan_vs_step"] = maxdiff(forward(model, copy.deepcopy(before), deep, stepped=False)[-1],
                                   forward(model, copy.deepcopy(before), deep)[-1])
    adapter.commit(cache, tree, PATH)
    # the reference cache is fed as the verify computed: one-token steps, or
    # (kept on the multi-token path) mlx-lm's multi-token forward
    fed_steps = steps and not res["multi_token"]
    ref = copy.deepcopy(before)
    forward(model, ref, [tree.tokens[j] for j in PATH], whole=fed_steps)
    res["unmoved"] = _not_kept(before, writes, captures, tree, cache, ref)
    res["commit"] = _decode_diff(model, cache, ref, decode)
    # A chain is mlx-lm's own chain verify (a plain forward, recurrent layers
    # through their multi-token path; a ring laid out as one-token steps see
    # it); its commit replays the kept prefix.
    ring = any(type(c) is RotatingKVCache for _, c in leaves(before))
    chain, cache = DraftTree.linear(tree.tokens[:4]), copy.deepcopy(before)
    mx.eval(adapter.verify(chain, cache))
    adapter.commit(cache, chain, [0, 1, 2])
    ref = copy.deepcopy(before)
    forward(model, ref, chain.tokens[:3], stepped=ring, whole=fed_steps)
    res["chain_commit"] = _decode_diff(model, cache, ref, decode)
    if res["chain_commit"]:
        # Only documented where mlx-lm disagrees with itself: its forward over
        # the kept prefix alone against the same rows of the chain's forward.
        alone = forward(model, copy.deepcopy(before), chain.tokens[:3], stepped=False)
        whole = forward(model, copy.deepcopy(before), chain.tokens, stepped=False)
        res["prefix"] = maxdiff(alone, whole[:3])
    return res


def _not_kept(before, writes, captures, tree, committed, ref) -> str:
    """Data movement, bit for bit on every backend: what differs between the
    committed cache and the verify's own rows (and kept recurrent states) of
    PATH fed to a copy of ``before`` ('' when nothing does). A field that
    differs from that replay but is bit for bit ``ref``'s (a cache fed only
    the path by mlx-lm) is one the model writes itself outside its cache's
    update (deepseek_v32's indexer zeroes its values after each update): the
    commit kept what classic decoding would hold there."""
    try:
        expected = moved(copy.deepcopy(before), writes, PATH, len(tree), captures, committed)
        bad = set(mismatches(committed, copy.deepcopy(ref)))
        return ", ".join([m for m in mismatches(committed, expected) if m in bad][:3])
    except ValueError as e:  # a layer it cannot check: say so rather than pass it
        return f"not checkable: {e}"


def _decode_diff(model, ours, ref, tokens) -> float:
    """Worst difference of one-token decode steps on two caches."""
    return max(maxdiff(forward(model, ours, [t])[-1], forward(model, ref, [t])[-1])
               for t in tokens)


def _inputs():
    """(prompt, tree, decode tokens): the same for every family."""
    rng = np.random.RandomState(1)
    prompt = [int(t) for t in rng.randint(0, 256, LONG)]
    tree = DraftTree([int(t) for t in rng.randint(0, 256, len(PARENTS))], PARENTS)
    return prompt, tree, [int(t) for t in rng.randint(0, 256, 3)]


def run(name: str, factory: Callable = adapter_for, model=None) -> Outcome:
    """Build (unless ``model`` is given), verify, commit and decode one
    family; its verdict."""
    try:
        model = build(name) if model is None else model
    except BaseException as e:  # an import may sys.exit (olmo needs ai2-olmo)
        return Outcome(name, CANNOT_RUN, f"mlx-lm cannot build it: {type(e).__name__}: {e}"[:200])
    prompt, tree, decode = _inputs()
    try:
        forward(model, make_prompt_cache(model), prompt[:SHORT], stepped=False)
    except Exception as e:
        return Outcome(name, CANNOT_RUN, f"mlx-lm's own forward fails on this CPU: "
                       f"{type(e).__name__}: {e}"[:200])
    try:
        adapter = factory(model)
    except TreeRefused as e:
        return Outcome(name, REFUSED, e.reason)
    notes, root_rows, wrong, scan, prefix, chain, multi_token = [], [], [], 0.0, 0.0, 0.0, 0.0
    unmoved, judged = [], []
    for label, p in (("short", prompt[:SHORT]), ("long", prompt)):
        try:
            res = _check_history(model, adapter, p, tree, decode)
        except (TreeRefused, RollbackRefused) as e:
            return Outcome(name, REFUSED, f"{label} history: {e}")
        judged.append((label, len(p), *res["judged"]))
        if res["unmoved"]:
            unmoved.append(f"{label} history: {res['unmoved']}")
        bad = [] if res["multi_token"] else [
            i for i, d in enumerate(res["diffs"]) if d and not (i == 0 and res.get("root_documented"))]
        if res["multi_token"]:
            multi_token = max(multi_token, max(res["diffs"]))
        chain_documented = res["chain_commit"] and res.get("prefix", 0) > 0
        if chain_documented:
            prefix = max(prefix, res["prefix"])
            chain = max(chain, res["chain_commit"])
        if bad or res["commit"] or (res["chain_commit"] and not chain_documented):
            wrong.append(f"{label} history: nodes {bad} differ by up to "
                         f"{max(res['diffs']):.3g}, decode after commit by {res['commit']:.3g}, "
                         f"after a chain's commit by {res['chain_commit']:.3g}")
        if res["diffs"][0] and not bad and not res["multi_token"]:
            why = "a wrapped window's ring order" if res["wrapped"] else "its own one-token path"
            root_rows.append(f"{label} history {res['diffs'][0]:.2g} ({why})")
        scan = max(scan, res["scan_vs_step"])
    if scan:
        notes.append(f"mlx-lm's multi-token forward differs from its one-token steps by up to "
                     f"{scan:.2g}; the verify equals the steps")
    if prefix:
        notes.append(f"mlx-lm's forward over 3 tokens differs from the first 3 rows of its "
                     f"forward over 4 by {prefix:.2g}: a chain's commit inherits it ({chain:.2g})")
    if unmoved:
        notes.append(f"the commit kept other rows than the verify wrote: {'; '.join(unmoved)}")
    kept = dict(unmoved="; ".join(unmoved), model=model, judged=judged)
    if wrong:
        return Outcome(name, WRONG, "; ".join(wrong), notes, **kept)
    if multi_token:
        return Outcome(name, MULTI_TOKEN, f"every row is mlx-lm's multi-token forward over its "
                       f"root path, {multi_token:.2g} from its one-token steps", notes + root_rows,
                       **kept)
    if root_rows:
        return Outcome(name, ROOT_ROW, f"root row vs the root's one-token step: "
                       f"{', '.join(root_rows)}", notes, **kept)
    return Outcome(name, EXACT, "", notes, **kept)


# -- where the backend is not exact ---------------------------------------------

def envelope_verdict(outcome: Outcome) -> numerics.Verdict:
    """The family's verify rows from both histories against the sweep's own
    references (classic decoding over each node's root path), both as
    :func:`run` computed them, judged as suites/verify judges its trees
    (treespec.evidence.node_rows.verdict: the same-width forwards, then the
    backend's envelope with the proof at the attentions), the worse of the two
    histories. For a backend that is not bit-exact, where comparing bit for
    bit says nothing.

    The negative controls are numerics' (treespec.evidence.numerics.control_rows:
    flattened positions, a causal mask, a leaked sibling, the tree through
    the unmodified recurrence; those this model can express)."""
    model, verdicts = outcome.model, []
    tree = _inputs()[1]
    for label, context, before, rows, refs, verify in outcome.judged:
        env = lambda n=context: numerics.envelope(model, n, numerics.widths_of(tree, 2))
        controls = lambda b=before, r=refs: numerics.controls(model, b, tree, r)
        verdicts.append(node_rows.verdict(
            model, before, tree, rows, refs, env, f"{label} history, node rows vs classic decoding",
            verify=verify, controls=controls))
    return numerics.worst(verdicts)
