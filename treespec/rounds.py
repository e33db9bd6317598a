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
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from . import caches
from .checks import token_ids
from .draft import Drafter, Round
from .gate import decide
from .models import PREFILL_STEP, prefill, vocab_size
from .stats import Result, Stats, clip, eos_set
from .verify import adapter_for
from .walk import Walk, tree_walk


MODES = ("classic", "chain", "tree")


def prompt_ids(target, prompt: Sequence[int]) -> list:
    """The prompt as ints, each an id of the target's vocabulary (an id past
    its embedding table would be read out of bounds), at least one."""
    prompt = token_ids(prompt, vocab_size(target), "prompt")
    if not prompt:
        raise ValueError("the prompt needs at least one token (the first root)")
    return prompt


def same_vocabulary(target, draft_model) -> None:
    """Speculative decoding compares the drafter's ids with the target's:
    both must read the same vocabulary (logits of one width; the command
    line also compares the tokenizers)."""
    if draft_model is None:
        raise ValueError("draft_model: speculative decoding needs a draft model")
    theirs, ours = vocab_size(draft_model), vocab_size(target)
    if theirs != ours:
        raise ValueError(f"draft_model: its logits are {theirs} wide, the target's {ours}: "
                         "the drafter must use the target's vocabulary (the same tokenizer)")


def classic(target, prompt: Sequence[int], max_tokens: int, eos_token_ids=None,
            sampler=None, requested: Optional[dict] = None) -> Result:
    """mlx-lm's ``generate_step``: greedy, or with the given ``sampler``."""
    prompt = prompt_ids(target, prompt)
    stats = Stats("classic", requested=requested or {})
    eos, out = eos_set(eos_token_ids), []
    t0 = time.perf_counter()
    sampler = sampler or (lambda lp: mx.argmax(lp, axis=-1))
    for tok, _ in generate_step(mx.array(prompt), target, max_tokens=max_tokens,
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
    prompt = prompt_ids(target, prompt)
    same_vocabulary(target, draft_model)
    adapter = adapter if adapter is not None else adapter_for(target)
    walker = walker if walker is not None else greedy()
    stats = Stats(mode, requested=requested or drafter.describe())
    note = getattr(adapter, "note", None)  # a model without an audit record says so
    if note:
        stats.notes.append(note)
    if gate:
        # A round never verifies more than max_tokens nodes (its drafts are
        # cut to what is left to emit), so larger shapes are not probed.
        shapes = [s for s in drafter.probe_shapes() if len(s) <= max_tokens]
        decision = decide(target, shapes, allow_inexact=allow_inexact,
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
    eos, out = eos_set(eos_token_ids), []
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
        offset = caches.offset(cache)
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
        # Both commits evaluate what they write (commit_path ends in mx.eval).
        adapter.commit(cache, rnd.tree, walk.path, offset)
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
    return Result(out, stats)
