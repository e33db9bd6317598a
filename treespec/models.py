"""What treespec reads off an mlx-lm model, and how it feeds committed text.

One spelling each of: the family name (``model_type``), the width of the
logits (``vocab_size``), the parameter count, and the prefill that every
caller (round loop, drafter, gate, cost curve) uses so that their caches
match the ones mlx-lm's ``generate_step`` builds.
"""

from typing import Callable, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from .module_tree import ModuleTree

# mlx-lm generate_step's default prefill chunk, so caches match classic decoding.
PREFILL_STEP = 2048


def model_type(model: nn.Module) -> str:
    """The mlx-lm family name (``model_type`` of the model or its args)."""
    mt = getattr(model, "model_type", None)
    if mt is None and hasattr(model, "args"):
        mt = getattr(model.args, "model_type", None)
    return str(mt)


# The attribute a model object keeps its logits width under (object.__setattr__:
# a plain instance attribute, not a child module or parameter of nn.Module).
_VOCAB = "_treespec_vocab"


def vocab_size(model: nn.Module) -> int:
    """The width of the model's logits, read off one forward (configs spell
    it differently, and multimodal wrappers nest it), whose graph is built
    and never evaluated: on a deep model that costs what a forward's host
    work does, and every decode asks several times (its prompt, both models
    of a pair, both adapters). So it is read once per model object and kept
    on it with a snapshot of its module tree (treespec.module_tree): any
    module put in, replaced or removed (a new head) reads it again; so does
    a copy of the model (another object id). The snapshot holds the model
    itself weakly: keeping it there makes no reference cycle, so a model
    dropped is freed at once, its arrays with it."""
    kept = model.__dict__.get(_VOCAB)
    if kept is not None and kept[0] == id(model) and not kept[1].changed():
        return kept[2]
    n = int(model(mx.array([[0]]), cache=make_prompt_cache(model)).shape[-1])
    object.__setattr__(model, _VOCAB, (id(model), ModuleTree(model, weak_root=True), n))
    return n


def n_params(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


class PositionWarning(UserWarning):
    """A run that may go past the model's max_position_embeddings."""


def max_positions(model: nn.Module) -> Optional[int]:
    """``max_position_embeddings`` of the model's config, where it has one:
    the positions it was trained for."""
    n = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def position_check(model: nn.Module, prompt_len: int, max_tokens: int):
    """(error, warning) about positions past the model's
    ``max_position_embeddings``: a prompt past it is an error (its text would
    be garbage from the first token), a run that may go past it a warning."""
    n = max_positions(model)
    if n is None:
        return None, None
    if prompt_len > n:
        return (f"the prompt is {prompt_len} tokens, past the model's "
                f"max_position_embeddings {n}"), None
    if prompt_len + max_tokens > n:
        return None, (f"prompt {prompt_len} + max tokens {max_tokens} may run past the "
                      f"model's max_position_embeddings {n}: text past position {n} is "
                      "untrained territory")
    return None, None


def prefill(model: nn.Module, cache, tokens: Sequence[int], step: int = PREFILL_STEP,
            after: Optional[Callable[[list], None]] = None):
    """Plain forwards over committed tokens, chunked as mlx-lm prefills;
    ``after(cache)`` runs after each chunk, where mlx-lm quantizes
    (treespec.kv_options.quantizer)."""
    tokens = list(tokens)
    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i : i + step])[None], cache=cache)
        if after is not None:
            after(cache)
        mx.eval([c.state for c in cache])


def prefilled(model: nn.Module, tokens: Sequence[int], step: int = PREFILL_STEP) -> list:
    """A fresh cache (``make_prompt_cache``) with ``tokens`` prefilled."""
    cache = make_prompt_cache(model)
    prefill(model, cache, tokens, step)
    return cache
