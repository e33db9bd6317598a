"""Decoding, one entry point: classic, chain or tree, greedy or sampled.

``decode(target, prompt, mode=...)`` returns the generated token ids and the
round diagnostics. ``classic`` is mlx-lm's own ``generate_step`` with a
greedy sampler; ``chain`` and ``tree`` run the speculative round loop
(treespec.rounds). Tree drafting is opt-in: ``mode="tree"`` must be asked
for by name. ``temperature > 0`` samples, exactly in law (treespec.sampling).
"""

import warnings
from typing import Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream

from . import caches, checks, kv_options as kv_caches
from .backend.cuda import warn_if_cudnn_attention
from .draft import Drafter, make_drafter
from .draft.head import HeadDrafter, head_refusal
from .errors import OptionError
from .evidence.gate import ADAPTER
from .models import PositionWarning, position_check
from .options import LIBRARY, DecodeOptions, KVOptions, check_prompt
from .rounds import MODES, Loop, classic, greedy, speculative
from .sampling import decode_sampled
from .stats import Result

__all__ = ["MODES", "check", "decode", "detokenize"]


def check(options: DecodeOptions, target, draft_model, prompt_len: int, spell=None) -> None:
    """Everything ``decode`` refuses before it runs: ``options.check()``, an
    empty prompt, a prompt past the model's positions, KV cache options that
    cannot act or cannot be exact (treespec.kv_options.refusal). Raises OptionError
    spelled by ``spell`` (the command line passes its flags); warns
    (PositionWarning) of a run that may go past the model's positions."""
    kw = {} if spell is None else {"spell": spell}
    options.check(**kw)
    check_prompt(prompt_len, **kw)
    error, warning = position_check(target, prompt_len, options.max_tokens)
    if error is not None:
        raise OptionError(error)
    if warning is not None:
        warnings.warn(warning, PositionWarning, stacklevel=3)
    models = [target] + ([draft_model] if options.mode != "classic" and draft_model is not None
                         else [])
    why = kv_caches.refusal(options.kv, models, prompt_len, options.max_tokens,
                            options.draft_nodes(), **kw)
    if why is None and options.batch_levels and draft_model is not None:
        why = batch_levels_refusal(draft_model, options.kv, spell or LIBRARY)
    if why is not None:
        raise OptionError(why)


def batch_levels_refusal(draft_model, kv: KVOptions, spell=LIBRARY) -> Optional[str]:
    """Why the draft model's caches (mlx-lm's, under these KV options) cannot
    be forked into batch rows (``batch_levels``), or None: asked before
    anything runs, as FixedTreeDrafter.start would find at the first round."""
    cache = kv_caches.make_cache(draft_model, kv)
    if caches.forks(cache):
        return None
    names = ", ".join(sorted({type(c).__name__ for c in cache if not caches.forks([c])}))
    return (f"{spell('batch_levels', True)}: the draft model's caches ({names}) take a tree "
            "whole or cannot be copied into batch rows (sliding window, recurrent state); "
            "a wide level would go through the tree injection anyway")


def decode(target, prompt: Sequence[int], mode: str = "classic", draft_model=None,
           max_tokens: int = 64, eos_token_ids=None, block: Optional[int] = None,
           branching=None, parents=None, budget: Optional[int] = None,
           width: Optional[int] = None, drafter: Optional[Drafter] = None, gate: bool = True,
           allow_inexact: bool = False, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 0.0, min_p: float = 0.0, seed: Optional[int] = None, adapter=None,
           adapter_name: str = ADAPTER, draft_adapter=None,
           walk=None, on_round=None, max_kv_size: Optional[int] = None,
           kv_bits: Optional[int] = None, kv_group_size: Optional[int] = None,
           quantized_kv_start: Optional[int] = None, batch_levels: bool = False,
           draft_head=None, max_nodes: Optional[int] = None) -> Result:
    """One entry point for every mode. ``tree`` is never chosen implicitly.
    ``temperature > 0`` samples, exactly in law (treespec.sampling).

    Options left at None are not given: an option that cannot act in the
    chosen mode is refused (treespec.options.DecodeOptions says which act
    where; defaults: ``block`` 4, i.e. 3 draft tokens as mlx-lm's, ``width``
    4, ``budget`` block - 1, ``seed`` 0). ``max_kv_size``, ``kv_bits``,
    ``kv_group_size``, ``quantized_kv_start``: mlx-lm generate_step's KV
    cache options, for both models (treespec.kv_options). ``batch_levels``: a fixed
    tree drafts each level of several fed nodes as batch rows of one token
    over copies of the draft caches instead of one forward through the tree
    injection (treespec.draft.fixed; the same tree, so the same text).

    ``adapter`` / ``draft_adapter``: the tree adapters of the target and the
    draft model (default ``treespec.verify.adapter_for``; the gate measures
    the target's, named ``adapter_name``); ``walk(tree, target_tokens)``: the
    greedy accept walk (default ``treespec.walk.tree_walk``); ``on_round``:
    called with every round and its walk (treespec.rounds.Loop).

    ``draft_head``: a hidden-state head (treespec.heads.base) drafts instead
    of a draft model, fed the target's own hidden states
    (treespec.draft.head): ``mode="chain"`` with ``block``, ``"tree"`` with a
    fixed shape, or EAGLE-2's dynamic tree with ``budget`` and ``width``.

    ``max_nodes``: no round verifies more nodes than this (root included),
    whatever the drafter would draft (greedy chain and tree modes): the width
    up to which the backend keeps the verify's rows exact, for one
    (treespec.backend.census.row_width for the row-invariant verify)."""
    options = DecodeOptions(
        mode=mode, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, seed=seed, block=block, branching=branching, parents=parents,
        budget=budget, width=width, draft_model=draft_model is not None,
        drafter=drafter is not None, draft_head=draft_head is not None,
        allow_inexact=allow_inexact,
        kv=KVOptions(max_kv_size, kv_bits, kv_group_size, quantized_kv_start),
        batch_levels=batch_levels)
    check(options, target, draft_model, len(prompt))
    if mode != "classic":
        warn_if_cudnn_attention()
    # From here down one options value (what was asked, checked) and one
    # Loop (how to run the rounds) travel, never the keywords one by one.
    if max_nodes is not None:
        checks.integer(max_nodes, "max_nodes", minimum=2)
        if mode == "classic" or options.sampled:
            raise OptionError("max_nodes caps a greedy chain or tree round; it does not act "
                              f"{'in classic mode' if mode == 'classic' else 'at temperature > 0'}")
    loop = Loop(eos_token_ids=eos_token_ids, gate=gate, adapter=adapter, max_nodes=max_nodes,
                adapter_name=adapter_name, draft_adapter=draft_adapter, on_round=on_round,
                walker=greedy(walk) if walk is not None else None)
    if drafter is not None and drafter.reads_hidden and draft_head is None:
        raise OptionError("drafter: a HeadDrafter drafts from a head; give it as draft_head")
    # A forward the caller left running on mlx-lm's generation stream (its
    # generate_step evaluates one ahead: mlx_lm.generate returns with it in
    # flight) ends before this run's first: on a sharded target the two
    # forwards' all-reduces would otherwise pair across ranks by arrival
    # (docs/distributed.md#why-the-ranks-can-drift).
    mx.synchronize(generation_stream)
    if options.sampled:  # decode_sampled checks a head against the target itself
        if walk is not None:
            raise OptionError("walk= is the greedy accept walk; at temperature > 0 the "
                              "sampled rule decides (treespec.sampling)")
        return decode_sampled(target, prompt, draft_model if draft_head is None else draft_head,
                              options, loop, drafter=drafter)
    if mode == "classic":
        return classic(target, prompt, max_tokens, eos_token_ids, kv=options.kv)
    if draft_head is not None:
        why = head_refusal(draft_head, target)
        if why is not None:
            raise OptionError(f"draft_head: {why}")
        if drafter is None:
            drafter = HeadDrafter(draft_head, mode, block=block, branching=branching,
                                  parents=parents, budget=budget, width=width)
        elif not drafter.reads_hidden or drafter.head is not draft_head:
            raise OptionError("draft_head: the drafter given drafts from another model or "
                              "head; give a HeadDrafter of this head, or no drafter")
        draft_model = draft_head
    if drafter is None:
        drafter = make_drafter(mode, block=options.resolved_block, branching=branching,
                               parents=parents, budget=budget, width=options.resolved_width,
                               batch_levels=batch_levels)
    elif mode == "chain" and drafter.kind != "chain":
        raise OptionError(f"mode 'chain' got a {drafter.kind!r} drafter; ask for mode 'tree'")
    return speculative(target, draft_model, prompt, drafter, options, loop)


def detokenize(tokenizer, tokens: Sequence[int]) -> str:
    """The text mlx-lm's ``generate`` would print for these tokens: its own
    streaming detokenizer, stopping before an EOS."""
    detok = tokenizer.detokenizer
    eos = set(tokenizer.eos_token_ids)
    for t in tokens:
        if t in eos:
            break
        detok.add_token(t)
    detok.finalize()
    return detok.text
