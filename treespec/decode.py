"""Decoding, one entry point: classic, chain or tree, greedy or sampled.

``decode(target, prompt, mode=...)`` returns the generated token ids and the
round diagnostics. ``classic`` is mlx-lm's own ``generate_step`` with a
greedy sampler; ``chain`` and ``tree`` run the speculative round loop
(treespec.rounds). Tree drafting is opt-in: ``mode="tree"`` must be asked
for by name. ``temperature > 0`` samples, exactly in law (treespec.sampling).
"""

from typing import Optional, Sequence

from .checks import finite, integer
from .cuda_env import warn_if_cudnn_attention
from .draft import Drafter, make_drafter
from .rounds import MODES, classic, greedy, speculative
from .sampling import decode_sampled
from .stats import Result

__all__ = ["MODES", "decode", "detokenize"]


def decode(target, prompt: Sequence[int], mode: str = "classic", draft_model=None,
           max_tokens: int = 64, eos_token_ids=None, block: int = 4,
           branching=None, parents=None, budget: Optional[int] = None,
           width: int = 4, drafter: Optional[Drafter] = None, gate: bool = True,
           allow_inexact: bool = False, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 0.0, min_p: float = 0.0, seed: int = 0, adapter=None,
           adapter_name: str = "treespec.verify.adapter_for", draft_adapter=None,
           walk=None, on_round=None) -> Result:
    """One entry point for every mode. ``tree`` is never chosen implicitly.
    ``temperature > 0`` samples, exactly in law (treespec.sampling).

    ``adapter`` / ``draft_adapter``: the tree adapters of the target and the
    draft model (default ``treespec.verify.adapter_for``; the gate measures
    the target's, named ``adapter_name``); ``walk(tree, target_tokens)``: the
    greedy accept walk (default ``treespec.walk.tree_walk``); ``on_round``:
    called with every round and its walk (treespec.rounds.speculative)."""
    # A NaN or negative temperature is not greedy decoding: refused, as a
    # fractional max_tokens is.
    temperature = finite(temperature, "temperature", minimum=0.0)
    max_tokens = integer(max_tokens, "max_tokens")
    if mode != "classic":
        warn_if_cudnn_attention()
    loop = dict(adapter=adapter, adapter_name=adapter_name, draft_adapter=draft_adapter,
                on_round=on_round)
    if temperature > 0:
        if budget is not None:
            raise ValueError("the confidence-driven tree (budget=) drafts greedily; at "
                             "temperature > 0 give a fixed shape (branching= or parents=)")
        if walk is not None:
            raise ValueError("walk= is the greedy accept walk; at temperature > 0 the "
                             "sampled rule decides (treespec.sampling)")
        return decode_sampled(target, prompt, draft_model, temperature=temperature,
                              top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, mode=mode,
                              block=block, branching=branching, parents=parents,
                              max_tokens=max_tokens, eos_token_ids=eos_token_ids,
                              drafter=drafter, gate=gate, allow_inexact=allow_inexact, **loop)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if mode == "classic":
        return classic(target, prompt, max_tokens, eos_token_ids)
    if draft_model is None:
        raise ValueError(f"mode {mode!r} needs a draft model")
    if drafter is None:
        drafter = make_drafter(mode, block=block, branching=branching, parents=parents,
                               budget=budget, width=width)
    elif mode == "chain" and drafter.kind != "chain":
        raise ValueError(f"mode 'chain' got a {drafter.kind!r} drafter; ask for mode 'tree'")
    return speculative(target, draft_model, prompt, max_tokens, drafter, eos_token_ids, mode,
                       gate=gate, allow_inexact=allow_inexact,
                       walker=greedy(walk) if walk is not None else None, **loop)


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
