"""What a head reads off its target model: the text model, the token
embedding, the output head, the decoder layers, the widths.

A head shares the target's embedding and output head: it holds references to
the target's own modules (never copies), kept in a :class:`Shared` holder,
which is a plain object and not an ``nn.Module``, so that the target's
arrays are not the head's parameters: ``head.parameters()``, ``head.update``
and ``head.load_weights`` never reach them.
"""

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from ..models import model_type

__all__ = ["Shared", "TargetView", "view"]


class Shared:
    """The target's embedding and output head, by reference. A plain object:
    ``nn.Module`` does not look inside it."""

    __slots__ = ("embed", "logits")

    def __init__(self, embed: nn.Module, logits: Callable[[mx.array], mx.array]):
        self.embed = embed
        self.logits = logits


@dataclass(frozen=True)
class TargetView:
    """The parts of an mlx-lm model a head needs, read once."""

    family: str  # model_type of the text model (qwen3_5's wrapper reports its inner type)
    text: nn.Module  # the model whose ``.model`` holds embed_tokens / layers / norm
    args: object  # the text model's ModelArgs
    hidden_size: int
    vocab_size: int
    num_layers: int
    shared: Shared


def _text_model(model: nn.Module) -> nn.Module:
    # Multimodal wrappers (qwen3_5's Model) keep the text model under
    # language_model; a text-only model is its own text model.
    text = getattr(model, "language_model", None)
    return text if isinstance(text, nn.Module) else model


def view(model: nn.Module) -> TargetView:
    """The target's parts; ValueError naming what is missing when the model is
    not laid out as mlx-lm's decoder-only text models are (``model.model``
    with ``embed_tokens`` and ``layers``)."""
    text = _text_model(model)
    inner = getattr(text, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if not isinstance(embed, nn.Module) or not hasattr(text, "layers"):
        raise ValueError(
            f"model_type {model_type(model)!r} keeps no model.embed_tokens and layers "
            "where mlx-lm's decoder-only text models do"
        )
    args = getattr(text, "args", None)
    tied = bool(getattr(args, "tie_word_embeddings", False))
    lm_head = getattr(text, "lm_head", None)
    if isinstance(lm_head, nn.Module) and not tied:
        logits = lm_head
    else:
        logits = embed.as_linear
    vocab, hidden = _embedding_shape(embed)
    return TargetView(
        family=model_type(text) if model_type(text) != "None" else model_type(model),
        text=text,
        args=args,
        hidden_size=hidden,
        vocab_size=vocab,
        num_layers=len(text.layers),
        shared=Shared(embed, logits),
    )


def _embedding_shape(embed: nn.Module):
    # A quantized embedding packs its columns; its scales and group size
    # give the true width back.
    w = embed.weight
    rows = w.shape[0]
    if isinstance(embed, nn.QuantizedEmbedding):
        return rows, embed.scales.shape[-1] * embed.group_size
    return rows, w.shape[-1]
