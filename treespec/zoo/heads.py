"""The zoo's hidden-state heads, as published checkpoints lay them out.

Pure layout helpers (names, shapes, files); the seeded values come from the
zoo's own init rules (``treespec.zoo.mtp_checkpoint`` / ``eagle3_checkpoint``):

* qwen3_5: the mlx-lm checkpoint (``model.safetensors``, byte-identical to
  the zoo's) plus ``model-mtp.safetensors`` holding the ``mtp.*`` tensors in
  MLX's convention (metadata "mlx", norm gains as applied), listed in
  ``model.safetensors.index.json``: a sharded checkpoint whose MTP module
  sits in its own shard.
* qwen3_next: one ``model.safetensors`` in the PyTorch layout of a hub
  release (metadata "pt", per-expert MoE weights, zero-centred norms, conv1d
  as (C, 1, K)), ``mtp.*`` included, no index; mlx-lm's sanitize converts it
  and drops the ``mtp.*`` tensors.
* an EAGLE-3 head directory in the speculators format for a llama target
  (config.json + model.safetensors with a reduced draft vocabulary, d2t and
  t2d as speculators saves them: int64 and bool).
"""

import json
import re
from pathlib import Path
from typing import Dict

import mlx.core as mx

__all__ = ["MTP_FILE", "pytorch_layout", "write_mtp_shard", "write_pytorch_checkpoint",
           "eagle3_config", "draft_vocabulary", "write_eagle3"]

MTP_FILE = "model-mtp.safetensors"

# The norms mlx-lm's qwen3_next / qwen3_5 sanitize shifts by 1 (ZERO-centred
# in PyTorch checkpoints), and the MTP module's own.
_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
          ".q_norm.weight", ".k_norm.weight", "mtp.norm.weight",
          "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight")
_SWITCH = re.compile(r"(.*\.mlp)\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$")


def pytorch_layout(weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
    """mlx-lm qwen3_next weights (and ``mtp.*``) in the hub's PyTorch layout:
    the inverse of mlx-lm's sanitize. Exact: w - 1 and back is exact for the
    gains near 1 and 3.5 the zoo draws."""
    out = {}
    for name, v in weights.items():
        m = _SWITCH.fullmatch(name)
        if m:
            for e in range(v.shape[0]):
                out[f"{m.group(1)}.experts.{e}.{m.group(2)}.weight"] = v[e]
            continue
        if "conv1d.weight" in name and v.shape[-1] == 1:
            v = v.moveaxis(1, 2)  # (C, K, 1) -> (C, 1, K)
        elif v.ndim == 1 and any(name.endswith(s) for s in _NORMS):
            v = v - 1.0
        out[name] = v
    return out


def write_pytorch_checkpoint(path: Path, weights: Dict[str, mx.array]) -> None:
    """One model.safetensors, metadata "pt", no index (replaces what
    ``zoo.save`` wrote there)."""
    for old in list(path.glob("model*.safetensors")) + [path / "model.safetensors.index.json"]:
        if old.exists():
            old.unlink()
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "pt"})


def write_mtp_shard(path: Path, mtp: Dict[str, mx.array]) -> None:
    """``mtp.*`` in their own shard, MLX convention, listed in the index."""
    mx.save_safetensors(str(path / MTP_FILE), mtp, metadata={"format": "mlx"})
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map = dict(index["weight_map"])
    weight_map.update({k: MTP_FILE for k in mtp})
    index["weight_map"] = dict(sorted(weight_map.items()))
    index_path.write_text(json.dumps(index, indent=4))


def draft_vocabulary(vocab: int) -> mx.array:
    """The zoo head's draft vocabulary: every target id but those = 4 mod 5
    (so d2t is neither zero nor constant), ascending."""
    return mx.array([t for t in range(vocab) if t % 5 != 4], dtype=mx.int32)


def eagle3_config(target_config: dict, layer_ids, draft_vocab: int) -> dict:
    """A speculators EAGLE-3 config whose layer is the target's llama layer
    shape (its rope included)."""
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "rms_norm_eps", "rope_theta", "rope_scaling",
            "max_position_embeddings", "vocab_size")
    layer = {k: target_config[k] for k in keys if k in target_config}
    layer.update({"model_type": "llama", "num_hidden_layers": 1, "tie_word_embeddings": False})
    return {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": int(draft_vocab),
        "target_hidden_size": target_config["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "norm_before_residual": False,
    }


def write_eagle3(path: Path, config: dict, weights: Dict[str, mx.array], draft_ids: mx.array,
                 vocab: int) -> None:
    """config.json and model.safetensors (metadata "pt", as torch writes)."""
    n = draft_ids.shape[0]
    tensors = dict(weights)
    tensors["d2t"] = (draft_ids - mx.arange(n, dtype=mx.int32)).astype(mx.int64)
    t2d = mx.zeros((vocab,), dtype=mx.bool_)
    t2d[draft_ids] = True
    tensors["t2d"] = t2d
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"), tensors, metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
