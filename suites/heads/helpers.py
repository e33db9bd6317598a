"""Where the heads under test come from, and references computed without
treespec.heads: plain mx ops on the tensors read straight from the files,
and mlx-lm's own decoder-layer classes loaded with them."""

import copy
import dataclasses
import json
import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen3_5, qwen3_next
from mlx_lm.models.rope_utils import initialize_rope

import treespec
from treespec import zoo

PAIR = Path(treespec.__file__).resolve().parent / "pair"

# Every way a head reaches treespec, as (name, target checkpoint, --draft-head).
LAYOUTS = {
    "qwen3_5-mtp-shard": lambda: (zoo.mtp_checkpoint("qwen3_5"), "mtp"),
    "qwen3_next-mtp-pytorch": lambda: (zoo.mtp_checkpoint("qwen3_next"), "mtp"),
    "llama-eagle3-speculators": lambda: (zoo.checkpoint("llama"), str(zoo.eagle3_checkpoint("llama"))),
    "pair-mtp-dir": lambda: (PAIR / "target", str(PAIR / "head-mtp")),
    "pair-eagle3-dir": lambda: (PAIR / "target", str(PAIR / "head-eagle3")),
}


def target_of(name):
    path, spec = LAYOUTS[name]()
    model, _ = mlx_lm.load(str(path))
    return model, path, spec


def raw_tensors(path: Path) -> dict:
    """Every tensor of every model*.safetensors under ``path`` with its
    file's metadata format, read with mx.load."""
    out = {}
    for f in sorted(Path(path).glob("model*.safetensors")):
        weights, meta = mx.load(str(f), return_metadata=True)
        out.update({k: (v, (meta or {}).get("format")) for k, v in weights.items()})
    return out


def snapshot(model) -> dict:
    """The target's arrays by name: the objects and copies of their values."""
    return {k: (v, np.array(v)) for k, v in tree_flatten(model.parameters())}


def rms(x, w, eps):
    return mx.fast.rms_norm(x, w, eps)


# -- MTP reference -------------------------------------------------------------

_ZERO_CENTRED_SUFFIXES = ("layernorm.weight", "q_norm.weight", "k_norm.weight",
                          "mtp.norm.weight", "pre_fc_norm_embedding.weight",
                          "pre_fc_norm_hidden.weight")


def mtp_params(path: Path, family: str) -> dict:
    """The ``mtp.*`` tensors of a checkpoint (or of an MTP-only head
    directory, whose names lack the prefix) as gains to apply: PyTorch files
    of the Qwen families store RMSNorm gains zero-centred (1 + w); per-expert
    weights stacked (mlx-lm's SwitchGLU layout)."""
    head_dir = not (Path(path) / "tokenizer.json").exists()
    out, experts = {}, {}
    for k, (v, fmt) in raw_tensors(path).items():
        k = "mtp." + k if head_dir else k
        if not k.startswith("mtp."):
            continue
        if fmt != "mlx" and family in ("qwen3_5", "qwen3_next") and v.ndim == 1 \
                and k.endswith(_ZERO_CENTRED_SUFFIXES):
            v = v + 1.0
        m = re.fullmatch(r"(.*)\.experts\.(\d+)\.(\w+)\.weight", k)
        if m:
            experts.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = v
        else:
            out[k] = v
    for (prefix, proj), byi in experts.items():
        out[f"{prefix}.switch_mlp.{proj}.weight"] = mx.stack([byi[i] for i in sorted(byi)])
    return out


def mlx_lm_layer(family, args, params: dict, prefix: str):
    """mlx-lm's own decoder layer of the family as full attention, loaded
    with ``params[prefix + ...]``."""
    if family == "llama":
        layer = llama.TransformerBlock(args)
    else:
        a = dataclasses.replace(copy.deepcopy(args), full_attention_interval=1)
        cls = qwen3_next.Qwen3NextDecoderLayer if family == "qwen3_next" else qwen3_5.DecoderLayer
        layer = cls(a, layer_idx=0)
    layer.load_weights([(k[len(prefix):], v) for k, v in params.items() if k.startswith(prefix)],
                       strict=True)
    return layer


def mtp_reference(model, family, params, tokens, features, eps):
    """The MTP module from the raw tensors: embed -> two norms -> concat
    [embedding, hidden] -> fc -> mlx-lm's layer (causal) -> norm -> the
    target's own logits function."""
    text = getattr(model, "language_model", model)
    embed = text.model.embed_tokens
    e = embed.weight[tokens]
    x = mx.concatenate([rms(e, params["mtp.pre_fc_norm_embedding.weight"], eps),
                        rms(features, params["mtp.pre_fc_norm_hidden.weight"], eps)], axis=-1)
    x = x @ params["mtp.fc.weight"].T
    layer = mlx_lm_layer(family, text.args, params, "mtp.layers.0.")
    x = layer(x, "causal" if x.shape[1] > 1 else None, None)
    hidden = rms(x, params["mtp.norm.weight"], eps)
    lm_head = getattr(text, "lm_head", None)
    logits = hidden @ (lm_head.weight if lm_head is not None and not text.args.tie_word_embeddings
                       else embed.weight).T
    return logits, hidden


# -- EAGLE-3 reference ----------------------------------------------------------


def eagle3_reference(model, head_dir, tokens, features=None, rows=None):
    """An EAGLE-3 head recomputed with plain ops from config.json and the
    file's tensors (mlx-lm's rope for the layer config), target logits by
    scattering the draft ones to ``draft_id + d2t[draft_id]`` in numpy.
    ``rows``: the layer's hidden input given directly (fc(features) where
    the head read the target, its own hidden where it read itself)."""
    cfg = json.loads((Path(head_dir) / "config.json").read_text())
    lc = cfg["transformer_layer_config"]
    w = {k: v for k, (v, _) in raw_tensors(head_dir).items()}
    eps = lc.get("rms_norm_eps", 1e-6)
    n_heads = lc["num_attention_heads"]
    n_kv = lc.get("num_key_value_heads", n_heads)
    hd = lc.get("head_dim") or lc["hidden_size"] // n_heads
    embed = w["embed_tokens.weight"] if "embed_tokens.weight" in w else model.model.embed_tokens.weight
    h = features @ w["fc.weight"].T if rows is None else rows
    e = embed[tokens]
    p = "layers.0."
    x = mx.concatenate([rms(e, w[p + "input_layernorm.weight"], eps),
                        rms(h, w[p + "hidden_norm.weight"], eps)], axis=-1)
    B, T, _ = x.shape
    q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(B, T, n_heads, hd).transpose(0, 2, 1, 3)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(B, T, n_kv, hd).transpose(0, 2, 1, 3)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(B, T, n_kv, hd).transpose(0, 2, 1, 3)
    rope = initialize_rope(hd, lc.get("rope_theta", 10000.0), False, lc.get("rope_scaling"),
                           lc.get("max_position_embeddings", 4096))
    q, k = rope(q), rope(k)
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=hd**-0.5,
                                             mask="causal" if T > 1 else None)
    o = o.transpose(0, 2, 1, 3).reshape(B, T, -1) @ w[p + "self_attn.o_proj.weight"].T
    x = h + o
    y = rms(x, w[p + "post_attention_layernorm.weight"], eps)
    y = (nn.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)) \
        @ w[p + "mlp.down_proj.weight"].T
    x = x + y
    draft = np.array(rms(x, w["norm.weight"], eps) @ w["lm_head.weight"].T, dtype=np.float32)
    d2t = np.array(w["d2t"]).astype(np.int64)
    vocab = lc["vocab_size"]
    full = np.full(draft.shape[:-1] + (vocab,), -np.inf, dtype=np.float32)
    for d in range(len(d2t)):
        full[..., d + d2t[d]] = draft[..., d]
    return full, x


# -- the pair's heads -----------------------------------------------------------


def target_states(model, x):
    """The outputs of every decoder layer, the final norm's output and the
    logits of a llama target, its layers run one by one (not through
    treespec.verify.taps)."""
    inner = model.model
    h = inner.embed_tokens(x)
    outs = []
    for layer in inner.layers:
        h = layer(h, "causal", None)
        outs.append(h)
    final = inner.norm(h)
    return outs, final, inner.embed_tokens.as_linear(final)


def sample_states(model, tokenizer):
    """heldout_sample.json's segments (each tokenized alone, cut to its
    max_tokens) with the target's states over each."""
    sample = json.loads((PAIR / "heldout_sample.json").read_text())
    out = []
    for seg in sample["segments"]:
        x = mx.array([tokenizer.encode(seg["text"])[: sample["max_tokens"]]])
        outs, final, logits = target_states(model, x)
        mx.eval(outs, final, logits)
        out.append((x, outs, final, mx.argmax(logits, -1)))
    return out


def sample_agreement(states, head):
    """How often the head's argmax (one call over each segment) equals the
    target's argmax for the same next-next token."""
    hits = total = 0
    for x, outs, final, greedy in states:
        feats = mx.concatenate([final if t == "final" else outs[t] for t in head.taps], axis=-1)
        n = x.shape[1]
        got, _ = head(x[:, 1 : n - 1], feats[:, : n - 2], None)
        hits += (mx.argmax(got, -1) == greedy[:, 1 : n - 1]).sum().item()
        total += n - 2
    return hits, total
