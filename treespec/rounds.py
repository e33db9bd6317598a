"""The decoding loops: classic (mlx-lm's ``generate_step``) and the
speculative round loop,

    draft a tree -> one target forward over it -> walk -> commit both caches

with the exactness gate in front of it. Everything the loop uses is a
parameter: the drafter, the target's tree ``adapter``, the ``walk`` that
decides what the target accepts (greedy here, the sampled rule in
treespec.sampling), the ``readout`` of the verify logits and the classic
``fallback`` the gate declines to. ``treespec.decode.decode`` is the entry
point that builds them from options.
"""

import sys
import time
from typing import Callable, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import make_prompt_cache

from .draft import Drafter, Round
from .gate import decide
from .models import PREFILL_STEP, prefill
from .stats import Result, Stats, clip, eos_set
from .verify import adapter_for
from .walk import Walk, tree_walk


MODES = ("classic", "chain", "tree")


def classic(target, prompt: Sequence[int], max_tokens: int, eos_token_ids=None,
            sampler=None, requested: Optional[dict] = None) -> Result:
    """mlx-lm's ``generate_step``: greedy, or with the given ``sampler``."""
    stats = Stats("classic", requested=requested or {})
    eos, out = eos_set(eos_token_ids), []
    t0 = time.perf_counter()
    sampler = sampler or (lambda lp: mx.argmax(lp, axis=-1))
    for tok, _ in generate_step(mx.array(list(prompt)), target, max_tokens=max_tokens,
                                sampler=sampler):
        out.append(int(tok))
        if out[-1] in eos:
            break
    stats.time_ms["verify"] = (time.perf_counter() - t0) * 1e3
    stats.rounds = stats.emitted = len(out)
    return Result(out, stats)


_WARNED = set()


def _warn_once(decision):
    """Loud, on stderr, once per probed configuration and verdict."""
    key = (decision.probe.key, decision.run)
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"treespec: exactness gate: {decision.reason}", file=sys.stderr)


def greedy_readout(logits):
    """Temperature 0: each node's target token is what classic decoding picks,
    mlx-lm generate_step's argmax of ``logits - logsumexp(logits)`` in the
    logits' dtype. Not the argmax of the logits: in bfloat16 the subtraction
    rounds near-equal logits to one value and the tie goes to the lower id.
    Computed in the verify's graph: a separate evaluation would cost a host
    sync."""
    return mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)


def greedy(walk: Callable = tree_walk) -> Callable:
    """The round loop's walker for a tree ``walk(tree, target_tokens)``."""
    return lambda rnd, targets: walk(rnd.tree, targets.tolist())


def speculative(target, draft_model, prompt: Sequence[int], max_tokens: int,
                drafter: Drafter, eos_token_ids=None, mode: str = "tree", *,
                gate: bool = True, allow_inexact: bool = False,
                adapter=None, adapter_name: str = "treespec.verify.adapter_for",
                draft_adapter=None, walker: Optional[Callable] = None,
                readout: Callable = greedy_readout, fallback: Optional[Callable] = None,
                requested: Optional[dict] = None,
                on_round: Optional[Callable[[Round, Walk], None]] = None) -> Result:
    """The round loop. The target's cache, like the drafter's, holds the
    committed text except the root between rounds.

    ``adapter``: the target's tree adapter (default ``adapter_for(target)``;
    the gate measures the same one, named ``adapter_name`` in its key);
    ``draft_adapter``: the draft model's (default ``adapter_for``);
    ``walker(round, readout(logits)) -> Walk`` decides what the target
    accepts (default: the greedy ``tree_walk``); ``fallback()`` is the
    classic decode the gate declines to; ``on_round(round, walk)`` sees every
    round after its commit."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("the prompt needs at least one token (the first root)")
    adapter = adapter if adapter is not None else adapter_for(target)
    walker = walker if walker is not None else greedy()
    stats = Stats(mode, requested=requested or drafter.describe())
    if gate:
        decision = decide(target, drafter.probe_shapes(), allow_inexact=allow_inexact,
                          adapter=adapter, adapter_name=adapter_name)
        stats.gate = decision.summary()
        if not decision.exact:
            _warn_once(decision)
            stats.notes.append(decision.reason)
        if not decision.run:
            result = (fallback or (lambda: classic(target, prompt, max_tokens, eos_token_ids)))()
            result.stats.requested, result.stats.gate = stats.requested, stats.gate
            result.stats.notes = stats.notes
            result.stats.mode = f"classic (declined {mode})"
            return result
    # On mlx-lm's generation stream, as its speculative_generate_step runs.
    with mx.stream(generation_stream):
        out = _rounds(target, draft_model, prompt, max_tokens, drafter, eos_set(eos_token_ids),
                      adapter, draft_adapter, walker, readout, on_round, stats)
    return Result(out, stats)


def _rounds(target, draft_model, prompt, max_tokens, drafter, eos, adapter, draft_adapter,
            walker, readout, on_round, stats) -> list:
    """Prefill, then draft -> verify -> walk -> commit until max_tokens or EOS."""
    out = []
    clock = time.perf_counter
    t0 = clock()
    cache = make_prompt_cache(target)
    prefill(target, cache, prompt[:-1])
    drafter.start(draft_model, prompt[:-1], PREFILL_STEP, adapter=draft_adapter)
    stats.time_ms["prefill"] = (clock() - t0) * 1e3
    root = prompt[-1]
    while len(out) < max_tokens:
        t0 = clock()
        # Never draft past max_tokens: a round emits at most drafts + 1.
        rnd = drafter.draft(root, limit=max_tokens - len(out) - 1)
        # Built on the lazy drafts of a device round (draft.DeviceRound):
        # drafting and verifying are one graph and one evaluation, as in
        # mlx-lm's round. So for such rounds 'draft' is building the graphs
        # and 'verify' evaluating both.
        read = readout(adapter.verify(rnd.topology, cache, tokens=rnd.device_tokens))
        t1 = clock()
        mx.eval(read)
        t2 = clock()
        walk = walker(rnd, read)
        t3 = clock()
        # Neither commit evaluates anything unless rows move (then their reads:
        # treespec.rollback.commit_path); the writes join the next round's graph.
        adapter.commit(cache, rnd.tree, walk.path)
        drafter.commit(rnd, walk.path)
        t4 = clock()
        for k, dt in zip(("draft", "verify", "walk", "commit"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            stats.time_ms[k] += dt * 1e3
        stats.record(rnd.tree, walk)
        if on_round is not None:
            on_round(rnd, walk)
        emitted, stop = clip(list(walk.emitted), max_tokens - len(out), eos)
        stats.emitted += len(walk.emitted)
        out += emitted
        if stop:
            break
        root = walk.emitted[-1]
    return out
