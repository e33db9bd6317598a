"""A multi-token-prediction head in the Qwen3-Next / Qwen 3.5 layout.

As published in their safetensors (and as vLLM's ``qwen3_next_mtp.py`` /
``qwen3_5_mtp.py`` and mlx-vlm's Qwen 3.5 MTP drafter read it)::

    e = embed(token t+1)                     the target's embedding, shared
    x = fc([pre_fc_norm_embedding(e), pre_fc_norm_hidden(h_t)])   2H -> H, no bias
    x = layers.0(x)                          one full-attention decoder layer of
                                             the target's family, its own KV cache
    hidden = norm(x);  logits = lm_head(hidden)   the target's head, shared

``h_t`` is the target's last hidden state at position t *after* its final
norm (:data:`FINAL`): vLLM hands the MTP module the hidden states the target
model returns, which its Qwen3-Next / Qwen 3.5 models return normed. Drafting
past the first token feeds ``hidden`` (after ``mtp.norm``) back as ``h``.

The decoder layer is mlx-lm's own class for the target's family, configured
as full attention (qwen3_next / qwen3_5: ``full_attention_interval=1``, so
layer 0 is attention, with the family's MLP or MoE), or llama's
``TransformerBlock`` for an MTP-style head on a llama target (the built-in
pair's). Its attention takes masks and positions from its cache as every
mlx-lm attention does, so the injection of treespec.verify.attention applies.

Norms: Qwen3-Next and Qwen 3.5 store RMSNorm gains zero-centred (applied as
1 + w) in their PyTorch checkpoints; mlx-lm adds 1 when it converts. A head's
tensors from a file whose safetensors metadata says "mlx" are taken as they
are, from any other file the 1 is added (mlx-vlm's rule).
"""

import copy
import dataclasses
import re
from pathlib import Path
from typing import Dict, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama, qwen3_5, qwen3_next
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from .base import FINAL
from .files import MLX_FORMAT, read_prefixed
from .target import Shared, TargetView, view

__all__ = ["MTPHead", "PREFIX", "FAMILIES", "mtp_weights", "layer_args"]

PREFIX = "mtp."

# Families whose published checkpoints carry an MTP module, and llama (an
# MTP-style head trained for a llama target, e.g. the built-in pair's).
FAMILIES = ("qwen3_5", "qwen3_next", "llama")

# Families whose RMSNorms are zero-centred in PyTorch checkpoints.
ZERO_CENTRED = ("qwen3_5", "qwen3_next")

_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
    "norm.weight",  # mtp.norm
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)

_EXPERT = re.compile(r"(.*)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def layer_args(family: str, args):
    """The target's ModelArgs configured for one full-attention layer."""
    if family in ("qwen3_5", "qwen3_next"):
        return dataclasses.replace(copy.deepcopy(args), full_attention_interval=1)
    return args


def _layer(family: str, args) -> nn.Module:
    a = layer_args(family, args)
    if family == "qwen3_next":
        return qwen3_next.Qwen3NextDecoderLayer(a, layer_idx=0)
    if family == "qwen3_5":
        return qwen3_5.DecoderLayer(a, layer_idx=0)
    if family == "llama":
        return llama.TransformerBlock(a)
    raise ValueError(f"no MTP layer for model_type {family!r} (known: {', '.join(FAMILIES)})")


def mtp_weights(raw: Dict[str, mx.array], formats: Dict[str, str], family: str) -> Dict[str, mx.array]:
    """Checkpoint ``mtp.*`` tensors as the head's parameters: prefix removed,
    zero-centred norms of PyTorch files shifted by 1, per-expert MoE weights
    stacked into mlx-lm's ``switch_mlp`` (as mlx-lm's qwen3_next sanitize
    does for the target's layers)."""
    out, experts = {}, {}
    for name, value in raw.items():
        key = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if (
            family in ZERO_CENTRED
            and formats.get(name, "") != MLX_FORMAT
            and value.ndim == 1
            and any(key.endswith(s) for s in _NORMS)
        ):
            value = value + 1.0
        m = _EXPERT.fullmatch(key)
        if m:
            experts.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = value
            continue
        out[key] = value
    for (layer, proj), by_index in experts.items():
        if sorted(by_index) != list(range(len(by_index))):
            raise ValueError(f"{layer}.mlp.experts.*.{proj}: expert indices are not 0..{len(by_index) - 1}")
        out[f"{layer}.mlp.switch_mlp.{proj}.weight"] = mx.stack([by_index[i] for i in range(len(by_index))])
    return out


class MTPHead(nn.Module):
    """One MTP module reading the target's final hidden state (see the module
    docstring). The call is the contract of treespec.heads.base."""

    def __init__(self, family: str, args, target: TargetView):
        super().__init__()
        h = target.hidden_size
        eps = args.rms_norm_eps
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = [_layer(family, args)]
        self.norm = nn.RMSNorm(h, eps=eps)
        # Plain attributes (not parameters): what the contract reads.
        object.__setattr__(self, "_shared", target.shared)
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "taps", (FINAL,))
        object.__setattr__(self, "target_hidden_size", h)
        object.__setattr__(self, "hidden_size", h)
        object.__setattr__(self, "vocab_size", target.vocab_size)

    @property
    def shared(self) -> Shared:
        return self._shared

    def make_cache(self) -> list:
        return [KVCache() for _ in self.layers]

    def __call__(self, tokens: mx.array, features: mx.array, cache=None, own: bool = False):
        # own changes nothing here: the head's hidden is fed back as h, as the
        # target's final hidden is (both H wide, both after a final norm).
        e = self._shared.embed(tokens)
        x = mx.concatenate(
            [self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(features.astype(e.dtype))],
            axis=-1,
        )
        x = self.fc(x)
        cache = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(x, cache[0])
        for layer, c in zip(self.layers, cache):
            x = layer(x, mask, c)
        hidden = self.norm(x)
        return self._shared.logits(hidden), hidden

    @classmethod
    def build(cls, target_model: nn.Module, family: Optional[str] = None, args=None) -> "MTPHead":
        """An MTP head for ``target_model`` with default (untrained) weights;
        ``args``: the ModelArgs of its layer (default: the target's)."""
        t = view(target_model)
        return cls(family or t.family, args if args is not None else t.args, t)

    def load(self, weights: Dict[str, mx.array]) -> "MTPHead":
        """Strictly load the head's parameters (names without ``mtp.``)."""
        if any(k.endswith(".scales") for k in weights):
            raise ValueError("its MTP tensors are quantized; only float MTP tensors load")
        self.load_weights(list(weights.items()), strict=True)
        self.eval()
        return self

    @classmethod
    def from_checkpoint(cls, model_dir, target_model: nn.Module) -> "MTPHead":
        """The MTP module of the checkpoint at ``model_dir`` (the one
        ``target_model`` was loaded from), sharing its embedding and head.
        ValueError when it holds no ``mtp.*`` tensors or they do not fit."""
        t = view(target_model)
        raw, formats = read_prefixed(Path(model_dir), PREFIX)
        if not raw:
            raise ValueError(f"no {PREFIX}* tensors in the checkpoint at {model_dir}")
        weights = mtp_weights(raw, formats, t.family)
        return cls(t.family, t.args, t).load(weights)

