"""Tiny seeded models of real mlx-lm architectures, saved as real checkpoints.

Every model here is built from ``mlx_lm.models.<family>.ModelArgs``/``Model``
through the same class lookup ``mlx_lm.load`` uses, with weights drawn from a
fixed seed. The weights are a pure function of (family, seed): identical on
every run and every machine, independent of MLX's and numpy's global RNG
state. ``checkpoint`` writes them as an mlx-lm checkpoint directory (config,
safetensors, a byte-level BPE tokenizer) that ``mlx_lm.load`` opens offline,
giving logits bit-identical to ``build``.

The models are tiny (hidden 64, 2-4 layers) so a forward on the CPU backend's
reference BLAS costs milliseconds, yet each keeps what matters to tree
speculative decoding in its family: the cache types ``make_prompt_cache``
returns, sliding windows small enough for tests to cross, q/k norms, partial
rotary embeddings, GatedDeltaNet recurrent layers and their conv state.
"""

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

# Bump when anything that changes the bytes of a saved checkpoint changes
# (init rules, tokenizer, configs): cached checkpoints are keyed by it.
VERSION = 1

DTYPES = ("float32", "float16", "bfloat16")
BITS = (None, 4, 8)
# mlx-lm's default affine group; every dim we quantize is a multiple of it.
GROUP_SIZE = 64

# ---------------------------------------------------------------------------
# Tokenizer: byte-level BPE, the GPT-2/Qwen/Llama-3 kind, built locally.
# ---------------------------------------------------------------------------

VOCAB_SIZE = 384
SPECIAL_TOKENS = (
    "<pad>",
    "<bos>",
    "<eos>",
    "<|reserved_0|>",
    "<|reserved_1|>",
    "<|reserved_2|>",
    "<|reserved_3|>",
    "<|reserved_4|>",
)
# 256 byte tokens + merges + specials == VOCAB_SIZE exactly, so the model's
# vocab and the tokenizer's agree and no id decodes to nothing.
NUM_MERGES = VOCAB_SIZE - 256 - len(SPECIAL_TOKENS)

# The merges are learned from this text by a tiny deterministic BPE trainer
# below (not the `tokenizers` trainer, whose tie-breaking may change between
# versions): the same text always gives the same merges.
CORPUS = """\
The target model verifies a whole tree of draft tokens in one forward pass.
Each node sees the history and its own ancestors, never its siblings; the
accepted branch is the longest root path the target agrees with, and every
cache is rolled back to that branch before the next round begins. When the
draft is wrong the target still emits one token, so no round is ever wasted.
A sliding window forgets old positions, a recurrent state forgets nothing but
cannot be rewound, and a quantized cache keeps its scales next to its values.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea
shore, and the shells she sells are surely sea shells. In the beginning there
was the word, and then there were the tokens, and then the logits, and then
the argmax. Hello world, hello wörld, grüße aus München, café au lait, naïve
façade; 1234567890 + 2468 = 1237036358. def main(): return print("hello")
"""

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


def _bytes_to_unicode():
    """GPT-2's byte -> printable unicode char map (what ByteLevel uses)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _train_merges(words, num_merges):
    """Greedy BPE: merge the most frequent adjacent pair, ties broken by the
    pair itself, until `num_merges` new tokens exist."""
    words = {tuple(w): c for w, c in words.items()}
    merges, new_tokens = [], set()
    while len(new_tokens) < num_merges:
        counts = {}
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + c
        if not counts:
            raise ValueError("corpus too small for the requested merges")
        pair = min(counts, key=lambda p: (-counts[p], p))
        merges.append(pair)
        new_tokens.add(pair[0] + pair[1])
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    return merges, new_tokens


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """The tokenizer.json text; the single source of the tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = {}
    for word, _ in pre.pre_tokenize_str(CORPUS):
        words[word] = words.get(word, 0) + 1
    merges, _ = _train_merges(words, NUM_MERGES)

    # Byte tokens take ids 0..255 in byte order, merged tokens follow in merge
    # order, special tokens close the vocabulary.
    vocab = {ch: b for b, ch in sorted(_bytes_to_unicode().items())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    assert len(vocab) == 256 + NUM_MERGES, len(vocab)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    assert tok.get_vocab_size() == VOCAB_SIZE
    return tok.to_str()


def _tokenizer_config() -> dict:
    # Written by hand (not by save_pretrained) so the file does not depend on
    # the installed transformers version. No BOS is prepended on encode
    # (Qwen-style), so decode(encode(text)) == text.
    added = {
        str(256 + NUM_MERGES + i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "model_max_length": 1 << 20,
        "pad_token": PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def token_id(token: str) -> int:
    """Id of a special token, e.g. ``token_id("<eos>")``."""
    return 256 + NUM_MERGES + SPECIAL_TOKENS.index(token)


def tokenizer():
    """A fresh transformers tokenizer (PreTrainedTokenizerFast) for the zoo."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(path: Union[str, Path]) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    with open(path / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(_tokenizer_config(), f, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------------------
# Configs: the config.json of each family, minus the vocabulary fields.
# ---------------------------------------------------------------------------

CONFIGS = {
    # Llama 3 shape: GQA, llama3 rope scaling, untied head. Plain KVCache.
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
    # Qwen3 shape: q/k RMSNorm per head, head_dim * heads > hidden, tied head.
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
    # Gemma 3: layer i is global iff i % pattern == pattern - 1, so layers
    # 0, 1, 3 slide (RotatingKVCache, window 8) and layer 2 is global
    # (KVCache, linear-scaled rope). One KV head, (1 + w) norms, tied head.
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "max_position_embeddings": 32768,
    },
    # Gemma 4 (E2B-like, minus KV sharing): explicit layer_types, sliding
    # layers with head_dim 16 on RotatingKVCache (window 16, keep 0), full
    # layers with global_head_dim 32 and proportional rope rotating 1/4 of
    # it on KVCache, per-layer input embeddings, logit softcapping, tied head.
    "gemma4_text": {
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "rms_norm_eps": 1e-6,
        "layer_types": [
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
        "sliding_window": 16,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 16,
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
    # Qwen3.5 text model, flat config: mlx-lm's qwen3_5.ModelArgs.from_dict
    # wraps a config without "text_config" as the text config itself, and
    # the model is then Model.language_model. Layers 0-2 are GatedDeltaNet
    # (ArraysCache: conv state + recurrent state), layer 3 is gated full
    # attention (KVCache) with partial rope. linear_key_head_dim 32 is the
    # smallest that takes the Metal kernel on Apple machines.
    "qwen3_5": {
        "model_type": "qwen3_5",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
        },
    },
    # Qwen3-Next: GatedDeltaNet and gated attention alternate (interval 2:
    # layers 0, 2 linear on ArraysCache, 1, 3 full on KVCache); every MLP is
    # a sparse MoE (4 experts, top 2) plus a gated shared expert. Untied.
    "qwen3_next": {
        "model_type": "qwen3_next",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "norm_topk_prob": True,
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
    },
}

FAMILIES = tuple(CONFIGS)

# Standard deviation of the token embedding. With a tied head a large
# embedding dominates the residual stream and the model just echoes its
# input token (greedy argmax == current token); 1/8 keeps the echo rate at
# a few percent. Gemma also multiplies embeddings by sqrt(hidden) = 8.
EMBED_STD = {
    "llama": 1.0,
    "qwen3": 0.125,
    "gemma3_text": 0.125,
    "gemma4_text": 0.0625,
    "qwen3_5": 0.125,
    "qwen3_next": 1.0,
}

# Gain of the final norm: it sets the logit scale (std ~3.5, mean top-1
# probability ~0.35-0.4, like a small trained model) and never the argmax.
FINAL_NORM_GAIN = {
    "llama": 3.5,
    "qwen3": 3.5,
    "gemma3_text": 2.5,  # Gemma 3 scales by 1 + w, with w stored as ~1
    "gemma4_text": 7.0,
    "qwen3_5": 3.5,
    "qwen3_next": 3.5,
}

# Weights a family's loader would not find in a real checkpoint. Gemma 3's
# Model always builds lm_head and its sanitize drops it (tying the head to
# the embedding) when the checkpoint has none, as real Gemma 3 ones do.
_DROPPED = {"gemma3_text": ("lm_head.weight",)}

# Relative noise (see `drafter`) that makes the default drafter agree with
# its float32 target's greedy token on 54-61% of positions of random
# contexts and 54-67% of positions of the target's own greedy text (64 + 16
# sequences, measured). Recurrent and tied-head families are far more
# sensitive to weight noise than llama.
DRAFT_NOISE = {
    "llama": 0.13,
    "qwen3": 0.10,
    "gemma3_text": 0.03,
    "gemma4_text": 0.02,
    "qwen3_5": 0.02,
    "qwen3_next": 0.06,
}


def config(family: str) -> dict:
    """The config.json dict of `family` (a fresh copy, with model_type)."""
    if family not in CONFIGS:
        raise ValueError(f"unknown zoo family {family!r}; known: {FAMILIES}")
    cfg = copy.deepcopy(CONFIGS[family])
    cfg["vocab_size"] = VOCAB_SIZE
    if family == "gemma4_text":
        cfg["vocab_size_per_layer_input"] = VOCAB_SIZE
    cfg["bos_token_id"] = token_id(BOS)
    cfg["eos_token_id"] = token_id(EOS)
    cfg["pad_token_id"] = token_id(PAD)
    return cfg


# ---------------------------------------------------------------------------
# Building: instantiate like mlx_lm.load, fill with seeded weights.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """What a zoo model is; `save` writes `config` as config.json."""

    family: str
    dtype: str
    bits: Optional[int]
    seed: int
    config: dict
    noise: float = 0.0
    noise_seed: Optional[int] = None


def card(model: nn.Module) -> Card:
    c = getattr(model, "zoo_card", None)
    if c is None:
        raise ValueError("not a zoo model (no zoo_card); pass config= to save")
    return c


def _rng(*key) -> np.random.RandomState:
    # One stream per (purpose, seed, parameter path): adding a parameter or
    # reordering them never shifts another parameter's values.
    return np.random.RandomState(zlib.crc32(repr(key).encode()))


def _uniform(rng, shape, std) -> np.ndarray:
    # Uniform with the given std. random_sample is integer arithmetic on
    # MT19937 output, so unlike a Gaussian (log/sqrt from libm) it is
    # bit-identical on every platform.
    u = rng.random_sample(shape) * 2.0 - 1.0
    return (u * (std * np.sqrt(3.0))).astype(np.float32)


LN16 = 2.772588722239781


def _init_value(family, seed, path, default: np.ndarray) -> np.ndarray:
    rng = _rng("init", seed, path)
    if path.endswith("A_log"):
        # Decay rates exp(A_log) in [1, 16], as GatedDeltaNet's own init, but
        # A_log drawn uniformly: no libm call, so no platform-dependent ulp.
        return (LN16 * rng.random_sample(default.shape)).astype(np.float32)
    if path.endswith("model.norm.weight"):
        # The final norm's gain is the logit temperature: it peaks the
        # softmax without moving the argmax. (Adding works for both the
        # w and the 1 + w conventions.)
        gain = FINAL_NORM_GAIN[family]
        jitter = _uniform(rng, default.shape, 0.1)
        return default.astype(np.float32) + (gain - 1) + jitter
    if default.ndim <= 1:
        # Norm scales, dt_bias, layer scalars: the module default (1 or 0)
        # plus a little noise so no two channels are alike.
        return default.astype(np.float32) + _uniform(rng, default.shape, 0.1)
    if "embed_tokens" in path:
        return _uniform(rng, default.shape, EMBED_STD[family])
    # Linear (out, in), SwitchGLU (experts, out, in), depthwise conv (C, K, 1):
    # 1/sqrt(fan in) keeps activations at unit scale through the layers.
    shape = default.shape
    fan_in = int(np.prod(shape[1:])) if "conv1d" in path else shape[-1]
    return _uniform(rng, default.shape, fan_in**-0.5)


def _instantiate(cfg: dict) -> nn.Module:
    model_class, args_class = _get_classes(config=cfg)
    return model_class(args_class.from_dict(copy.deepcopy(cfg)))


def _weights(model, family, seed, noise=0.0, noise_seed=None) -> dict:
    weights = {}
    for path, value in tree_flatten(model.parameters()):
        if path in _DROPPED.get(family, ()):
            continue
        w = _init_value(family, seed, path, np.array(value))
        if noise and w.ndim >= 2:
            # fsum is exactly rounded: the same rms on every platform.
            squares = np.square(w, dtype=np.float64).ravel()
            rms = math.sqrt(math.fsum(squares) / w.size)
            w = w + _uniform(_rng("noise", noise_seed, path), w.shape, noise * rms)
        weights[path] = mx.array(w)
    return weights


def _cast(model: nn.Module, dtype: str) -> None:
    # As mlx_lm.convert does: floating parameters to `dtype`, except those
    # the model's cast_predicate keeps (qwen3_5 keeps A_log in float32).
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    target = getattr(mx, dtype)
    keep = getattr(model, "cast_predicate", lambda _: True)

    def cast(path, v):
        if keep(path) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(target)
        return v

    model.update(tree_map_with_path(cast, model.parameters()))


def cpu_limitation(family: str, dtype: str, bits: Optional[int]) -> Optional[str]:
    """Why this variant cannot run a forward on the MLX CPU backend, or None.

    MLX's CPU gather_mm (SwitchGLU's unquantized expert matmul) only takes
    float32: "[GatherMM::eval] Currently only supports float32." Quantized
    experts go through gather_qmm, which takes any activation dtype."""
    moe = CONFIGS.get(family, {}).get("num_experts", 0) > 0
    if moe and bits is None and dtype != "float32":
        return (
            f"{family} {dtype}: MoE experts use gather_mm, which the MLX CPU "
            "backend runs in float32 only; use float32 or a quantized variant"
        )
    return None


def _make(family, dtype, bits, seed, noise=0.0, noise_seed=None) -> nn.Module:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if mx.default_device() == mx.cpu and (why := cpu_limitation(family, dtype, bits)):
        raise ValueError(f"refusing to build a model the CPU cannot run: {why}")
    seed = int(seed)  # a numpy integer would change the repr-keyed streams
    noise_seed = None if noise_seed is None else int(noise_seed)
    cfg = config(family)
    model = _instantiate(cfg)
    weights = _weights(model, family, seed, noise, noise_seed)
    # The loader's path: sanitize (which may drop modules, e.g. Gemma 3's
    # lm_head), then a strict load, then eval mode. eval() matters: the
    # GatedDeltaNet picks its Metal kernel only when not training.
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    # Cast and quantize on the CPU whatever the default device, so a GPU
    # machine produces the same bytes as a CPU one.
    with mx.stream(mx.cpu):
        _cast(model, dtype)
        if bits is not None:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints bpw
                model, cfg = quantize_model(model, cfg, GROUP_SIZE, bits)
        mx.eval(model.parameters())
    model.zoo_card = Card(family, dtype, bits, seed, cfg, noise, noise_seed)
    return model


def build(
    family: str, dtype: str = "float32", bits: Optional[int] = None, seed: int = 0
) -> nn.Module:
    """The zoo model of `family`: seeded weights, cast to `dtype`, quantized
    to `bits` (affine, group 64) if given, evaluated."""
    return _make(family, dtype, bits, seed)


def drafter(
    family: str,
    dtype: str = "float32",
    bits: Optional[int] = None,
    seed: int = 0,
    noise: Optional[float] = None,
    noise_seed: int = 1,
) -> nn.Module:
    """A draft model for ``build(family, dtype, bits, seed)``: the same
    architecture and tokenizer, every weight matrix perturbed by seeded noise
    of RMS ``noise`` times the matrix's RMS (before cast and quantization).
    noise=0 gives the target itself; the default (DRAFT_NOISE) agrees with
    the target's greedy token on roughly half the positions, so speculative
    rounds see full, partial and zero acceptance."""
    noise = DRAFT_NOISE[family] if noise is None else float(noise)
    return _make(family, dtype, bits, seed, noise, noise_seed)


# ---------------------------------------------------------------------------
# Saving and the checkpoint cache.
# ---------------------------------------------------------------------------


def save(
    model_or_family: Union[nn.Module, str],
    path: Union[str, Path],
    *,
    config: Optional[dict] = None,
    **build_kwargs,
) -> Path:
    """Write an mlx-lm checkpoint directory: config.json (with the
    "quantization" entry for quantized models), model.safetensors (+ index)
    and the zoo tokenizer. `model_or_family` is a zoo model, any model with
    `config=` given, or a family name (built with `build_kwargs`)."""
    if isinstance(model_or_family, str):
        model = build(model_or_family, **build_kwargs)
    else:
        if build_kwargs:
            given = sorted(build_kwargs)
            raise TypeError(f"build arguments {given} given with a model")
        model = model_or_family
    cfg = copy.deepcopy(config if config is not None else card(model).config)
    path = Path(path)
    save_model(path, model)
    save_config(cfg, path / "config.json")  # adds quantization_config, sorts
    save_tokenizer(path)
    return path


def _fingerprint(family: str) -> str:
    # Everything that decides a checkpoint's bytes, besides the code itself
    # (which VERSION stands for), so an edited config never hits a stale cache.
    recipe = {
        "version": VERSION,
        "config": config(family),
        "embed_std": EMBED_STD[family],
        "final_norm_gain": FINAL_NORM_GAIN[family],
        "group_size": GROUP_SIZE,
        "tokenizer": _tokenizer_json(),
    }
    blob = json.dumps(recipe, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_root() -> Path:
    root = os.environ.get("TREESPEC_ZOO_DIR")
    return Path(root) if root else Path.home() / ".cache" / "treespec" / "zoo"


def _cached(name: str, make, root) -> Path:
    root = Path(root) if root is not None else default_root()
    final = root / name
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Write aside, then rename: a rename is atomic, so a reader (or a racing
    # pytest-xdist worker) sees either nothing or a complete checkpoint.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        save(make(), tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").exists():
                raise
            # Another process won the race with identical bytes; keep theirs.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _name(family, dtype, bits, seed) -> str:
    if family not in CONFIGS:
        raise ValueError(f"unknown zoo family {family!r}; known: {FAMILIES}")
    q = f"q{bits}" if bits else "full"
    return f"{family}-{dtype}-{q}-s{seed}-{_fingerprint(family)}"


def checkpoint(
    family: str,
    dtype: str = "float32",
    bits: Optional[int] = None,
    seed: int = 0,
    root: Union[str, Path, None] = None,
) -> Path:
    """Path of the saved checkpoint of ``build(family, dtype, bits, seed)``,
    created on first use under `root` (default: $TREESPEC_ZOO_DIR or
    ~/.cache/treespec/zoo)."""
    name = _name(family, dtype, bits, seed)
    return _cached(name, lambda: build(family, dtype, bits, seed), root)


def drafter_checkpoint(
    family: str,
    dtype: str = "float32",
    bits: Optional[int] = None,
    seed: int = 0,
    noise: Optional[float] = None,
    noise_seed: int = 1,
    root: Union[str, Path, None] = None,
) -> Path:
    """Path of the saved checkpoint of the matching ``drafter(...)``."""
    noise = DRAFT_NOISE[family] if noise is None else float(noise)
    name = _name(family, dtype, bits, seed) + f"-draft{noise!r}-n{noise_seed}"
    return _cached(
        name, lambda: drafter(family, dtype, bits, seed, noise, noise_seed), root
    )
