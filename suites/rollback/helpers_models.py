"""Model-level plumbing for the rollback suite: zoo models, the cache setups
each family runs in, and one verify + commit round against a reference that
only ever saw the accepted path."""

import importlib
from contextlib import contextmanager
from functools import lru_cache

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map
from mlx_lm.models.cache import (
    ConcatenateKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from suites.helpers_numerics import check, exact, model_label
from suites.rollback.helpers_caches import assert_same, observe
from suites.verdict import ROLLBACK_DECODE, ROLLBACK_ROWS, VERIFY, expect
from treespec.evidence import numerics
from treespec import zoo
from treespec.audit.movement import mismatches, moved, recorded
from treespec.audit.states import clone
from treespec.rollback import (
    capture_recurrent_inputs,
    capture_written,
    commit_path,
    single_updates,
    snapshot,
)
from treespec.backend.census_position import position_census
from treespec.evidence.same_width import position_reason, same_width_path, same_width_rows
from treespec.verify import adapter_for

from treespec.verify.tree_recurrence import TreeRecurrence

RECURRENT = ("qwen3_5", "qwen3_next")

_MODELS = {}


def model(family):
    """The zoo model ``family``, or ``family/dtype`` for another activation
    dtype (built once per process)."""
    if family not in _MODELS:
        name, _, dtype = family.partition("/")
        _MODELS[family] = zoo.build(name, dtype=dtype or "float32")
    return _MODELS[family]


def recurrent(family) -> bool:
    return family.partition("/")[0] in RECURRENT


# Each setup turns the model's own caches into one cache mode. Quantizing
# happens after the history, the way mlx-lm's maybe_quantize_kv_cache does.
SETUPS = {
    "native": {},
    "rotating-w12": {"replace": lambda: RotatingKVCache(max_size=12), "ring": True},
    # What make_prompt_cache(max_kv_size=...) builds for models without their
    # own make_cache: its 4 kept slots verify as one-token steps see them.
    "rotating-w12-keep4": {"replace": lambda: RotatingKVCache(max_size=12, keep=4), "ring": True},
    "concatenate": {"replace": ConcatenateKVCache},
    **{
        f"quantized-{b}bit-g{g}": {"quantize": (g, b)}
        for b in (4, 8)
        for g in (32,)  # the zoo's head dims are 16 and 32; the cache suite does 64, 128
    },
}


@lru_cache(maxsize=None)
def _kv_head_dims(family) -> frozenset:
    probe = make_prompt_cache(model(family))
    model(family)(mx.array([[1]]), cache=probe)
    return frozenset(c.keys.shape[-1] for c in probe if type(c) is KVCache)


@lru_cache(maxsize=None)
def _own_rings(family) -> bool:
    return any(isinstance(c, RotatingKVCache) for c in make_prompt_cache(model(family)))


def applicable(family, setup) -> bool:
    """mx.quantize needs head_dim to be a multiple of the group size. The
    rotating setups are mlx-lm's ``max_kv_size`` caches, which models with
    their own sliding windows never get (``make_prompt_cache`` returns the
    model's ``make_cache()``): a second ring beside their own would be in
    another ring state, which a verify refuses (suites/verify/test_refusals.py)."""
    if SETUPS[setup].get("ring") and _own_rings(family):
        return False
    quant = SETUPS[setup].get("quantize")
    dims = _kv_head_dims(family)
    return quant is None or (bool(dims) and all(d % quant[0] == 0 for d in dims))


def make_caches(family, setup):
    caches = make_prompt_cache(model(family))
    replace = SETUPS[setup].get("replace")
    if replace is not None:
        caches = [replace() if type(c) is KVCache else c for c in caches]
    return caches


def prefill(family, setup, caches, history):
    m = model(family)
    half = len(history) // 2
    for part in (history[:half], history[half:]):
        if part:
            m(mx.array(part)[None], cache=caches)
    quant = SETUPS[setup].get("quantize")
    if quant is not None:
        for i, c in enumerate(caches):
            if type(c) is KVCache:
                caches[i] = c.to_quantized(group_size=quant[0], bits=quant[1])


class _Capturing:
    """A recurrent strategy that captures the mixer inputs inside another
    strategy's instance-level swap (treespec.verify's recurrent hook)."""

    def __init__(self, inner):
        self.inner, self.name, self.captures = inner, inner.name, None

    def refusal(self, model, caches, tree):
        return self.inner.refusal(model, caches, tree)

    def kept_states(self):
        return self.inner.kept_states()

    @contextmanager
    def inject(self, model, caches, tree):
        mixers = self.inner.discovery(model).mixers  # found before the swap
        with self.inner.inject(model, caches, tree):
            with capture_recurrent_inputs(model, mixers) as captures:
                self.captures = captures
                yield


def verify(family, tree, caches):
    """treespec.verify's forward over the tree, with the recurrent inputs
    captured. Returns (logits, captures)."""
    m = model(family)
    if recurrent(family) and not tree.is_linear():
        strategy = _Capturing(TreeRecurrence())
        return adapter_for(m, recurrent=strategy).verify(tree, caches), strategy.captures
    # A chain (and a single node) goes through the recurrent layers as a
    # plain sequence: nothing is swapped, so capture around it.
    with capture_recurrent_inputs(m) as captures:
        return adapter_for(m).verify(tree, caches), captures


def has_ring(caches) -> bool:
    return any(isinstance(c, RotatingKVCache) for c in caches)


def classic(m, tokens, caches):
    """The reference's forward over an accepted path: on caches with a
    sliding-window ring, one-token steps (classic decoding; a multi-token
    forward would put a wrapped ring in time order, which neither classic
    decoding nor the verify does, docs/verify.md#sliding-window-rings), elsewhere one forward
    over the path. Returns the logits [len(tokens), vocab]."""
    if has_ring(caches):
        return mx.concatenate([m(mx.array([[t]]), cache=caches)[0] for t in tokens])
    return m(mx.array(tokens)[None], cache=caches)[0]


def _same(a, b) -> bool:
    try:
        assert_same(a, b)
        return True
    except AssertionError:
        return False


def assert_same_where_exact(a, b, env, what):
    """Two cache observations written by forwards of different widths are
    identical where the backend is exact (``env()``, measured only if they
    differ, is 0); elsewhere their difference is numerics, and the state is
    pinned by the data-movement check instead."""
    if not _same(a, b) and env().exact:
        assert_same(a, b, what)


def register(name, m):
    """Run ``m`` (a planted model) wherever ``name`` is given as the family."""
    _MODELS[name] = m


FED_AT_WIDTH = "the caches of the accepted paths fed at each verify's width"
PADDED_AT_WIDTH = "mlx-lm's plain forwards over the root paths padded to the verify's width"


def proven_at_width(a, b, same, what: str, reference: str = FED_AT_WIDTH):
    """``a`` (ours: the committed caches' logits, the verify's path rows)
    against ``b`` (the classic reference's). Where they differ but ``a``
    equals ``same`` (the same computation at the verify's width:
    ``reference``, treespec.evidence.same_width) bit for bit, that equality
    is the proof, no envelope needed: the bit-exact verdict naming it. Else
    None (judged as before)."""
    if same is None or not mx.array_equal(a, same).item() or mx.array_equal(a, b).item():
        return None
    return numerics.Verdict(numerics.BIT_EXACT, 0.0, detail=(
        f"{what}: = {reference}, bit for bit ({numerics.max_abs_diff(a, b):.3g} from the "
        "classic reference: the backend's width dependence)"))


def same_width_chain(family, setup, history, rounds, fed):
    """(caches, "") after ``history``, each round's accepted path fed at its
    tree's width (treespec.evidence.same_width.same_width_path: its own chain,
    never the committed caches') and the chunks ``fed``; or (None, why not)."""
    m, same = model(family), make_caches(family, setup)
    prefill(family, setup, same, history)
    for tree, path in rounds:
        same, why = same_width_path(m, same, tree, path)
        if same is None:
            return None, why
    for chunk in fed:
        m(mx.array(chunk)[None], cache=same)
    return same, ""


def rounds_then_decode(family, setup, history, rounds, later, measure=position_census):
    """For each (tree, path) round: verify the tree and commit the path on
    one cache list, feed only the path to a reference (:func:`classic`: on a
    sliding-window ring one token at a time, as classic decoding does), and
    the path padded to the tree's width to a second one, the padding then
    trimmed (treespec.evidence.same_width.padded_path; ``measure``: the
    census position rows it consults). Then

    - (data movement, every backend) each cache holds exactly the rows and
      recurrent states the verify itself wrote for the path
      (treespec.audit.movement), bit for bit;
    - (numerics) the verify's path rows, the cache state and the logits of
      the ``later`` token chunks equal the reference's: bit for bit where the
      backend is exact, within its measured envelope elsewhere (the state is
      then pinned by the data movement above); the later logits also
      proven bit for bit where they equal the second reference's
      (:func:`decode_on`)."""
    m = model(family)
    quant = SETUPS[setup].get("quantize")
    kv = (quant[1], quant[0]) if quant else None
    label = (model_label(m)[0], model_label(m)[1])
    ours, ref = make_caches(family, setup), make_caches(family, setup)
    prefill(family, setup, ours, history)
    prefill(family, setup, ref, history)
    offset, widths = len(history), {1}
    for r, (tree, path) in enumerate(rounds):
        pre, snap = clone(ours), snapshot(ours)
        with recorded(ours) as writes, capture_written(ours) as written:
            logits, captures = verify(family, tree, ours)
            mx.eval(logits)
        ref_logits = classic(m, [tree.tokens[i] for i in path], ref)
        widths |= set(numerics.widths_of(tree, len(path)))
        # The verify itself is suites/verify's contract; a mismatch here
        # would make the rest meaningless, so say so first. Rows that differ
        # from classic decoding's are proven where they equal the same
        # forwards at the verify's width (built only then, from ``pre``
        # before the movement check below consumes it).
        rows, what = logits[mx.array(path)], "verify rows along the path"
        same = None if mx.array_equal(rows, ref_logits).item() else \
            same_width_rows(m, pre, tree, path)[0]
        proof = proven_at_width(rows, ref_logits, same, what, PADDED_AT_WIDTH)
        if proof is not None:
            expect(proof, VERIFY, label[0], f"{label[1]} {setup}".strip())
        else:
            check(rows, ref_logits, m, offset, widths, VERIFY, kv=kv, what=what, label=label,
                  mode=setup)
        # Moved rows are read from what the verify's update wrote in even
        # rounds (as TreeAdapter.commit does), from the caches' buffers in odd
        # ones (a tree fed in parts, a cache mode without a capture).
        rows_from = single_updates(written) if r % 2 == 0 else None
        commit_path(ours, offset, path, tree, snapshot=snap, recurrent=captures,
                    written=rows_from)
        bad = mismatches(ours, moved(pre, writes, path, len(tree), captures, ours))
        assert not bad, f"after committing {path} of {tree!r}: not the verify's own rows: {bad}"
        exact(ROLLBACK_ROWS, m, setup, label)
        offset += len(path)
        env = lambda: numerics.envelope(m, offset, widths, *(kv or (None, None)))
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_same_where_exact(observe(a), observe(b), env, f"layer {i} after committing {path}")
    built, same, why = False, None, ""
    for k, chunk in enumerate(later):
        x = mx.array(chunk)[None]
        a, b = m(x, cache=ours), m(x, cache=ref)
        if not built and not mx.array_equal(a, b).item():  # built only where needed
            built = True
            same, why = same_width_chain(family, setup, history, rounds, later[:k])
        s = None if same is None else m(x, cache=same)
        widths.add(len(chunk))
        what = f"logits on {chunk} after the commits"
        proof = proven_at_width(a, b, s, what)
        if proof is not None:
            expect(proof, ROLLBACK_DECODE, label[0], f"{label[1]} {setup}".strip())
        else:  # judged, saying why no same-width reference proved it
            if same is not None and not why:  # it differs: the backend's placement?
                why = position_reason(m, max(len(t) for t, _ in rounds), measure) or ""
            check(a, b, m, offset, widths, ROLLBACK_DECODE, kv=kv, label=label, mode=setup,
                  what="; ".join(x for x in (what, why) if x))
        offset += len(chunk)


# Other mlx-lm families whose recurrent mixers keep their state in an
# ArraysCache (layer.mixer in mamba/mamba2, layer.conv in lfm2): tiny random
# models, fed chains here (their branching trees: suites/families).
OTHER_RECURRENT = {
    "mamba": dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, state_size=8,
        num_hidden_layers=2, conv_kernel=4, use_bias=False, use_conv_bias=True,
        time_step_rank=4,
    ),
    "mamba2": dict(
        num_heads=4, head_dim=16, vocab_size=64, hidden_size=32, intermediate_size=64,
        state_size=8, num_hidden_layers=2, layer_norm_epsilon=1e-5, conv_kernel=4,
        n_groups=1, use_bias=False, use_conv_bias=True, tie_word_embeddings=True,
        time_step_limit=(0.0, float("inf")), time_step_rank=4,
    ),
    "lfm2": dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, norm_eps=1e-5,
        conv_bias=False, conv_L_cache=3, block_dim=32, block_multiple_of=16,
        block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False, block_ff_dim=64,
        full_attn_idxs=[1],
    ),
}


def tiny(family):
    if family not in _MODELS:
        module = importlib.import_module(f"mlx_lm.models.{family}")
        args = module.ModelArgs.from_dict({"model_type": family, **OTHER_RECURRENT[family]})
        m = module.Model(args)
        rng = np.random.RandomState(0)
        draw = lambda p: mx.array(0.2 * rng.standard_normal(p.shape), p.dtype)
        m.update(tree_map(draw, m.parameters()))
        mx.eval(m.parameters())
        _MODELS[family] = m
    return _MODELS[family]
