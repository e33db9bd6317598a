"""A ~1B random llama and a drafter cut from it, for throughput studies at a
size where the verify cost curve of a real accelerator shows.

Random weights say nothing about acceptance, and a truncated copy of a random
model agrees with it barely more than chance: every layer moves the residual
stream as much as the first. So the target's layers past the drafter's depth
write into the residual stream scaled by ``alpha`` (their ``o_proj`` and
``down_proj``); the drafter is the target's first ``draft_layers`` layers with
the same embedding, final norm and head. ``alpha`` then sets how often
the drafter's greedy token is the target's (``agreement``): a knob, chosen to
match a trained pair's agreement, not a property of any real checkpoint. The
costs are real: the target computes every layer at full width whatever alpha
is, and the drafter costs what ``draft_layers`` layers and the head cost.

    python -m treespec.bench.scaled --dims 2048x16 --draft-layers 2 --alpha 0.3 0.5
"""

import argparse
from typing import List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import make_prompt_cache

from ..auto.costcurve import build_llama, parse_dims
from ..models import n_params
from ..rounds import classic


# The pair the H200 figures in results/h200-scaled/README.md were taken on (teacher-forced greedy
# agreement 0.76 at alpha 0.02): the benchmarks' defaults (benchmarks/harness.py).
STUDY_DIMS, STUDY_ALPHA = (2048, 16), 0.02


def filled_cache(model, context: int) -> list:
    """A fresh prompt cache of ``model`` holding ``context`` tokens, evaluated."""
    cache = make_prompt_cache(model)
    model(mx.arange(context)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def build_pair(hidden: int = 2048, layers: int = 16, draft_layers: int = 2,
               alpha: float = 0.3, dtype: str = "bfloat16", seed: int = 0,
               bits: Optional[int] = None):
    """(target, drafter): seeded, deep layers damped by ``alpha``, the drafter
    sharing the target's arrays (no copy) in modules of its own (treespec
    patches attention instances during a verify; the two must not share them)."""
    if not 0 < draft_layers < layers:
        raise ValueError(f"draft_layers must be in 1..{layers - 1}, got {draft_layers}")
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    # An untied head: with the embedding as its head a random model predicts
    # the token it was just fed (its own embedding scores highest) and every
    # greedy text is one repeated token.
    target = build_llama(hidden, layers, dtype=dtype, seed=seed, tied=False)
    for layer in target.model.layers[draft_layers:]:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * alpha
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * alpha
    mx.eval(target.parameters())
    draft = build_llama(hidden, draft_layers, dtype=dtype, seed=seed + 1, tied=False)
    shared = [(k, v) for k, v in tree_flatten(target.parameters())
              if not k.startswith("model.layers.")
              or int(k.split(".")[2]) < draft_layers]
    draft.update(tree_unflatten(shared))
    if bits is not None:
        # mlx_lm.convert's quantization (affine, group 64): every linear and
        # the embedding; the drafter's shared layers quantize to the same values
        for m in (target, draft):
            nn.quantize(m, group_size=64, bits=bits)
    mx.eval(draft.parameters(), target.parameters())
    return target, draft


def agreement(target, draft, prompts: Sequence[Sequence[int]], tokens: int = 64) -> float:
    """Share of positions of the target's greedy continuation where the
    drafter, fed the same text (teacher forcing), predicts the same token:
    the per-token acceptance a greedy chain sees."""
    hits = total = 0
    for prompt in prompts:
        cont = classic(target, prompt, tokens).tokens
        text = list(prompt) + cont[:-1]
        guess = mx.argmax(draft(mx.array(text)[None])[0, len(prompt) - 1:], axis=-1).tolist()
        hits += sum(int(g == c) for g, c in zip(guess, cont))
        total += len(cont)
    return hits / total


def default_prompts(n: int = 3, length: int = 32, vocab: int = 32000) -> List[List[int]]:
    """Seeded token prompts (a random model has no text to be prompted with)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, length).tolist() for _ in range(n)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=parse_dims, default=STUDY_DIMS, help="HIDDENxLAYERS")
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--alpha", type=float, nargs="+", default=[0.3])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--pick", type=float, metavar="AGREEMENT",
                    help="end with 'alpha=A', the alpha whose agreement is nearest this")
    args = ap.parse_args(argv)
    hidden, layers = args.dims
    got = {}
    for alpha in args.alpha:
        target, draft = build_pair(hidden, layers, args.draft_layers, alpha, args.dtype)
        got[alpha] = agreement(target, draft, default_prompts(), args.tokens)
        print(f"llama {hidden}x{layers} {args.dtype} ({n_params(target) / 1e9:.2f}B), "
              f"drafter {args.draft_layers} layers ({n_params(draft) / 1e9:.2f}B), "
              f"alpha {alpha}: greedy agreement {got[alpha]:.3f}", flush=True)
        del target, draft
    if args.pick is not None:
        print(f"alpha={min(got, key=lambda a: abs(got[a] - args.pick))}")


if __name__ == "__main__":
    main()
