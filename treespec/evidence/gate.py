"""The exactness gate: measure, per configuration, whether a tree verify
gives the same bytes as the single-token chain it stands for.

Byte identity is not a property of the algorithm: it depends on which kernel
the backend picks for each sequence length M (a tree changes M every round),
on the dtype, the quantization and the BLAS (docs/gate.md#where-it-declines
has the measured table: bit-identical on the CPU's reference BLAS, not under
OpenBLAS in float32, not on the H200 in any dtype). So the gate measures
instead of assuming.

``probe`` verifies each shape from one prefilled cache state and compares
every node's logits byte for byte with single-token steps over its root path,
over several independent draws, in the cache mode the run uses (``cache``:
treespec.kv_options.ProbeCache; default mlx-lm's plain cache). Results are memoized
under a key of what can change them, in this process and on disk
(treespec.evidence.gate_memo). ``decide`` turns a probe into run / decline.

Cost: per shape and draw, one prefill, one verify and one single-token step
per node (each node stepped once, from a copy of its parent's cache state).
Trees over ``MAX_PROBE_NODES`` nodes are refused before anything runs; the
round loop probes only the trees its max_tokens lets it verify.
"""

import copy
import functools
import hashlib
import json
import math
import os
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlx_lm.models.cache import make_prompt_cache

from .. import caches
from . import gate_memo
from .weights_digest import weights_digest
from ..backend.attention_check import AttentionCheck, interleaved_rows_match
from ..backend.blas import detect
from ..backend.cuda import CUDNN_SDPA
from ..errors import TreeRefused
from ..models import model_type, prefilled, vocab_size
from ..options import MAX_DRAFT_NODES
from ..backend.soundness import faults as kernel_faults, holds_scales
from ..tree import DraftTree
from ..verify import ROW_ADAPTER, adapter_for

DRAWS = 3  # one draw is a coin toss when only a few bytes move
CONTEXT = 24
# The largest tree the probe measures: its cost grows with the nodes and
# with the shapes a drafter lists (every prefix of a fixed tree).
MAX_PROBE_NODES = MAX_DRAFT_NODES + 1  # the root and the most draft nodes decode accepts


def worst_diff(a: float, b: float) -> float:
    """The larger difference, NaN if either is (max() would drop a NaN)."""
    return a if math.isnan(a) else b if math.isnan(b) else max(a, b)


ADAPTER = "treespec.verify.adapter_for"  # the default adapter's name in the key


@dataclass
class ShapeResult:
    shape: Tuple[int, ...]  # parent list
    identical: bool
    max_abs_diff: float
    argmax_flips: int  # nodes whose argmax differs from the chain's
    first_node: Optional[int]  # first node that differs, if any
    draws: int

    @property
    def m(self) -> int:
        return len(self.shape)


@dataclass
class Probe:
    key: str
    config: dict
    shapes: List[ShapeResult] = field(default_factory=list)
    seconds: float = 0.0  # what measuring it cost (0 when read back from disk)
    memo: Optional[str] = None  # the file it was stored to or read from
    source: str = "measured"  # or "disk memo"
    # Backend checks a model's layout rests on (treespec.backend.attention_check),
    # for models with a sliding window.
    checks: List[AttentionCheck] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(s.identical for s in self.shapes) and all(c.identical for c in self.checks)

    @property
    def max_abs_diff(self) -> float:
        worst = 0.0
        for s in self.shapes:
            worst = worst_diff(worst, s.max_abs_diff)
        return worst

    @property
    def argmax_flips(self) -> int:
        return sum(s.argmax_flips for s in self.shapes)

    def table(self) -> str:
        rows = [f"probe {self.key}",
                f"  {'M':>3} {'shape':<28} {'verdict':<10} {'max|diff|':>10} {'flips':>5}"]
        for s in self.shapes:
            shape = ",".join(map(str, s.shape))
            shape = shape if len(shape) <= 28 else shape[:25] + "..."
            verdict = "identical" if s.identical else "differs"
            rows.append(f"  {s.m:>3} {shape:<28} {verdict:<10} {s.max_abs_diff:>10.3g} "
                        f"{s.argmax_flips:>5}")
        for c in self.checks:
            verdict = "identical" if c.identical else "differs"
            rows.append(f"  {'-':>3} {'ring attention, ' + c.dtype:<28} {verdict:<10} "
                        f"{c.max_abs_diff:>10.3g} {'-':>5}")
        return "\n".join(rows)

    def to_json(self) -> dict:
        d = asdict(self)
        d["identical"], d["max_abs_diff"] = self.identical, self.max_abs_diff
        d["argmax_flips"] = self.argmax_flips
        return d


@functools.lru_cache(maxsize=None)
def _machine(device: str) -> dict:
    """What can change the arithmetic besides the model and the BLAS: the
    device's own name (a GPU, or an Apple chip: MLX picks kernels by it; a
    paravirtual GPU is a device of its own) and the OS (its drivers and
    system BLAS). Read once per device per process."""
    info = mx.device_info()
    return {"device_name": str(info.get("device_name", "?")),
            "architecture": str(info.get("architecture", platform.machine())),
            "os": f"{platform.system()} {platform.release()}"}


def configuration(model: nn.Module, params=None) -> dict:
    """Everything the verdict depends on, readable. ``params``:
    ``tree_flatten(model.parameters())`` if the caller has it."""
    if params is None:
        params = tree_flatten(model.parameters())
    dtypes = sorted({str(v.dtype) for k, v in params
                     if not k.endswith((".scales", ".biases")) and mx.issubdtype(v.dtype, mx.floating)})
    quant = sorted({(getattr(m, "bits", None), getattr(m, "group_size", None))
                    for _, m in model.named_modules()
                    if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
                   ) if holds_scales(params) else []
    return {
        "model_type": model_type(model),
        "weights": weights_digest(model, params),
        "dtypes": dtypes,
        "weight_quant": [f"{b}bit/g{g}" for b, g in quant],
        "kv_quant": None,
        "blas": detect(mapped=False).key(),
        "device": str(mx.default_device()),
        "machine": _machine(str(mx.default_device())),
        # MLX multiplies float32 as TF32 where the hardware has it unless this is 0:
        # read every call (a process may set it), and named even where it does nothing.
        "tf32": os.environ.get("MLX_ENABLE_TF32", "unset"),
        # cuDNN attention (CUDA; treespec's commands turn it off): another rounding
        # of a multi-token attention, so a verdict measured with it holds only with it.
        "cudnn_attention": os.environ.get(CUDNN_SDPA, "unset"),
        "mlx": mx.__version__,
    }


def _key(config: dict, shapes) -> str:
    blob = json.dumps([config, [list(s) for s in shapes]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _context_cache(model, context, steps: int = 0, fresh=prefilled) -> list:
    """A fresh cache (``fresh(model, tokens)``: the cache mode) holding
    ``context``: prefilled, its last ``steps`` tokens fed one at a time
    (which turns a sliding-window ring away from the phase a prefill leaves
    it in)."""
    cache = fresh(model, context[: len(context) - steps])
    for t in context[len(context) - steps:]:
        model(mx.array([[t]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _chain_logits(model, cache, tree) -> Dict[int, mx.array]:
    """Each node's logits from single-token steps over its root path, the way
    classic decoding computes them: from ``cache`` (a prefilled context,
    consumed), the path one token at a time. Each node is stepped once, from
    its parent's cache state (a deep copy where siblings follow: the same
    arrays and shapes, hence the same bytes as a fresh prefill and path,
    measured on both CPU BLAS regimes)."""
    out = {}
    children = [[] for _ in range(len(tree))]
    for i, p in enumerate(tree.parents[1:], 1):
        children[p].append(i)
    todo = [(0, cache)]
    while todo:
        node, cache = todo.pop()
        out[node] = model(mx.array([[tree.tokens[node]]]), cache=cache)[0, -1]
        mx.eval(out[node], [c.state for c in cache])
        kids = children[node]
        todo += [(k, copy.deepcopy(cache)) for k in kids[:-1]]
        if kids:
            todo.append((kids[-1], cache))
    return out


def _windows(model, cache) -> list:
    """The sliding windows the probe's draws cross: the cache mode's
    (``cache.windows(model)``: treespec.kv_options.ProbeCache, which adds a
    ``max_kv_size`` ring the run wraps), else the model's own."""
    return cache.windows(model) if cache is not None else caches.windows(make_prompt_cache(model))


def compare_shape(model, parents: Sequence[int], draws: int = DRAWS, seed: int = 0,
                  context: int = CONTEXT, adapter=None, cache=None) -> ShapeResult:
    """Verify ``draws`` random trees of this shape from random prefilled
    contexts and compare every node byte for byte with single-token steps.
    ``adapter``: the tree adapter measured (default ``adapter_for(model)``);
    ``cache``: the cache mode (its ``prefilled(model, tokens)`` and
    ``windows(model)``; default mlx-lm's plain cache)."""
    return compare_shapes(model, [parents], draws, seed, context, adapter, cache)[0]


class _Tally:
    """One shape's comparison over its draws."""

    def __init__(self):
        self.identical, self.worst, self.flips, self.first = True, 0.0, 0, None

    def add(self, got, ref, n: int):
        for i in range(n):
            a, b = got[i], ref[i]
            if mx.array_equal(a, b).item():
                continue
            self.identical = False
            self.first = i if self.first is None else min(self.first, i)
            # NaN when either side has a NaN: reported as such, never as 0.
            diff = mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()
            self.worst = worst_diff(self.worst, diff)
            self.flips += int(mx.argmax(a).item() != mx.argmax(b).item())

    def result(self, shape, draws) -> ShapeResult:
        return ShapeResult(shape, self.identical, self.worst, self.flips, self.first, draws)


def compare_shapes(model, shapes: Sequence[Sequence[int]], draws: int = DRAWS, seed: int = 0,
                   context: int = CONTEXT, adapter=None, cache=None) -> List[ShapeResult]:
    """:func:`compare_shape` for every shape, one result per listed shape
    (each distinct shape measured once, on its own draws). Raises ValueError,
    before any forward, for a shape over ``MAX_PROBE_NODES`` nodes."""
    shapes = [tuple(int(p) for p in s) for s in shapes]
    big = max(shapes, key=len, default=())
    if len(big) > MAX_PROBE_NODES:
        raise ValueError(
            f"a tree of {len(big)} nodes: the exactness probe measures trees of at most "
            f"{MAX_PROBE_NODES} nodes (its cost grows with them). Use a smaller tree, a "
            "smaller max_tokens (trees are cut to it), or gate=False (speculation unmeasured)")
    adapter = adapter if adapter is not None else adapter_for(model)
    fresh = cache.prefilled if cache is not None else prefilled
    v = vocab_size(model)
    window = min(_windows(model, cache), default=None)
    measured = {}
    for parents in dict.fromkeys(shapes):
        tally = _Tally()
        for d in range(draws):
            rng = random.Random(hash((seed, d, len(parents))) & 0xFFFFFFFF)
            n_ctx, steps = context, 0
            if window is not None and d % 2:
                # Past the window, its ring turned to a phase a prefill never
                # leaves (a verify must lay the ring out as one-token steps
                # see it).
                n_ctx, steps = window + 1 + d, 1 + d
            ctx = [rng.randrange(v) for _ in range(n_ctx)]
            tree = DraftTree([rng.randrange(v) for _ in parents], parents)
            state = _context_cache(model, ctx, steps, fresh)
            ref = _chain_logits(model, copy.deepcopy(state), tree)
            tally.add(adapter.verify(tree, state), ref, len(tree))
        measured[parents] = tally.result(parents, draws)
    return [measured[s] for s in shapes]


def shapes_for(block: int, trees: Sequence[Sequence[int]] = ()) -> List[Tuple[int, ...]]:
    """Chains of every width 1..block, then the given branching shapes."""
    out = [tuple(range(-1, m - 1)) for m in range(1, block + 1)]
    for t in trees:
        t = tuple(int(p) for p in t)
        if t not in out:
            out.append(t)
    return out


_MEMO: Dict[str, Probe] = {}


def probe(model, shapes: Sequence[Sequence[int]], draws: int = DRAWS, seed: int = 0,
          adapter=None, adapter_name: str = ADAPTER, cache=None,
          note: Optional[Callable[[str], None]] = None, params=None) -> Probe:
    """Measure every shape; memoized per (configuration, cache mode, shapes,
    draws, the adapter's name). ``adapter``: the tree adapter measured
    (default ``adapter_for(model)``), named by ``adapter_name`` in the key;
    ``cache``: the cache mode (treespec.kv_options.ProbeCache; None: mlx-lm's plain
    cache). Probes of the default adapter are also kept on disk
    (treespec.evidence.gate_memo); ``note`` receives why a stored file was ignored.
    ``params``: ``tree_flatten(model.parameters())`` if the caller has it."""
    shapes = [tuple(s) for s in shapes]
    mode = cache.describe() if cache is not None else None
    config = {**configuration(model, params), **(mode or {})}
    keyed = {**config, "draws": draws, "seed": seed, "adapter": adapter_name}
    key = _key(keyed, shapes)
    if key not in _MEMO:
        # treespec's own adapters: code source_digest covers
        persist = adapter_name in (ADAPTER, ROW_ADAPTER)
        expect = gate_memo.stamp(key, keyed, shapes) if persist else None
        kw = {} if note is None else {"note": note}
        stored = gate_memo.load(expect, **kw) if persist else None
        if stored is not None:
            results, path = stored
            result = Probe(key, config, [ShapeResult(**{**r, "shape": tuple(r["shape"])})
                                         for r in results], memo=str(path), source="disk memo")
        else:
            t0 = time.perf_counter()
            result = Probe(key, config)
            result.shapes.extend(compare_shapes(model, shapes, draws, seed, adapter=adapter,
                                                cache=cache))
            result.seconds = time.perf_counter() - t0
            if persist:
                path = gate_memo.save(expect, [asdict(r) for r in result.shapes], **kw)
                result.memo = str(path) if path is not None else None
        # Not stored: measured in every process (a backend property, cheap).
        if _windows(model, cache):
            result.checks = [interleaved_rows_match(_DTYPES[d], draws=RING_DRAWS)
                             for d in config["dtypes"] if d in _DTYPES]
        _MEMO[key] = result
    return _MEMO[key]


# Draws of the ring-attention check: enough for a reordered sum to show in
# bfloat16, whose rounding hides most of them (suites/ring pins it).
RING_DRAWS = 32
_DTYPES = {str(t): t for t in (mx.float32, mx.float16, mx.bfloat16)}


@dataclass
class Decision:
    run: bool  # speculative mode runs
    exact: bool  # the probe found every shape identical
    reason: str
    probe: Optional[Probe] = None

    def summary(self) -> dict:
        p = self.probe
        return {"run": self.run, "exact": self.exact, "reason": self.reason,
                "probe_key": p.key if p else None,
                "max_abs_diff": p.max_abs_diff if p else None,
                "argmax_flips": p.argmax_flips if p else None,
                "probe_seconds": p.seconds if p else None,
                "probe_source": p.source if p else None,
                "probe_memo": p.memo if p else None}


def unsound_decision(model, shapes, params=None) -> Optional[Decision]:
    """The decline, before any probe, of a model whose quantized products are
    unsound on this backend at the shapes' widths (treespec.backend.soundness); None
    where they are sound, or where ``params`` (``tree_flatten(model.parameters())``,
    if the caller has it) hold no quantized module."""
    if params is not None and not holds_scales(params):
        return None
    unsound = kernel_faults(model, sorted({1, *(len(s) for s in shapes)}))
    if not unsound:
        return None
    return Decision(False, False, "declined to classic decode: this backend computes the model's "
                    "quantized products unsoundly, so no probe can measure a verify against them "
                    f"({'; '.join(map(str, unsound))})")


def decide(model, shapes, allow_inexact: bool = False, draws: int = DRAWS, adapter=None,
           adapter_name: str = ADAPTER, cache=None) -> Decision:
    """Run / decline from ``probe`` (``cache``: the cache mode, as there).
    Declined without a probe (``--allow-inexact`` or not: nothing could be
    measured) where the model's quantized products are unsound on this
    backend (treespec.backend.soundness), and where the backend cannot run the
    probe's forwards at all in this cache mode (an MLX error, quoted)."""
    params = tree_flatten(model.parameters())  # walked once for every check below
    unsound = unsound_decision(model, shapes, params)
    if unsound is not None:
        return unsound
    try:
        p = probe(model, shapes, draws, adapter=adapter, adapter_name=adapter_name, cache=cache,
                  params=params)
    except RuntimeError as e:  # MLX's own: a kernel this backend lacks, a failed launch
        d = cache.describe() if cache is not None else None
        mode = f" in cache mode {', '.join(f'{k} {v}' for k, v in d.items())}" if d else ""
        return Decision(False, False, "declined to classic decode: this backend cannot run the "
                        f"probe's multi-token forwards{mode}: {str(e).splitlines()[0][:200]}")
    except TreeRefused as e:
        # The adapter refuses a shape the run would verify (on this backend, in this cache
        # mode, at this size): nothing was measured, and the rounds would be refused the
        # same way. A decline saying why, never an exception out of a decode.
        return Decision(False, False, f"declined to classic decode: the adapter refuses a "
                        f"shape this run would verify: {e.reason}")
    if p.identical:
        return Decision(True, True, f"probe passed: {len(p.shapes)} shapes bit-identical "
                        f"to single-token steps ({p.config['blas']}, {p.config['device']})", p)
    bad = [s for s in p.shapes if not s.identical]
    where = f"on {p.config['blas']}, {p.config['device']}, {p.config['dtypes']}"
    if bad:
        what = (f"{len(bad)} of {len(p.shapes)} shapes differ from single-token steps "
                f"(max |diff| {p.max_abs_diff:.3g}, {p.argmax_flips} argmax flips; first at "
                f"M={bad[0].m}) {where}")
    else:
        ring = [c for c in p.checks if not c.identical]
        what = (f"this backend's attention does not give a masked multi-query row the bits of "
                f"a one-query step in {', '.join(c.dtype for c in ring)} (max |diff| "
                f"{max(c.max_abs_diff for c in ring):.3g}), which the sliding-window verify "
                f"rests on (treespec.backend.attention_check) {where}")
    if allow_inexact:
        return Decision(True, False, f"INEXACT, running anyway (--allow-inexact): {what}", p)
    return Decision(False, False, f"declined to classic decode: {what}", p)
