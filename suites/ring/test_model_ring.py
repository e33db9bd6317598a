"""Sliding-window models verify as classic decoding decodes: on a
RotatingKVCache at every phase of its ring (the slot its next one-token
step writes), every node's logits equal, bit for bit, the last of the
one-token steps over its root path (mlx-lm's own generate_step arithmetic),
and after a commit the ring holds the verify's rows where the path's
one-token steps write them and the next steps equal those of a cache that
took the path one token at a time. mlx-lm's own multi-token forward does not: it puts a
wrapped ring in time order first, so its sums run in another order
(``test_a_plain_multi_token_forward_on_a_wrapped_ring_is_not_the_reference``
pins that this suite would see the difference)."""

import copy

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from suites.helpers_numerics import check, exact
from suites.verdict import ROLLBACK_DECODE, ROLLBACK_ROWS
from suites.verify.helpers import assert_rows_are_root_path_forwards
from treespec import caches, zoo
from treespec.audit.movement import mismatches, moved, recorded
from treespec.evidence import numerics
from treespec.evidence.attention_rows import decode_proof
from treespec.models import prefilled
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

WINDOWED = [("gemma3_text", "float32"), ("gemma3_text", "bfloat16"), ("gemma3_text", "float16"),
            ("gemma4_text", "float32"), ("gemma4_text", "float16")]
SHAPES = {
    "chain-4": [-1, 0, 1, 2],
    "bush": [-1, 0, 0, 1, 1, 2, 4],
}


def _model(family, dtype):
    return zoo.build(family, dtype)


def one_token_steps(model, cache, tokens):
    """Logits of one-token steps over ``tokens`` on a copy of ``cache``, and
    the copy after them."""
    c = copy.deepcopy(cache)
    out = [model(mx.array([[t]]), cache=c)[0, -1] for t in tokens]
    mx.eval(out, [x.state for x in c])
    return out, c


def ring_state(model, window, phase, seed, keep_caches=None):
    """A cache past its window, turned ``phase`` one-token steps from where a
    prefill leaves the ring."""
    rng = np.random.RandomState(seed)
    ctx = rng.randint(0, zoo.VOCAB_SIZE, size=window + 3).tolist()
    cache = keep_caches() if keep_caches else None
    if cache is None:
        cache = prefilled(model, ctx)
    else:
        model(mx.array([ctx]), cache=cache)
    for t in rng.randint(0, zoo.VOCAB_SIZE, size=phase):
        model(mx.array([[int(t)]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache, rng


def assert_verify_and_commit_are_classic(model, cache, rng, parents):
    """Every node's row equals the last of its root path's one-token steps,
    and after a commit the next steps equal those of a cache that took the
    path one token at a time: bit for bit where the backend is exact (the
    CPU reference BLAS: any difference FAILs), within its measured envelope
    elsewhere (suites/helpers_numerics.check). The commit keeps the verify's
    own rows where the path's one-token steps would have written them: bit
    for bit everywhere (treespec.audit.movement)."""
    tree = DraftTree(rng.randint(0, zoo.VOCAB_SIZE, size=len(parents)).tolist(), parents)
    adapter = adapter_for(model)
    ours = copy.deepcopy(cache)
    context = caches.offset(cache)
    with recorded(ours) as writes:  # the rows the verify writes, for the commit's check
        logits = adapter.verify(tree, ours)
    mx.eval(logits)
    # The tree-node contract's one judgement (suites/verify/helpers): against
    # the one-token steps over each root path (classic decoding, on a ring),
    # with isolation and the leak proof where the envelope cannot decide.
    assert_rows_are_root_path_forwards(model, cache, tree, logits, mode="ring")
    widths = numerics.widths_of(tree, 1)
    path = tree.path_to(int(rng.randint(len(tree))))
    adapter.commit(ours, tree, path)
    # Data movement, bit for bit on every backend: the ring holds, slot by
    # slot, what mlx-lm's own one-token updates of the verify's rows of the
    # path leave in a copy of the pre-verify ring (kept slots included).
    bad = mismatches(ours, moved(copy.deepcopy(cache), writes, path, len(tree)))
    assert not bad, f"after committing {path}: not the path's one-token writes: {bad}"
    exact(ROLLBACK_ROWS, model, "ring")
    tokens = [tree.tokens[j] for j in path]
    _, ref_cache = one_token_steps(model, cache, tokens)
    later = rng.randint(0, zoo.VOCAB_SIZE, size=3).tolist()
    a, _ = one_token_steps(model, ours, later)
    b, _ = one_token_steps(model, ref_cache, later)
    # Where the envelope cannot decide: the steps differ only where the caches
    # do, in rows only the attentions read (treespec.evidence.attention_rows);
    # the control holds another branch's rows in the path's place.
    stale = lambda: one_token_steps(model, cache, [(tokens[0] + 1) % zoo.VOCAB_SIZE]  # noqa: E731
                                    + tokens[1:])[1]
    check(mx.stack(a), mx.stack(b), model, context + len(path), widths, ROLLBACK_DECODE,
          mode="ring", what=f"steps after committing {path}",
          attention=lambda: decode_proof(model, ours, ref_cache, [[t] for t in later], stale()))


def _phases(window):
    return sorted({0, 1, window // 2, window - 1, window, window + 1})


@pytest.mark.slow
@pytest.mark.parametrize("family, dtype", WINDOWED, ids=[f"{f}-{d}" for f, d in WINDOWED])
@pytest.mark.parametrize("shape", list(SHAPES) + ["deeper-than-window"])
def test_a_verify_on_a_wrapped_ring_is_classic_decoding_at_every_phase(family, dtype, shape):
    model = _model(family, dtype)
    window = zoo.config(family)["sliding_window"]
    parents = SHAPES.get(shape) or list(range(-1, window + 1))
    for phase in _phases(window):
        cache, rng = ring_state(model, window, phase, seed=phase)
        assert_verify_and_commit_are_classic(model, cache, rng, parents)


@pytest.mark.parametrize("prefill", [3, 11, 20])
def test_kept_slots_verify_and_commit_as_classic_decoding(prefill):
    """mlx-lm's ring for ``--max-kv-size`` (make_prompt_cache(max_kv_size=...)
    on a model without its own caches) keeps its first 4 tokens: the layout
    keeps them too, and a commit leaves the ring the path's one-token steps
    leave, before the ring fills, once the prompt wraps it, and at every
    phase of a wrapped ring."""
    model = _model("qwen3", "float32")
    size = 12
    for phase in (0, 1, 5, 9):
        rng = np.random.RandomState(prefill * 31 + phase)
        cache = make_prompt_cache(model, max_kv_size=size)
        assert {(type(c), c.keep) for c in cache} == {(RotatingKVCache, 4)}
        model(mx.array([rng.randint(0, zoo.VOCAB_SIZE, size=prefill).tolist()]), cache=cache)
        for t in rng.randint(0, zoo.VOCAB_SIZE, size=phase):
            model(mx.array([[int(t)]]), cache=cache)
        mx.eval([c.state for c in cache])
        for parents in SHAPES.values():
            assert_verify_and_commit_are_classic(model, cache, rng, parents)


def test_a_plain_multi_token_forward_on_a_wrapped_ring_is_not_the_reference():
    """The control: mlx-lm's multi-token forward over a root path (time-
    ordered keys) differs from its one-token steps on a wrapped float32
    ring, so the comparison above would catch a verify that took it."""
    model = _model("gemma3_text", "float32")
    window = zoo.config("gemma3_text")["sliding_window"]
    differing = 0
    for phase in (1, 3, 5):
        cache, rng = ring_state(model, window, phase, seed=phase)
        tokens = rng.randint(0, zoo.VOCAB_SIZE, size=4).tolist()
        steps, _ = one_token_steps(model, cache, tokens)
        plain = model(mx.array([tokens]), cache=copy.deepcopy(cache))[0]
        differing += sum(not mx.array_equal(plain[i], steps[i]).item() for i in range(4))
    assert differing > 0
