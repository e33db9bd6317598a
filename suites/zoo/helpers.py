"""Shared pieces of the zoo suite: the families every suite builds on, seeded
token batches, and a prefill followed by one cached step."""

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from treespec import zoo

REQUIRED = ("llama", "qwen3", "gemma3_text", "gemma4_text", "qwen3_5", "qwen3_next")


def random_tokens(seed, shape, high=zoo.VOCAB_SIZE):
    return mx.array(np.random.RandomState(seed).randint(0, high, size=shape))


def prefill_then_step(model, tokens, split):
    """Logits of a prefill over tokens[:, :split] and of one cached step."""
    cache = make_prompt_cache(model)
    first = model(tokens[:, :split], cache=cache)
    step = model(tokens[:, split : split + 1], cache=cache)
    return first, step
