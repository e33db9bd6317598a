"""An EAGLE-3 head in the ``speculators`` format (the one vLLM and mlx-vlm load).

A head directory holds ``config.json`` and ``model.safetensors``::

    config.json   speculators_model_type: "eagle3"
                  transformer_layer_config: a llama layer config (hidden_size,
                      heads, head_dim, intermediate_size, rms_norm_eps, rope,
                      vocab_size = the target's vocabulary)
                  draft_vocab_size, target_hidden_size,
                  eagle_aux_hidden_state_layer_ids (three, low / middle / high)
                  optional: norm_before_residual, norm_before_fc
    weights       fc (H_draft x 3 H_target, no bias), layers.0.* (below), norm,
                  lm_head (draft_vocab x H_draft), d2t (draft_vocab,), optional
                  t2d (target vocab, bool), embed_tokens (else the target's is
                  shared), input_norm (with norm_before_fc)

The first layer's attention reads 2H: the concatenation [input_layernorm(embed
of the next token), hidden_norm(h)], where h is fc(the three taps) at the
first step and the head's own pre-norm output afterwards; the residual is h
(hidden_norm(h) with norm_before_residual). Its MLP and the other layers are
llama's. ``target_id = draft_id + d2t[draft_id]``; logits of target tokens
outside the draft vocabulary are -inf.

Layer ids are hidden-state indices as Hugging Face counts them (index 0 is
the embedding output, index i the output of decoder layer i - 1; vLLM
captures the residual stream entering layer i, the same thing), so the taps
are ``id - 1`` in treespec.heads.base's counting.
"""

import copy
import json
from pathlib import Path
from typing import Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from .files import read_file
from .target import Shared, TargetView, view

__all__ = ["Eagle3Head", "Eagle3Layer", "layer_config", "taps_from_ids", "inverse_map"]

TYPE = "eagle3"


def layer_config(config: dict) -> llama.ModelArgs:
    """llama ModelArgs of a speculators config's transformer_layer_config."""
    c = copy.deepcopy(config["transformer_layer_config"])
    c.setdefault("model_type", "llama")
    c.setdefault("num_hidden_layers", 1)
    if "head_dim" not in c or c["head_dim"] is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("vocab_size", config.get("draft_vocab_size"))
    return llama.ModelArgs.from_dict(c)


def taps_from_ids(ids) -> Tuple[int, ...]:
    """Hugging Face hidden-state indices -> decoder-layer outputs."""
    return tuple(int(i) - 1 for i in ids)


def inverse_map(d2t: mx.array, vocab: int) -> mx.array:
    """For each target id, its draft id, or ``len(d2t)`` (the -inf column)
    when the draft vocabulary does not hold it."""
    draft = len(d2t)
    targets = mx.arange(draft, dtype=mx.int32) + d2t.astype(mx.int32)
    inv = mx.full((vocab,), draft, dtype=mx.int32)
    inv[targets] = mx.arange(draft, dtype=mx.int32)
    return inv


class Eagle3Layer(nn.Module):
    """The first decoder layer of an EAGLE-3 head: llama's attention with
    2H-wide q/k/v projections, llama's MLP."""

    def __init__(self, args: llama.ModelArgs, norm_before_residual: bool = False):
        super().__init__()
        h = args.hidden_size
        self.input_layernorm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        attn = llama.Attention(args)
        # mlx-lm's llama attention, its projections widened to read [embed, hidden].
        bias = bool(getattr(args, "attention_bias", False))
        attn.q_proj = nn.Linear(2 * h, attn.n_heads * attn.head_dim, bias=bias)
        attn.k_proj = nn.Linear(2 * h, attn.n_kv_heads * attn.head_dim, bias=bias)
        attn.v_proj = nn.Linear(2 * h, attn.n_kv_heads * attn.head_dim, bias=bias)
        self.self_attn = attn
        self.post_attention_layernorm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.mlp = llama.MLP(args)
        object.__setattr__(self, "norm_before_residual", bool(norm_before_residual))

    def __call__(self, embeds, hidden, mask=None, cache=None):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = mx.concatenate([self.input_layernorm(embeds), normed], axis=-1)
        h = residual + self.self_attn(x, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head (see the module docstring). The call is the contract of
    treespec.heads.base."""

    def __init__(self, config: dict, target: TargetView, own_embedding: bool = False):
        super().__init__()
        args = layer_config(config)
        h = args.hidden_size
        th = int(config.get("target_hidden_size") or h)
        ids = list(config["eagle_aux_hidden_state_layer_ids"])
        draft_vocab = int(config["draft_vocab_size"])
        if config.get("norm_before_fc"):
            self.input_norm = nn.RMSNorm(len(ids) * th, eps=args.rms_norm_eps)
        self.fc = nn.Linear(len(ids) * th, h, bias=False)
        self.layers = [Eagle3Layer(args, config.get("norm_before_residual", False))] + [
            llama.TransformerBlock(args) for _ in range(1, args.num_hidden_layers)
        ]
        self.norm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        if own_embedding:
            self.embed_tokens = nn.Embedding(target.vocab_size, h)
        self.d2t = mx.zeros((draft_vocab,), dtype=mx.int32)
        object.__setattr__(self, "_shared", target.shared)
        object.__setattr__(self, "config", copy.deepcopy(config))
        object.__setattr__(self, "taps", taps_from_ids(ids))
        object.__setattr__(self, "target_hidden_size", th)
        object.__setattr__(self, "hidden_size", h)
        object.__setattr__(self, "vocab_size", target.vocab_size)
        object.__setattr__(self, "draft_vocab_size", draft_vocab)
        object.__setattr__(self, "_inverse", None)

    @property
    def shared(self) -> Shared:
        return self._shared

    def make_cache(self) -> list:
        return [KVCache() for _ in self.layers]

    def embed(self, tokens: mx.array) -> mx.array:
        if "embed_tokens" in self:
            return self.embed_tokens(tokens)
        return self._shared.embed(tokens)

    def target_ids(self) -> mx.array:
        """The target id of each draft id: ``arange + d2t``."""
        return mx.arange(self.draft_vocab_size, dtype=mx.int32) + self.d2t.astype(mx.int32)

    def full_logits(self, draft_logits: mx.array) -> mx.array:
        """Draft-vocabulary logits spread over the target's vocabulary, -inf
        where the draft vocabulary has no token."""
        if self._inverse is None:
            object.__setattr__(self, "_inverse", inverse_map(self.d2t, self.vocab_size))
        pad = mx.full(draft_logits.shape[:-1] + (1,), -mx.inf, dtype=draft_logits.dtype)
        return mx.take(mx.concatenate([draft_logits, pad], axis=-1), self._inverse, axis=-1)

    def __call__(self, tokens: mx.array, features: mx.array, cache=None, own: bool = False):
        if own:
            h = features
        else:
            if "input_norm" in self:
                features = self.input_norm(features)
            h = self.fc(features)
        e = self.embed(tokens)
        cache = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(h, cache[0])
        x = self.layers[0](e, h.astype(e.dtype), mask, cache[0])
        for layer, c in zip(self.layers[1:], cache[1:]):
            x = layer(x, mask, c)
        return self.full_logits(self.lm_head(self.norm(x))), x

    def load(self, weights: Dict[str, mx.array]) -> "Eagle3Head":
        """Strictly load the head's parameters (t2d, which the head
        recomputes from d2t, and rotary buffers are not parameters)."""
        weights = {k: v for k, v in weights.items() if k != "t2d" and "rotary_emb" not in k}
        if "d2t" in weights:
            weights["d2t"] = weights["d2t"].astype(mx.int32)
        else:
            weights["d2t"] = self.d2t
        self.load_weights(list(weights.items()), strict=True)
        object.__setattr__(self, "_inverse", None)
        self.eval()
        return self

    @classmethod
    def build(cls, config: dict, target_model: nn.Module, own_embedding: bool = False) -> "Eagle3Head":
        """A head of ``config`` for ``target_model`` with default weights."""
        return cls(config, view(target_model), own_embedding)

    @classmethod
    def from_dir(cls, head_dir, target_model: nn.Module) -> "Eagle3Head":
        """The speculators head at ``head_dir`` for ``target_model`` (no fit
        checks beyond a strict load: treespec.heads.load.load_head checks)."""
        config, weights = read_dir(head_dir)
        head = cls(config, view(target_model), own_embedding="embed_tokens.weight" in weights)
        return head.load(weights)


def read_config(head_dir) -> Optional[dict]:
    path = Path(head_dir) / "config.json"
    return json.loads(path.read_text()) if path.exists() else None


def read_dir(head_dir) -> Tuple[dict, Dict[str, mx.array]]:
    """The config and every tensor of a head directory (model*.safetensors)."""
    head_dir = Path(head_dir)
    weights = {}
    for path in sorted(head_dir.glob("model*.safetensors")):
        weights.update(read_file(path)[0])
    return read_config(head_dir), weights
