"""mlx-lm's KV cache options (``--max-kv-size``, ``--kv-bits``,
``--kv-group-size``, ``--quantized-kv-start``) in a speculative run, kept as
mlx-lm's ``generate_step`` keeps them so the text stays classic decoding's:

- caches: ``make_prompt_cache(model, max_kv_size)``, for the target and the
  drafter alike (a ``RotatingKVCache(max_kv_size, keep=4)`` per layer for a
  model without its own ``make_cache``);
- quantization: mlx-lm's own ``maybe_quantize_kv_cache`` at mlx-lm's points,
  after every prefill chunk and after every round's commit. A classic step
  quantizes once its cache holds ``quantized_kv_start`` tokens, so a token at
  a position >= that start is computed on a quantized cache and one before it
  on a full-precision cache; a round must not straddle that point, so it is
  cut to end there (:func:`room`), as rounds are cut near ``max_tokens``;
- the cache modes the gate probes (:func:`probe_caches`): the mode of every
  round the run can verify, on a wrapped ring where the run wraps one;
- what cannot act or cannot be exact, refused before anything runs
  (:func:`refusal`).

A ``max_kv_size`` ring that wraps is not refused: a verify of 2+ nodes lays
the ring out as classic one-token steps see it, the 4 kept slots included,
and the commit leaves what the path's one-token steps leave
(treespec.ring, treespec.caches.kv.RingVerify). Measured on the CPU's
reference BLAS: chain and tree runs on wrapping rings emit mlx-lm's own
tokens for qwen3 (max_kv_size 8 to 50, prompt 20, 48 tokens; float32,
bfloat16, float16) and for the 66 families of mlx-lm without their own
caches that verify trees (max_kv_size 10 and 20; suites/e2e/test_kv_options.py
pins qwen3). Where a backend's arithmetic on such a ring differs, the gate's
probe sees it on a wrapped ring (:attr:`ProbeCache.wraps`) and declines.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional

import mlx.core as mx
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import make_prompt_cache

from . import caches
from .models import PREFILL_STEP, prefill
from .options import LIBRARY, KVOptions, Spelling

DEFAULT = KVOptions()


def make_cache(model, kv: KVOptions = DEFAULT) -> list:
    """mlx-lm's cache for ``model`` under these options."""
    return make_prompt_cache(model, max_kv_size=kv.max_kv_size)


def quantizer(kv: KVOptions = DEFAULT) -> Callable[[list], None]:
    """What mlx-lm calls after each forward: quantize every cache that can
    be once it holds ``kv.start`` tokens (a no-op without ``kv_bits``)."""
    if kv.kv_bits is None:
        return lambda cache: None
    return lambda cache: maybe_quantize_kv_cache(cache, kv.start, kv.group_size, kv.kv_bits)


def quantized_from(kv: KVOptions) -> int:
    """The first position classic decoding computes on a quantized cache:
    ``kv.start``, except that mlx-lm first checks after a forward (the first
    prefill chunk, or the first step of a one-token prompt), so never 0.
    Prefill chunks end where treespec's end (same step), so for a start
    inside the prompt both quantize at the same chunk end."""
    return max(kv.start, 1)


def room(kv: KVOptions, offset: int) -> Optional[int]:
    """Draft nodes a round whose root sits at ``offset`` may hold so that its
    last node comes before the quantization point (None: no limit)."""
    if kv.kv_bits is None or offset >= quantized_from(kv):
        return None
    return quantized_from(kv) - offset - 1


@dataclass(frozen=True)
class ProbeCache:
    """One cache mode the gate measures in: mlx-lm's cache with this
    ``max_kv_size``, quantized (``kv_bits``) right after the prefill.
    ``wraps``: the run's rounds verify on a wrapped ``max_kv_size`` ring, so
    the probe's draws cross it too (:meth:`windows`)."""

    max_kv_size: Optional[int] = None
    kv_bits: Optional[int] = None
    kv_group_size: int = 64
    wraps: bool = False

    def describe(self) -> Optional[dict]:
        """What the probe's key adds (None: mlx-lm's default cache)."""
        if self.max_kv_size is None and self.kv_bits is None:
            return None
        out = {"max_kv_size": self.max_kv_size}
        if self.wraps:
            out["ring"] = "wrapped"
        if self.kv_bits is not None:
            out["kv_quant"] = f"{self.kv_bits}bit/g{self.kv_group_size}"
        return out

    def windows(self, model) -> list:
        """The sliding windows the probe's draws must cross
        (treespec.evidence.gate): the model's own, and the ``max_kv_size``
        ring where the run wraps it. A ring the run never wraps is not
        crossed: its layout is then the plain time order, and a context past
        a large ``max_kv_size`` costs a long prefill per probed shape."""
        return caches.windows(make_prompt_cache(model, self.max_kv_size if self.wraps else None))

    def prefilled(self, model, tokens) -> list:
        cache = make_prompt_cache(model, max_kv_size=self.max_kv_size)
        prefill(model, cache, tokens, PREFILL_STEP)
        if self.kv_bits is not None:
            maybe_quantize_kv_cache(cache, 0, self.kv_group_size, self.kv_bits)
        return cache


def wraps(kv: KVOptions, prompt_len: int, max_tokens: int) -> bool:
    """Whether this run writes a key past the ``max_kv_size`` ring's last
    slot. Its last forward is at position ``prompt_len + max_tokens - 2``
    (classic decoding's; a round's nodes are cut so as not to pass it), and
    a ring of ``max_kv_size`` slots holds positions ``0 .. max_kv_size - 1``
    before it wraps."""
    return kv.max_kv_size is not None and prompt_len + max_tokens - 2 >= kv.max_kv_size


def probe_caches(kv: KVOptions, prompt_len: int, max_tokens: int) -> List[ProbeCache]:
    """The cache modes this run's rounds verify in: roots sit at offsets
    ``prompt_len - 1`` up to ``prompt_len + max_tokens - 2``; with
    ``kv_bits`` the ones before ``kv.start`` on a full-precision cache, the
    others on a quantized one; on a wrapped ring where the run wraps it."""
    ring = wraps(kv, prompt_len, max_tokens)
    plain = ProbeCache(kv.max_kv_size, wraps=ring)
    if kv.kv_bits is None:
        return [plain]
    first, last = prompt_len - 1, prompt_len + max_tokens - 2
    quantized = ProbeCache(kv.max_kv_size, kv.kv_bits, kv.group_size, wraps=ring)
    at = quantized_from(kv)
    return ([plain] if first < at else []) + ([quantized] if last >= at else [])


def refusal(kv: KVOptions, models, prompt_len: int, max_tokens: int,
            draft_nodes: Optional[int], spell: Spelling = LIBRARY) -> Optional[str]:
    """Why these options cannot act (or cannot be exact) in this run, or
    None. ``models``: the target, then the draft model in a speculative run;
    ``draft_nodes``: the most draft nodes a round verifies (None: classic).
    No rule depends on ``draft_nodes`` any more: a ring that wraps is
    verified as one-token steps see it (module docstring), so a speculative
    run is refused exactly where a classic one is."""
    if kv.max_kv_size is not None:
        for model in models:
            if hasattr(model, "make_cache"):
                return (f"{spell('max_kv_size', kv.max_kv_size)}: this {type(model).__module__}"
                        " model builds its own caches (make_cache), and mlx-lm's "
                        "make_prompt_cache ignores max_kv_size for it")
    if kv.kv_bits is not None:
        if prompt_len + max_tokens - 2 < quantized_from(kv):
            return (f"{spell('kv_bits', kv.kv_bits)} acts from position "
                    f"{quantized_from(kv)} on ({spell('quantized_kv_start', kv.start)}), and "
                    f"this run's last forward is at position {prompt_len + max_tokens - 2}: the "
                    f"cache would never be quantized (lower {spell('quantized_kv_start')}, "
                    "e.g. to 0)")
        for model in models:
            # Ask mlx-lm itself, on a cache that has seen one token: some
            # classes do not quantize, and mx.quantize needs head dims
            # divisible by the group size.
            cache = make_prompt_cache(model)
            model(mx.array([[0]]), cache=cache)
            for c in cache:
                if not hasattr(c, "to_quantized"):
                    continue  # maybe_quantize_kv_cache leaves it as it is
                try:
                    mx.eval(c.to_quantized(group_size=kv.group_size, bits=kv.kv_bits).state)
                except (NotImplementedError, ValueError) as e:
                    return (f"{spell('kv_bits', kv.kv_bits)} (group size {kv.group_size}): "
                            f"mlx-lm cannot quantize this model's {type(c).__name__}: {e}")
    return None
