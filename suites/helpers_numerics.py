"""The one entry point a numeric test calls (docs/numerics.md#writing-a-numeric-test): compare two
forwards' logits against this backend's measured envelope, record the
verdict for the table, and fail or skip as it says.

    check(got, want, model, context=offset, widths=(n, k, ...), contract=VERIFY)

``treespec.evidence.numerics`` measures the envelope (memoized per process, keyed by
model, cache mode, context bucket and widths), and only when the two differ:
on a bit-exact backend nothing is measured unless something differs, and
then the envelope is 0 and the verdict FAIL.
"""

from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from suites.verdict import exact_backend, SOUND, expect  # noqa: F401  (exact_backend re-exported)
from treespec.evidence import numerics
from treespec.backend import soundness
from treespec.models import model_type




def model_label(model) -> tuple:
    """(family, dtype) for the table: the model_type, and the weights' float
    dtype with its quantization (``float32-q4``)."""
    key = id(model)
    if key not in _LABELS:
        _LABELS[key] = (model, _label(model))  # holding the model keeps its id its own
    return _LABELS[key][1]


_LABELS = {}


def _label(model):
    sizes = {}
    for k, v in tree_flatten(model.parameters()):
        if not k.endswith((".scales", ".biases")) and mx.issubdtype(v.dtype, mx.floating):
            sizes[v.dtype] = sizes.get(v.dtype, 0) + v.size
    dtype = str(max(sizes, key=sizes.get)).removeprefix("mlx.core.") if sizes else "?"
    bits = sorted({m.bits for _, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)})
    return model_type(model), dtype + "".join(f"-q{b}" for b in bits)


def envelope(model, context: int, widths: Sequence[int], kv: Optional[tuple] = None):
    """The lazy envelope (a callable) ``judge`` resolves only on a difference."""
    kv_bits, kv_group = kv or (None, None)
    return lambda: numerics.envelope(model, context, widths, kv_bits, kv_group)


def judged(got, want, model, context: int, widths: Sequence[int], kv=None, controls=None,
           what: str = "", attention=None) -> numerics.Verdict:
    return numerics.judge(got, want, envelope(model, context, widths, kv), controls, what,
                          attention=attention)


def check(got, want, model, context: int, widths: Sequence[int], contract: str, kv=None,
          controls=None, what: str = "", label: Optional[tuple] = None, mode: str = "",
          attention=None):
    """Judge ``got`` against ``want`` and :func:`suites.verdict.expect` it
    under ``contract`` for the model's (family, dtype[ mode]); ``attention``:
    judge's proof at the attentions, where the envelope cannot decide."""
    family, dtype = label or model_label(model)
    verdict = judged(got, want, model, context, widths, kv, controls, what, attention)
    return expect(verdict, contract, family, f"{dtype} {mode}".strip())


def exact(contract: str, model, mode: str = "", label: Optional[tuple] = None):
    """Record a check asserted bit for bit (data movement, a refusal) as
    bit-exact in the table; call it after the assertion held."""
    family, dtype = label or model_label(model)
    return expect(numerics.Verdict(numerics.BIT_EXACT), contract, family, f"{dtype} {mode}".strip())


def require_sound(model, widths: Sequence[int] = soundness.ROWS, label: Optional[tuple] = None):
    """``model``, once its quantized products are sound on this backend at
    ``widths`` (treespec.backend.soundness); else no test of it can give a verdict:
    recorded inconclusive under SOUND, naming the faults, and the test
    skipped (a FAIL on an exact regime). Returns the model (one without
    quantized products passes as it is)."""
    found = soundness.faults(model, widths)
    if found:
        family, dtype = label or model_label(model)
        detail = f"{numerics.UNSOUND}: " + "; ".join(map(str, found))
        expect(numerics.Verdict(numerics.INCONCLUSIVE, float("nan"), detail=detail), SOUND,
               family, dtype)
    return model
