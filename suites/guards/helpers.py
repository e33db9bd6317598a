"""Shared pieces of the guards suite: zoo models (shared, or fresh ones a
test may edit), prompts, a llama of another vocabulary, a forward counter and
the fault planter."""

from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import llama

from treespec import zoo
from treespec.standin import StandIn

VOCAB = zoo.VOCAB_SIZE


@lru_cache(maxsize=None)
def model(family: str = "llama", dtype: str = "float32"):
    """The zoo model, built once per process: never edit it."""
    return zoo.build(family, dtype)


@lru_cache(maxsize=None)
def drafter(family: str = "llama"):
    return zoo.drafter(family)


def prompt(n: int = 12, seed: int = 0) -> list:
    rng = np.random.RandomState(seed)
    return [int(t) for t in rng.randint(0, VOCAB, n)]


@lru_cache(maxsize=None)
def llama_of_vocabulary(vocab: int):
    """The zoo llama's architecture with ``vocab`` token ids (mlx-lm's own
    initialisation): a drafter whose logits are not the target's width.
    Built once per process: never edit it."""
    return own_llama(vocab)


def own_llama(vocab: int = VOCAB):
    """The same, a new object every call: for a test that changes it."""
    cfg = zoo.config("llama")
    cfg["vocab_size"] = vocab
    m = llama.Model(llama.ModelArgs.from_dict(cfg))
    mx.eval(m.parameters())
    m.eval()
    return m


class Counted(StandIn):
    """Stands in for a decoder layer and counts its calls: one per forward
    of the model. ``budget`` aborts a run that would go on past it."""

    def __init__(self, layer, budget=None):
        super().__init__()
        self.inner = layer
        self.calls = 0
        self.budget = budget


    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.budget is not None and self.calls > self.budget:
            raise RuntimeError(f"over the budget of {self.budget} forwards")
        return self.inner(*args, **kwargs)


def counted(m, budget=None) -> Counted:
    """Wrap ``m``'s first layer in a counter (an attention-only family: the
    recurrent-mixer lookups read the layers' attributes)."""
    m.layers[0] = Counted(m.layers[0], budget)
    return m.layers[0]


class Fault(Exception):
    """The planted fault: raised from inside a forward."""


class Raises(nn.Module):
    """Stands in for a module; raises on its ``at``-th call (1-based),
    passing the earlier calls through."""

    def __init__(self, inner, at: int = 1):
        super().__init__()
        self.inner = inner
        self.at = at
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls >= self.at:
            raise Fault(f"planted fault (call {self.calls})")
        return self.inner(*args, **kwargs)
