"""The decoding loops: classic (mlx-lm's ``generate_step``) and the
speculative round loop,

    draft a tree -> one target forward over it -> walk -> commit both caches

with the exactness gate in front of it. Everything the loop uses is a
parameter: the drafter, what was asked (treespec.options.DecodeOptions) and
how to run it, one :class:`Loop` value: the target's tree ``adapter``, the
``walker`` that decides what the target accepts (greedy here, the sampled
rule in treespec.sampling), the ``readout`` of the verify logits and the
classic ``fallback`` the gate declines to. ``treespec.decoding.decode`` is
the entry point that builds them from its keyword arguments, once.
"""

import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream

from . import caches, kv_options as kv_caches
from .checks import token_ids
from .draft import Drafter, Round
from .evidence.gate import decide
from .models import PREFILL_STEP, prefill, vocab_size
from .options import DecodeOptions, KVOptions
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
            sampler=None, requested: Optional[dict] = None,
            kv: KVOptions = kv_caches.DEFAULT) -> Result:
    """mlx-lm's ``generate_step``: greedy, or with the given ``sampler``;
    ``kv``: its KV cache options, passed as they are."""
    prompt = prompt_ids(target, prompt)
    stats = Stats("classic", requested=requested or {})
    eos, out = eos_set(eos_token_ids), []
    t0 = time.perf_counter()
    sampler = sampler or (lambda lp: mx.argmax(lp, axis=-1))
    for tok, _ in generate_step(mx.array(prompt), target, max_tokens=max_tokens,
                                sampler=sampler, **kv.describe()):
        out.append(int(tok))
        if out[-1] in eos:
            break
    # generate_step evaluates one forward ahead, on its own stream: when the loop
    # ends (max_tokens or EOS) that forward may still be running. Return only
    # after it: the caller's next forward would run beside it, and a sharded
    # target's all-reduces of the two would pair across ranks by arrival
    # (docs/distributed.md#why-the-ranks-can-drift).
    mx.synchronize(generation_stream)
    stats.time_ms["verify"] = (time.perf_counter() - t0) * 1e3
    stats.rounds = stats.emitted = len(out)
    return Result(out, stats)


_WARNED = set()


def _warn_once(decision):
    """Loud, on stderr, once per probed configuration and verdict."""
    # A decline before any probe (unsound kernels, a missing one) has no probe key.
    key = (decision.probe.key if decision.probe is not None else decision.reason, decision.run)
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"treespec: exactness gate: {decision.reason}", file=sys.stderr)


def gate_decision(target, shapes, kv: KVOptions, prompt_len: int, max_tokens: int,
                  allow_inexact: bool, adapter, adapter_name: str):
    """The gate over every cache mode this run verifies in (treespec.kv_options): the
    first mode that declines decides, else the first inexact one, else the
    first. Returns (decision, its summary with every mode's probe time)."""
    decisions = [decide(target, shapes, allow_inexact=allow_inexact, adapter=adapter,
                        adapter_name=adapter_name, cache=c)
                 for c in kv_caches.probe_caches(kv, prompt_len, max_tokens)]
    decision = next((d for d in decisions if not d.run),
                    next((d for d in decisions if not d.exact), decisions[0]))
    summary = decision.summary()
    summary["probe_seconds"] = sum(d.probe.seconds for d in decisions if d.probe is not None)
    if len(decisions) > 1:
        summary["cache_modes_probed"] = len(decisions)
    return decision, summary


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


@dataclass(frozen=True)
class Loop:
    """How the round loop runs, as one value: everything ``speculative``
    reads besides the pair, the prompt, the drafter and what was asked
    (treespec.options.DecodeOptions: mode, max_tokens, allow_inexact, kv).
    Frozen: a decode builds it once (treespec.decoding.decode, or
    treespec.sampling for its own walker) and a layer that changes a piece
    passes ``dataclasses.replace`` of it on, so no layer sees another's edit.

    ``adapter``: the target's tree adapter (None: ``adapter_for(target)``,
    with ``chains=True`` for a chain drafter: a chain is never refused for a
    reason of trees alone;
    the gate measures the same one, named ``adapter_name`` in its key);
    ``draft_adapter``: the draft model's (None: ``adapter_for``);
    ``walker(round, readout(logits)) -> Walk`` decides what the target
    accepts (None: the greedy ``tree_walk``); ``fallback()`` is the classic
    decode the gate declines to (None: greedy ``classic``); ``requested``:
    the run's request in its Stats (None: the drafter's ``describe()``);
    ``on_round(round, walk)`` sees every round after its commit; ``max_nodes``
    caps every round's tree (root included) and the shapes the gate probes."""

    eos_token_ids: Optional[Sequence[int]] = None
    gate: bool = True
    adapter: Any = None
    adapter_name: str = "treespec.verify.adapter_for"
    draft_adapter: Any = None
    walker: Optional[Callable] = None
    readout: Callable = greedy_readout
    fallback: Optional[Callable[[], Result]] = None
    requested: Optional[dict] = None
    on_round: Optional[Callable[[Round, Walk], None]] = None
    # The most nodes (root included) one verify may hold: the row-invariant
    # verify's width on this backend (treespec.backend.census.row_width); None: the drafter's
    max_nodes: Optional[int] = None


def speculative(target, draft_model, prompt: Sequence[int], drafter: Drafter,
                options: DecodeOptions, loop: Loop = Loop()) -> Result:
    """The round loop. The target's cache, like the drafter's, holds the
    committed text except the root between rounds.

    ``options``: what was asked; the loop reads its ``mode`` (the Stats'
    label), ``max_tokens``, ``allow_inexact`` (the gate's) and ``kv``
    (mlx-lm's KV cache options, for both models' caches; treespec.kv_options:
    rounds are cut to end where classic decoding starts to quantize).
    ``loop``: how to run it (:class:`Loop`)."""
    prompt = prompt_ids(target, prompt)
    if not drafter.reads_hidden:  # a head's vocabulary: treespec.draft.head.head_refusal
        same_vocabulary(target, draft_model)
    max_tokens, kv = options.max_tokens, options.kv
    # Resolved once: _rounds reads a loop whose adapter and walker are set.
    adapter = (loop.adapter if loop.adapter is not None
               else adapter_for(target, chains=drafter.kind == "chain"))
    loop = replace(loop, adapter=adapter, walker=loop.walker if loop.walker is not None else greedy())
    stats = Stats(options.mode, requested=loop.requested or drafter.describe())
    note = getattr(loop.adapter, "note", None)  # a model without an audit record says so
    if note:
        stats.notes.append(note)
    if loop.gate:
        # A round never verifies more than max_tokens nodes (its drafts are
        # cut to what is left to emit), so larger shapes are not probed.
        cap = max_tokens - 1 if loop.max_nodes is None else min(max_tokens, loop.max_nodes) - 1
        decision, stats.gate = gate_decision(target, drafter.probe_shapes(cap), kv,
                                             len(prompt), max_tokens, options.allow_inexact,
                                             loop.adapter, loop.adapter_name)
        if not decision.exact:
            _warn_once(decision)
            stats.notes.append(decision.reason)
        if not decision.run:
            result = (loop.fallback or (lambda: classic(target, prompt, max_tokens,
                                                        loop.eos_token_ids, kv=kv)))()
            result.stats.requested, result.stats.gate = stats.requested, stats.gate
            result.stats.notes = stats.notes
            result.stats.mode = f"classic (declined {options.mode})"
            return result
    # On mlx-lm's generation stream, as its speculative_generate_step runs.
    with mx.stream(generation_stream):
        out = _rounds(target, draft_model, prompt, drafter, options, loop, stats)
    return Result(out, stats)


def _rounds(target, draft_model, prompt, drafter: Drafter, options: DecodeOptions, loop: Loop,
            stats: Stats) -> list:
    """Prefill, then draft -> verify -> walk -> commit until max_tokens or EOS.
    ``loop`` is resolved (its adapter and walker set: ``speculative``)."""
    max_tokens, kv, eos = options.max_tokens, options.kv, eos_set(loop.eos_token_ids)
    adapter, walker, readout, on_round = loop.adapter, loop.walker, loop.readout, loop.on_round
    out = []
    clock = time.perf_counter
    t0 = clock()
    cache = kv_caches.make_cache(target, kv)
    quantize = kv_caches.quantizer(kv)
    with drafter.watching(target):  # a head drafter takes the prompt's hidden states
        prefill(target, cache, prompt[:-1], PREFILL_STEP, after=quantize)
    drafter.start(draft_model, prompt[:-1], PREFILL_STEP, adapter=loop.draft_adapter, kv=kv)
    stats.time_ms["prefill"] = (clock() - t0) * 1e3
    root = prompt[-1]
    while len(out) < max_tokens:
        t0 = clock()
        # Never draft past max_tokens (a round emits at most drafts + 1), nor
        # across the position where classic decoding starts to quantize.
        limit = max_tokens - len(out) - 1
        if loop.max_nodes is not None:
            limit = min(limit, loop.max_nodes - 1)
        room = kv_caches.room(kv, caches.offset(cache)) if kv.kv_bits is not None else None
        rnd = drafter.draft(root, limit=limit if room is None else min(limit, room))
        # Built on the lazy drafts of a device round (draft.DeviceRound):
        # drafting and verifying are one graph and one evaluation, as in
        # mlx-lm's round. So for such rounds 'draft' is building the graphs
        # and 'verify' evaluating both.
        with drafter.watching(target):  # and every node's, at no extra forward
            read = readout(adapter.verify(rnd.topology, cache, tokens=rnd.device_tokens))
        t1 = clock()
        mx.eval(read)
        t2 = clock()
        walk = walker(rnd, read)
        t3 = clock()
        # Neither commit evaluates anything unless rows move (then their reads:
        # treespec.rollback.commit_path); the writes join the next round's graph.
        adapter.commit(cache, rnd.tree, walk.path)
        quantize(cache)  # where generate_step quantizes: after the forward, once >= start
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
