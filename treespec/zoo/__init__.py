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

Layout: ``zoo.tokenizer`` (the BPE tokenizer), ``zoo.configs`` (the families'
configs and weight constants), this module (building, drafters, saving, the
checkpoint cache).
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
from pathlib import Path
from typing import Optional, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

from ..heads.eagle3 import Eagle3Head
from ..heads.mtp import MTPHead
from . import heads as head_layouts
from .configs import CONFIGS, DRAFT_NOISE, EMBED_STD, FAMILIES, FINAL_NORM_GAIN, _DROPPED, config
from .tokenizer import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    tokenizer_json,
    save_tokenizer,
    token_id,
    tokenizer,
)

# Bump when anything that changes the bytes of a saved checkpoint changes
# (init rules, tokenizer, configs): cached checkpoints are keyed by it.
VERSION = 1

__all__ = ["BITS", "QUANT_BITS", "BOS", "CONFIGS", "DTYPES", "EOS", "FAMILIES", "GROUP_SIZE", "PAD",
           "SPECIAL_TOKENS", "VERSION", "VOCAB_SIZE", "Card", "build", "card", "checkpoint",
           "config", "cpu_limitation", "default_root", "drafter", "drafter_checkpoint", "save",
           "HEADS_VERSION", "MTP_FAMILIES", "EAGLE3_LAYER_IDS", "mtp_checkpoint", "eagle3_checkpoint",
           "save_tokenizer", "token_id", "tokenizer", "tokenizer_json"]

DTYPES = ("float32", "float16", "bfloat16")
BITS = (None, 4, 8)
# What build() quantizes to (mx.quantize's affine bits; the size matrix of
# suites/plants); the zoo's checkpoints use BITS.
QUANT_BITS = (None, 2, 3, 4, 5, 6, 8)
# mlx-lm's default affine group; every dim we quantize is a multiple of it.
GROUP_SIZE = 64

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


def _make(family, dtype, bits, seed, noise=0.0, noise_seed=None, group_size=GROUP_SIZE,
          overrides=None) -> nn.Module:
    if bits not in QUANT_BITS:
        raise ValueError(f"bits must be one of {QUANT_BITS}, got {bits!r}")
    if mx.default_device() == mx.cpu and (why := cpu_limitation(family, dtype, bits)):
        raise ValueError(f"refusing to build a model the CPU cannot run: {why}")
    seed = int(seed)  # a numpy integer would change the repr-keyed streams
    noise_seed = None if noise_seed is None else int(noise_seed)
    cfg = {**config(family), **(overrides or {})}
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
                model, cfg = quantize_model(model, cfg, group_size, bits)
        mx.eval(model.parameters())
    model.zoo_card = Card(family, dtype, bits, seed, cfg, noise, noise_seed)
    return model


def build(
    family: str, dtype: str = "float32", bits: Optional[int] = None, seed: int = 0,
    group_size: int = GROUP_SIZE, overrides: Optional[dict] = None,
) -> nn.Module:
    """The zoo model of `family`: seeded weights, cast to `dtype`, quantized
    to `bits` (affine, `group_size`, default 64) if given, evaluated.
    ``overrides``: config.json fields replaced (head_dim, layers, window:
    the size matrix's models at real-model sizes)."""
    return _make(family, dtype, bits, seed, group_size=group_size, overrides=overrides)


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
        "tokenizer": tokenizer_json(),
    }
    blob = json.dumps(recipe, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_root() -> Path:
    root = os.environ.get("TREESPEC_ZOO_DIR")
    return Path(root) if root else Path.home() / ".cache" / "treespec" / "zoo"


def _cached(name: str, make, root, write=None) -> Path:
    root = Path(root) if root is not None else default_root()
    final = root / name
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Write aside, then rename: a rename is atomic, so a reader (or a racing
    # pytest-xdist worker) sees either nothing or a complete checkpoint.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        (write or save)(make(), tmp)
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


# ---------------------------------------------------------------------------
# Hidden-state heads (their layouts: treespec.zoo.heads). The target's
# weights are build()'s; the heads' are drawn by the same init rules from
# their own streams, so adding a head never moves a target weight.
# ---------------------------------------------------------------------------

# Bump when the heads' seeding or files change (their checkpoints are keyed by it).
HEADS_VERSION = 1
MTP_FAMILIES = ("qwen3_5", "qwen3_next")
# Hidden-state indices (1 = the output of layer 0) the zoo llama's head reads.
EAGLE3_LAYER_IDS = (1, 1, 2)


def _seeded(module: nn.Module, c: Card, stream: str) -> dict:
    # Floating parameters only (an EAGLE-3 head's d2t is written apart).
    target = getattr(mx, c.dtype)
    return {
        path: mx.array(_init_value(c.family, c.seed, stream + path, np.array(v))).astype(target)
        for path, v in tree_flatten(module.parameters())
        if mx.issubdtype(v.dtype, mx.floating)
    }


def _write_mtp(model: nn.Module, path: Path) -> None:
    c = card(model)
    save(model, path)
    mtp = {"mtp." + k: v for k, v in _seeded(MTPHead.build(model), c, "mtp.").items()}
    if c.family == "qwen3_5":
        head_layouts.write_mtp_shard(path, mtp)
    else:
        weights = dict(tree_flatten(model.parameters()))
        head_layouts.write_pytorch_checkpoint(path, head_layouts.pytorch_layout({**weights, **mtp}))


def mtp_checkpoint(family: str, dtype: str = "float32", seed: int = 0,
                   root: Union[str, Path, None] = None) -> Path:
    """A checkpoint of ``build(family, dtype, seed=seed)`` (qwen3_5 or
    qwen3_next) that also carries a seeded MTP module in the Qwen layout
    (``mtp.*``, see treespec.zoo.heads): ``mlx_lm.load`` opens it to the same
    model, and ``--draft-head mtp`` reads the module."""
    if family not in MTP_FAMILIES:
        raise ValueError(f"zoo MTP checkpoints exist for {MTP_FAMILIES}, not {family!r}")
    name = _name(family, dtype, None, seed) + f"-mtp-h{HEADS_VERSION}"
    return _cached(name, lambda: build(family, dtype, None, seed), root, write=_write_mtp)


def _write_eagle3(model: nn.Module, path: Path) -> None:
    c = card(model)
    vocab = c.config["vocab_size"]
    draft_ids = head_layouts.draft_vocabulary(vocab)
    config = head_layouts.eagle3_config(c.config, EAGLE3_LAYER_IDS, draft_ids.shape[0])
    weights = _seeded(Eagle3Head.build(config, model), c, "eagle3.")
    head_layouts.write_eagle3(path, config, weights, draft_ids, vocab)


def eagle3_checkpoint(family: str = "llama", dtype: str = "float32", seed: int = 0,
                      root: Union[str, Path, None] = None) -> Path:
    """A seeded EAGLE-3 head directory (speculators format) for the target
    ``checkpoint(family, dtype, seed=seed)``: reduced draft vocabulary with
    d2t / t2d, layer ids EAGLE3_LAYER_IDS, embeddings shared."""
    if family != "llama":
        raise ValueError(f"the zoo's EAGLE-3 head is for llama, not {family!r}")
    name = _name(family, dtype, None, seed) + f"-eagle3-h{HEADS_VERSION}"
    return _cached(name, lambda: build(family, dtype, None, seed), root, write=_write_eagle3)
