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
  expanded node's children were drawn from.
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
from .errors import SamplingRefused
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

__all__ = ["DEFAULT_BRANCHING", "SampledChainDrafter", "SampledRound", "SampledTreeDrafter",
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


class SampledTreeDrafter(FixedTreeDrafter):
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

    def bind(self, params: SamplingParams, rng: np.random.Generator):
        self.params, self.rng = params, rng
        return self

    def draft(self, root: int, limit: Optional[int] = None) -> SampledRound:
        if self.params is None or self.rng is None:
            raise ValueError("a sampled drafter needs bind(params, rng) before drafting")
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
        """Drop nodes of draft probability 0 under their parent (slots past
        the support of q) with their subtrees; attach to every kept node
        with children the q they were drawn from."""
        tree, fed = rnd.tree, rnd.fed
        tokens, parents = tree.tokens, tree.parents
        keep, new_index = [0], {0: 0}
        for i in range(1, len(tree)):
            par = parents[i]
            if par in new_index and self._q[fed[par]][tokens[i]] > 0:
                new_index[i] = len(keep)
                keep.append(i)
        if len(keep) == len(tree):
            new_tree, new_fed = tree, list(fed)
        else:
            new_tree = DraftTree([tokens[i] for i in keep],
                                 [-1] + [new_index[parents[i]] for i in keep[1:]])
            new_fed = [fed[i] for i in keep]
        has_kids = set(new_tree.parents[1:])
        q = {j: self._q[new_fed[j]] for j in has_kids}
        return SampledRound(new_tree, new_fed, rnd.offset, rnd.fed_tree, rnd.logprobs, q=q)

    def describe(self):
        d = super().describe()
        d["kind"] = self.kind
        d["sampling"] = self.params.describe() if self.params else None
        return d


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
    gate, adapters, on_round)."""
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
    if drafter is None:
        drafter = make_sampled_drafter(mode, block=options.resolved_block,
                                       branching=options.branching, parents=options.parents)
    elif not isinstance(drafter, SampledTreeDrafter):
        raise ValueError(
            f"sampled decoding needs a sampled drafter (SampledChainDrafter / "
            f"SampledTreeDrafter), got a {drafter.kind!r} drafter, whose greedy drafts "
            "carry no draft distribution to verify against")
    elif mode == "chain" and not isinstance(drafter, SampledChainDrafter):
        raise ValueError(f"mode 'chain' got a {drafter.kind!r} drafter; ask for mode 'tree'")
    return speculative_sampled(target, draft_model, prompt, drafter, params, options, loop)
