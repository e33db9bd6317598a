"""Speculative *sampling* over a draft tree: the target's sampling
distribution, exactly, at any temperature / top-k / top-p / min-p.

Three pieces, each reusing what the greedy path already has:

- ``SamplingParams``: the distribution a token is drawn from. It is the one
  ``mlx_lm.sample_utils.make_sampler`` samples: the same filters in the same
  order (``apply_top_p``, ``apply_min_p``, ``apply_top_k`` on log-probs),
  then ``logprobs * (1 / temperature)``; the target and the draft go through
  the very same function (``SamplingParams.probs``).
- ``verify_children`` / ``walk_batch`` / ``sampled_walk``: the stochastic
  acceptance rule, vectorised over a batch of same-shaped trees with numpy
  (treespec.sampling_rule, whose docstring proves it exact).
- ``SampledTreeDrafter`` / ``SampledChainDrafter``: treespec.draft's
  FixedTreeDrafter (cache management, ``_expand``, ``commit``) with its
  top-k children replaced by children drawn *without replacement* from the
  processed draft distribution ``q``; each round reports the ``q`` every
  expanded node's children were drawn from. ``SampledHeadDrafter``: the
  same draws on a hidden-state head's chain or fixed tree.
- ``decode_sampled``: the round loop of ``treespec.rounds.speculative``
  (same Stats, adapter verify/commit, drafter commit, exactness gate), with
  the greedy walk replaced by the sampled one; ``classic_sampled`` is the
  plain baseline (mlx-lm's ``generate_step`` with the same distribution).

Reproducibility: ``seed`` seeds a ``numpy.random.SeedSequence`` whose two
children drive two ``numpy.random.Generator`` (PCG64) streams, one for the
drafter's draws and one for the verifier's coins. Draws are consumed in a
fixed order, so a run is a pure function of (seed, models, prompt,
parameters) wherever the logits are deterministic (the CPU backend's
reference BLAS, where the gate finds tree verify bit-identical).

Not supported, refused by name: logits processors (repetition / presence /
frequency penalties, logit bias) and XTC; temperature 0 is greedy decoding,
which is ``treespec.decoding.decode``.
"""

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

from .checks import integer
from .draft import DraftRound, FixedTreeDrafter
from .draft.dynamic import sampled_dynamic_round
from .draft.head import HeadDrafter, head_refusal
from .errors import OptionError, SamplingRefused
from .kv_options import DEFAULT as DEFAULT_KV
from .options import DecodeOptions, KVOptions
from .rounds import MODES, Loop, classic, speculative
from .sampling_rule import (
    SamplingParams,
    refuse_logits_processors,
    sample_rows,
    sample_without_replacement,
    sampled_walk,
    verify_children,
    walk_batch,
)
from .stats import Result
from .tree import DraftTree

__all__ = ["DEFAULT_BRANCHING", "SampledChainDrafter", "SampledHeadDrafter", "SampledRound",
           "SampledTreeDrafter",
           "SamplingParams", "SamplingRefused", "classic_sampled", "decode_sampled",
           "make_sampled_drafter", "refuse_logits_processors", "sample_rows",
           "sample_without_replacement", "sampled_walk", "speculative_sampled", "streams",
           "verify_children", "walk_batch"]

DEFAULT_BRANCHING = (2, 2, 1)


# ---------------------------------------------------------------------------
# Drafters that sample.
# ---------------------------------------------------------------------------


@dataclass
class SampledRound(DraftRound):
    # tree node -> the processed draft distribution its children were drawn
    # from (float64 [V]); every node with children has one.
    q: dict = None


class _Bound:
    """A sampled drafter's law and draft stream, bound once per run."""

    params: Optional[SamplingParams] = None
    rng: Optional[np.random.Generator] = None

    def bind(self, params: SamplingParams, rng: np.random.Generator):
        self.params, self.rng = params, rng
        return self

    def _check_bound(self):
        if self.params is None or self.rng is None:
            raise ValueError("a sampled drafter needs bind(params, rng) before drafting")


class SampledTreeDrafter(_Bound, FixedTreeDrafter):
    """FixedTreeDrafter whose children are drawn without replacement from
    the processed draft distribution instead of being its top-k.

    The topology is fixed (``branching`` or ``parents``, as FixedTreeDrafter);
    each expanded node's children are the first draws of one Gumbel-top-k
    order of its ``q``. A slot past the support of ``q`` (a tight top-k /
    top-p) would be a token of probability 0: such nodes and their subtrees
    are pruned before the target sees the tree. ``bind(params, rng)`` sets
    the distribution and the random stream (decode_sampled does it)."""

    kind = "sampled-tree"

    def __init__(self, branching=None, parents=None, params: Optional[SamplingParams] = None,
                 rng: Optional[np.random.Generator] = None):
        super().__init__(branching=branching, parents=parents)
        self.params, self.rng = params, rng

    on_device = False  # children are drawn from q on the host

    def _top_needed(self) -> int:
        return 0  # children are drawn from q, not the top-k

    def draft(self, root: int, limit: Optional[int] = None) -> SampledRound:
        self._check_bound()
        self._q, self._order = {}, {}
        rnd = super().draft(root, limit)
        return self._prune(rnd)

    def _children(self, node, k):
        """The first ``k`` draws (token, log q) at fed node ``node``: one
        without-replacement order per node and round, so asking again for
        more children extends the same draw. Past the support of q the
        order continues with the q = 0 tokens (real ids the draft model can
        be fed); ``_prune`` removes them before verify."""
        if node not in self._order:
            q = self.params.probs(self._logits[node])
            order = sample_without_replacement(q, self._kmax, self.rng)
            support = order[order >= 0]
            pad = np.nonzero(q == 0)[0][: self._kmax - support.size]
            self._q[node] = q
            self._order[node] = np.concatenate([support, pad])
        q = self._q[node]
        with np.errstate(divide="ignore"):
            return [(int(t), float(np.log(q[t]))) for t in self._order[node][:k]]

    def _prune(self, rnd: DraftRound) -> SampledRound:
        return pruned(rnd, lambda node: self._q[rnd.fed[node]])

    def describe(self):
        d = super().describe()
        d["kind"] = self.kind
        d["sampling"] = self.params.describe() if self.params else None
        return d


def pruned(rnd: DraftRound, q_at) -> SampledRound:
    """Drop nodes of draft probability 0 under their parent (slots past
    the support of q) with their subtrees; attach to every kept node with
    children the q they were drawn from (``q_at(node)``: the q node
    ``node``'s children were drawn from)."""
    tree, fed = rnd.tree, rnd.fed
    tokens, parents = tree.tokens, tree.parents
    keep, new_index = [0], {0: 0}
    for i in range(1, len(tree)):
        par = parents[i]
        if par in new_index and q_at(par)[tokens[i]] > 0:
            new_index[i] = len(keep)
            keep.append(i)
    if len(keep) == len(tree):
        new_tree, new_fed = tree, list(fed)
    else:
        new_tree = DraftTree([tokens[i] for i in keep],
                             [-1] + [new_index[parents[i]] for i in keep[1:]])
        new_fed = [fed[i] for i in keep]
    q = {j: q_at(keep[j]) for j in set(new_tree.parents[1:])}
    return SampledRound(new_tree, new_fed, rnd.offset, rnd.fed_tree, rnd.logprobs,
                        rnd.forwards, q=q)


class SampledChainDrafter(SampledTreeDrafter):
    """A chain of ``block - 1`` sampled drafts (verify width ``block``):
    the sampled tree with one child per level, so its draft forwards are
    the chain's plain one-token steps."""

    kind = "sampled-chain"

    def __init__(self, block: int, params: Optional[SamplingParams] = None,
                 rng: Optional[np.random.Generator] = None):
        block = integer(block, "block")
        if block < 1:
            raise ValueError(f"chain block must be >= 1 (the root alone), got {block}")
        if block == 1:
            super().__init__(parents=[-1], params=params, rng=rng)
        else:
            super().__init__(branching=[1] * (block - 1), params=params, rng=rng)
        self.block = block

    def describe(self):
        return {"kind": self.kind, "block": self.block, "budget": self.block - 1,
                "sampling": self.params.describe() if self.params else None}


class SampledHeadDrafter(_Bound, HeadDrafter):
    """A hidden-state head's chain or fixed tree (treespec.draft.head) with
    each node's children drawn without replacement from the processed
    head distribution ``q`` instead of its top-k: SampledTreeDrafter's
    draws and pruning on the head's levels (one head forward per depth, as
    greedy). ``q`` is over the target's vocabulary, as the head's logits
    are: an EAGLE-3 head's reduced draft vocabulary gives its other tokens
    logit -inf, so q = 0 there, which the rule allows (it never proposes
    them; the target's mass on them goes to the residual). Mode ``"tree"``
    without a shape: EAGLE-2's dynamic tree with drawn children and no
    pruning after the draw (treespec.draft.dynamic.sampled_dynamic_round
    says why that keeps the rule exact)."""

    def __init__(self, head, mode: str = "chain", block: Optional[int] = None,
                 branching=None, parents=None, params: Optional[SamplingParams] = None,
                 rng: Optional[np.random.Generator] = None, budget: Optional[int] = None,
                 width: Optional[int] = None, depth: Optional[int] = None):
        super().__init__(head, mode, block=block, branching=branching, parents=parents,
                         budget=budget, width=width, depth=depth)
        self.params, self.rng = params, rng

    def _dynamic_round(self, root, logits, hidden, budget) -> SampledRound:
        rnd, q = sampled_dynamic_round(self, root, logits, hidden, budget, self.params.probs,
                                       lambda q, k: sample_without_replacement(q, k, self.rng))
        return pruned(rnd, q.__getitem__)

    def draft(self, root: int, limit: Optional[int] = None) -> SampledRound:
        self._check_bound()
        rnd = super().draft(root, limit)
        if len(rnd.tree) == 1:  # the root alone: no head forward, nothing drawn
            return SampledRound(rnd.tree, rnd.fed, rnd.offset, rnd.fed_tree, q={})
        return rnd

    def _fixed_round(self, root, logits, hidden, budget) -> SampledRound:
        """HeadDrafter._fixed_round's levels with drawn children: at each
        level, every fed row's first ``k`` draws of one Gumbel-top-k order
        of its q (past q's support, the q = 0 tokens, pruned before verify,
        as SampledTreeDrafter pads); node i's token is draw ``rank`` of its
        parent's row."""
        n = budget + 1
        plan = self.levels(n)
        parents, depths = plan.topology.parents, plan.topology.depths()
        tokens, q_of = [root] + [0] * (n - 1), {}
        rows_cache, on_spine, forwards = self.cache, True, 1
        for d, (source, fed_at, rows) in enumerate(plan.levels):
            q = self.params.probs(logits)  # (rows, V), one per fed node of the previous level
            order = sample_without_replacement(q, plan.k, self.rng)
            for r in range(q.shape[0]):  # slots past the support: q = 0 tokens, pruned below
                short = order[r] < 0
                if short.any():
                    order[r, short] = np.nonzero(q[r] == 0)[0][: int(short.sum())]
            flat = order.reshape(-1)
            nodes = [i for i in range(1, n) if depths[i] == d + 1]
            for i, s in zip(nodes, np.array(source).tolist()):
                tokens[i] = int(flat[s])
                q_of[parents[i]] = q[s // plan.k]
            if not rows:
                break
            fed = mx.array(flat[np.array(fed_at)], dtype=mx.int32)[:, None]
            logits, hidden, rows_cache, on_spine = self._level_forward(
                plan, d, fed, hidden, rows, rows_cache, on_spine)
            forwards += 1
        tree = plan.topology.with_tokens(tokens)
        rnd = DraftRound(tree, [0] + [-1] * (n - 1), self._round_offset, DraftTree([root], [-1]),
                         forwards=forwards)
        return pruned(rnd, q_of.__getitem__)

    def describe(self):
        d = super().describe()
        d["kind"] = f"sampled-{self.kind}"
        d["sampling"] = self.params.describe() if self.params else None
        return d


def make_sampled_drafter(mode: str, block: int = 4, branching=None, parents=None):
    if mode == "chain":
        return SampledChainDrafter(block)
    if mode == "tree":
        if branching is None and parents is None:
            branching = DEFAULT_BRANCHING
        return SampledTreeDrafter(branching=branching, parents=parents)
    raise ValueError(f"no sampled drafter for mode {mode!r}")


# ---------------------------------------------------------------------------
# Round loops.
# ---------------------------------------------------------------------------


def streams(seed: int):
    """The run's (draft, verify) generators: two independent PCG64 streams
    spawned from ``SeedSequence(seed)``."""
    a, b = np.random.SeedSequence(int(seed)).spawn(2)
    return np.random.default_rng(a), np.random.default_rng(b)


def classic_sampled(target, prompt: Sequence[int], max_tokens: int, params: SamplingParams,
                    seed: int = 0, eos_token_ids=None, kv: KVOptions = DEFAULT_KV) -> Result:
    """Plain sampling: mlx-lm's ``generate_step`` with a sampler that draws
    from ``params.probs`` with the run's verify stream (the law of
    make_sampler's draws, seeded like the speculative loop)."""
    _, rng = streams(seed)

    def sampler(logprobs):
        p = params.probs(logprobs.reshape(1, -1))
        return mx.array(sample_rows(p, rng.random(1)))

    return classic(target, prompt, max_tokens, eos_token_ids, sampler=sampler,
                   requested={"sampling": params.describe(), "seed": seed}, kv=kv)


def _seed(options: DecodeOptions) -> int:
    """The run's seed: ``options.seed``, 0 when not given."""
    return 0 if options.seed is None else options.seed


def speculative_sampled(target, draft_model, prompt: Sequence[int], drafter: SampledTreeDrafter,
                        params: SamplingParams, options: DecodeOptions,
                        loop: Loop = Loop()) -> Result:
    """rounds.speculative's round loop with the sampled walk (``options``:
    what was asked, its seed among it; ``loop``: how to run it, whose
    walker, readout, fallback and requested this replaces):

        draft (sampled) -> one target forward -> p per node -> sampled walk
        -> commit both caches
    """
    seed = _seed(options)
    draft_rng, verify_rng = streams(seed)
    drafter.bind(params, draft_rng)

    def walker(rnd, logits):
        return sampled_walk(rnd.tree, params.probs(logits), rnd.q, verify_rng)

    max_tokens, eos, kv = options.max_tokens, loop.eos_token_ids, options.kv
    return speculative(target, draft_model, prompt, drafter, options, replace(
        loop, walker=walker, readout=lambda logits: logits,
        fallback=lambda: classic_sampled(target, prompt, max_tokens, params, seed, eos, kv),
        requested={**drafter.describe(), "seed": seed}))


def decode_sampled(target, prompt: Sequence[int], draft_model, options: DecodeOptions,
                   loop: Loop = Loop(), *, drafter: Optional[SampledTreeDrafter] = None,
                   logits_processors=None, min_tokens_to_keep: int = 1) -> Result:
    """Sampled decoding, one entry point, for what ``options`` asks
    (unchecked here: treespec.decoding.decode checks them): ``classic``
    (plain sampling), ``chain`` (a chain of ``block - 1`` sampled drafts,
    block default 4) or ``tree`` (a fixed topology, ``branching`` per level
    or explicit ``parents``, default DEFAULT_BRANCHING), unless ``drafter``
    is given. The emitted text has the law of mlx-lm's
    ``make_sampler(temperature, top_p, min_p, min_tokens_to_keep, top_k)``
    on the target; the run is reproducible from ``options.seed`` (None: 0).
    ``loop``: how to run the rounds (treespec.rounds.Loop: eos_token_ids,
    gate, adapters, on_round). With ``options.draft_head``, ``draft_model``
    is a hidden-state head and the drafts are a SampledHeadDrafter's."""
    refuse_logits_processors(logits_processors)
    params = SamplingParams(options.temperature, options.top_k, options.top_p, options.min_p,
                            min_tokens_to_keep)
    mode, max_tokens = options.mode, options.max_tokens
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if mode == "classic":
        return classic_sampled(target, prompt, max_tokens, params, _seed(options),
                               loop.eos_token_ids, options.kv)
    if draft_model is None:
        raise ValueError(f"mode {mode!r} needs a draft model")
    if options.draft_head:  # draft_model is a hidden-state head (treespec.draft.head)
        why = head_refusal(draft_model, target)
        if why is not None:
            raise OptionError(f"draft_head: {why}")
    if drafter is None and options.draft_head:
        drafter = SampledHeadDrafter(draft_model, mode, block=options.resolved_block,
                                     branching=options.branching, parents=options.parents,
                                     budget=options.budget, width=options.width)
    elif drafter is None:
        drafter = make_sampled_drafter(mode, block=options.resolved_block,
                                       branching=options.branching, parents=options.parents)
    elif not isinstance(drafter, (SampledTreeDrafter, SampledHeadDrafter)):
        raise ValueError(
            f"sampled decoding needs a sampled drafter (SampledChainDrafter / "
            f"SampledTreeDrafter / SampledHeadDrafter), got a {drafter.kind!r} drafter, whose "
            "greedy drafts carry no draft distribution to verify against")
    elif drafter.reads_hidden != bool(options.draft_head) or (
            drafter.reads_hidden and drafter.head is not draft_model):
        raise OptionError("draft_head: a SampledHeadDrafter drafts from its own head, given as "
                         "draft_head; a draft model's drafter takes no head")
    if mode == "chain" and drafter.kind not in ("chain", "sampled-chain"):
        raise ValueError(f"mode 'chain' got a {drafter.kind!r} drafter; ask for mode 'tree'")
    return speculative_sampled(target, draft_model, prompt, drafter, params, options, loop)
