"""The exactness gate: measure, per configuration, whether a tree verify
gives the same bytes as the single-token chain it stands for.

Byte identity is not a property of the algorithm: it depends on which kernel
the backend picks for each sequence length M (a tree changes M every round),
on the dtype, the quantization and the BLAS (README, "The exactness gate",
has the measured table: bit-identical on the CPU's reference BLAS, not under
OpenBLAS in float32, not on the H200 in any dtype). So the gate measures
instead of assuming.

``probe`` verifies each shape from one prefilled cache state and compares
every node's logits byte for byte with single-token steps over its root path,
over several independent draws. Results are memoized under a key of what can
change them. ``decide`` turns a probe into run / decline.
"""

import copy
import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .blas import detect
from .models import model_type, prefilled, vocab_size
from .tree import DraftTree
from .verify import adapter_for

DRAWS = 3  # one draw is a coin toss when only a few bytes move
CONTEXT = 24


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

    @property
    def identical(self) -> bool:
        return all(s.identical for s in self.shapes)

    @property
    def max_abs_diff(self) -> float:
        return max((s.max_abs_diff for s in self.shapes), default=0.0)

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
        return "\n".join(rows)

    def to_json(self) -> dict:
        d = asdict(self)
        d["identical"], d["max_abs_diff"] = self.identical, self.max_abs_diff
        d["argmax_flips"] = self.argmax_flips
        return d


_DIGESTS: Dict[tuple, str] = {}


def _weights_digest(model: nn.Module) -> str:
    """Identity of the weights: every name, shape, dtype and byte. A sampled
    hash could miss an edit and reuse a stale verdict. Hashing costs ~1 s per
    GB, so it is remembered per set of parameter arrays (loading or updating
    weights makes new arrays, hence a new hash)."""
    params = tree_flatten(model.parameters())
    ids = tuple((name, id(w)) for name, w in params)
    if ids not in _DIGESTS:
        _DIGESTS[ids] = _hash_weights(params)
    return _DIGESTS[ids]


def _hash_weights(params) -> str:
    h = hashlib.sha256()
    for name, w in params:
        h.update(f"{name}:{w.shape}:{w.dtype}".encode())
        h.update(bytes(memoryview(mx.contiguous(w).view(mx.uint8) if w.dtype == mx.bfloat16 else w)))
    return h.hexdigest()[:16]


def configuration(model: nn.Module) -> dict:
    """Everything the verdict depends on, readable."""
    params = dict(tree_flatten(model.parameters()))
    dtypes = sorted({str(v.dtype) for k, v in params.items()
                     if not k.endswith((".scales", ".biases")) and mx.issubdtype(v.dtype, mx.floating)})
    quant = sorted({(getattr(m, "bits", None), getattr(m, "group_size", None))
                    for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))})
    return {
        "model_type": model_type(model),
        "weights": _weights_digest(model),
        "dtypes": dtypes,
        "weight_quant": [f"{b}bit/g{g}" for b, g in quant],
        "kv_quant": None,
        "blas": detect().key(),
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
    }


def _key(config: dict, shapes) -> str:
    blob = json.dumps([config, [list(s) for s in shapes]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _chain_logits(model, base, tree) -> Dict[int, mx.array]:
    """Each node's logits from single-token steps over its root path, the way
    classic decoding computes them, each root path from its own copy of the
    prefilled ``base`` (one prefill per draw: long contexts stay cheap)."""
    out = {}
    for leaf in tree.leaves():
        cache = copy.deepcopy(base)  # mlx-lm caches: deepcopy copies their arrays
        for node in tree.path_to(leaf):
            logits = model(mx.array([[tree.tokens[node]]]), cache=cache)[0, -1]
            if node not in out:
                out[node] = logits
        mx.eval(list(out.values()))
    return out


def compare_shape(model, parents: Sequence[int], draws: int = DRAWS, seed: int = 0,
                  context: int = CONTEXT, adapter=None) -> ShapeResult:
    """Verify ``draws`` random trees of this shape from random prefilled
    contexts and compare every node byte for byte with single-token steps.
    ``adapter``: the tree adapter measured (default ``adapter_for(model)``)."""
    adapter = adapter if adapter is not None else adapter_for(model)
    v = vocab_size(model)
    identical, worst, flips, first = True, 0.0, 0, None
    for d in range(draws):
        rng = random.Random(hash((seed, d, len(parents))) & 0xFFFFFFFF)
        ctx = [rng.randrange(v) for _ in range(context)]
        tree = DraftTree([rng.randrange(v) for _ in parents], parents)
        base = prefilled(model, ctx)
        got = adapter.verify(tree, copy.deepcopy(base))
        ref = _chain_logits(model, base, tree)
        for i in range(len(tree)):
            a, b = got[i], ref[i]
            if mx.array_equal(a, b).item():
                continue
            identical = False
            first = i if first is None else min(first, i)
            diff = mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()
            worst = max(worst, diff)
            flips += int(mx.argmax(a).item() != mx.argmax(b).item())
    return ShapeResult(tuple(parents), identical, worst, flips, first, draws)


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
          adapter=None, adapter_name: str = "treespec.verify.adapter_for") -> Probe:
    """Measure every shape; memoized per (configuration, shapes, draws, the
    adapter's name). ``adapter``: the tree adapter measured (default
    ``adapter_for(model)``), named by ``adapter_name`` in the key."""
    shapes = [tuple(s) for s in shapes]
    config = configuration(model)
    key = _key({**config, "draws": draws, "seed": seed, "adapter": adapter_name}, shapes)
    if key not in _MEMO:
        result = Probe(key, config)
        for s in shapes:
            result.shapes.append(compare_shape(model, s, draws, seed, adapter=adapter))
        _MEMO[key] = result
    return _MEMO[key]


@dataclass
class Decision:
    run: bool  # speculative mode runs
    exact: bool  # the probe found every shape identical
    reason: str
    probe: Optional[Probe] = None

    def summary(self) -> dict:
        return {"run": self.run, "exact": self.exact, "reason": self.reason,
                "probe_key": self.probe.key if self.probe else None,
                "max_abs_diff": self.probe.max_abs_diff if self.probe else None,
                "argmax_flips": self.probe.argmax_flips if self.probe else None}


def decide(model, shapes, allow_inexact: bool = False, draws: int = DRAWS, adapter=None,
           adapter_name: str = "treespec.verify.adapter_for") -> Decision:
    p = probe(model, shapes, draws, adapter=adapter, adapter_name=adapter_name)
    if p.identical:
        return Decision(True, True, f"probe passed: {len(p.shapes)} shapes bit-identical "
                        f"to single-token steps ({p.config['blas']}, {p.config['device']})", p)
    bad = [s for s in p.shapes if not s.identical]
    what = (f"{len(bad)} of {len(p.shapes)} shapes differ from single-token steps "
            f"(max |diff| {p.max_abs_diff:.3g}, {p.argmax_flips} argmax flips; first at "
            f"M={bad[0].m}) on {p.config['blas']}, {p.config['device']}, {p.config['dtypes']}")
    if allow_inexact:
        return Decision(True, False, f"INEXACT, running anyway (--allow-inexact): {what}", p)
    return Decision(False, False, f"declined to classic decode: {what}", p)
