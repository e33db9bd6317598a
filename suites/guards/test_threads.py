"""Threads: while one thread is inside a tree verify of a model (its ropes,
mixers and recorders swapped on the model's instances), a plain forward of
the same model in another thread sees the model as it is, and a second tree
verify waits for the first. Deterministic: the verifying thread is held
inside its forward (at its first mask call) by an event, not by timing."""

import threading
import time

import mlx.core as mx
import mlx.nn as nn
import pytest

from suites.guards import helpers
from treespec.audit.states import plain
from treespec.draft import make_drafter
from treespec.models import prefilled
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify import guard
from treespec.verify.adapter import TreeAdapter
from treespec.verify.attention import Sites, TreeRoPE, tree_injected, tree_mask

pytestmark = pytest.mark.exactness

FAMILY_NAMES = ["llama", "gemma3_text", "qwen3_5"]
WAIT = 120  # seconds: only a guard against a deadlocked test, never a measurement
TREE = DraftTree([5, 17, 23, 9, 40, 2], [-1, 0, 0, 1, 1, 2])


class Held(TreeAdapter):
    """A tree adapter that stops inside its forward, at the first mask call
    (every rope, mixer and recorder is swapped by then), until released."""

    def __init__(self, model):
        real = adapter_for(model)
        super().__init__(model, real.family, real.recurrent, real.found)
        self.inside, self.release = threading.Event(), threading.Event()

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        plans = plans or {}

        def mask(c, n, window):
            if not self.inside.is_set():
                self.inside.set()
                assert self.release.wait(WAIT), "never released"
            return plans[id(c)].mask(window) if id(c) in plans else tree_mask(c, tree, window, start)

        return tree_injected(self.model, cache, tree, Sites(self.family.rope_attr, owners), start,
                             plans=plans, ropes=ropes, mask_fn=mask)


class Verifier(threading.Thread):
    """Verifies and commits ``tree`` on ``cache`` in its own thread."""

    def __init__(self, adapter, cache, tree=TREE):
        super().__init__(daemon=True)
        self.adapter, self.cache, self.tree = adapter, cache, tree
        self.logits = self.error = None

    def run(self):
        try:
            self.logits = self.adapter.verify(self.tree, self.cache)
            mx.eval(self.logits)
            self.adapter.commit(self.cache, self.tree, [0, 1, 3])
            # A commit that moves rows leaves its writes lazy, as mlx-lm's
            # caches are between steps; MLX binds a lazy array to the stream
            # of the thread that built it, so a cache handed to another
            # thread is evaluated first (docs/numerics.md#threads-and-faults).
            mx.eval([c.state for c in self.cache])
        except BaseException as e:  # reported by the test
            self.error = e


def reference(model, context):
    """What an undisturbed verify and commit give on a copy."""
    cache = prefilled(model, context)
    adapter = adapter_for(model)
    logits = adapter.verify(TREE, cache)
    mx.eval(logits)
    adapter.commit(cache, TREE, [0, 1, 3])
    return logits, plain(model, cache, [7])


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("width", [len(TREE), 3], ids=["as-wide-as-the-tree", "narrower"])
def test_a_plain_forward_in_another_thread_sees_the_model_unpatched(family, width):
    model = helpers.model(family)
    context, tokens = helpers.prompt(10, seed=1), helpers.prompt(width, seed=2)
    want = plain(model, prefilled(model, context), tokens)
    want_verify, want_next = reference(model, context)
    held, other = Held(model), prefilled(model, context)
    verifier = Verifier(held, prefilled(model, context))
    verifier.start()
    try:
        assert held.inside.wait(WAIT), verifier.error
        got = plain(model, other, tokens)
    finally:
        held.release.set()
        verifier.join(WAIT)
    assert verifier.error is None, repr(verifier.error)
    assert mx.array_equal(got, want).item()
    # The held verify, its commit and the next step are untouched by the
    # other thread's forward too.
    assert mx.array_equal(verifier.logits, want_verify).item()
    assert mx.array_equal(plain(model, verifier.cache, [7]), want_next).item()


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_second_tree_verify_of_the_model_waits_for_the_first(family):
    model = helpers.model(family)
    context = helpers.prompt(10, seed=3)
    want_verify, want_next = reference(model, context)
    first, second = Held(model), Held(model)
    second.release.set()  # the second one only records that it got inside
    a = Verifier(first, prefilled(model, context))
    b = Verifier(second, prefilled(model, context))
    a.start()
    try:
        assert first.inside.wait(WAIT), a.error
        b.start()
        deadline = time.monotonic() + WAIT
        while guard.TURN.waiting() == 0 and b.is_alive():
            assert time.monotonic() < deadline, "the second verify never queued"
            time.sleep(0.001)
        # b is queued behind a (or has failed): it has not entered its forward.
        assert b.error is None, repr(b.error)
        assert not second.inside.is_set()
    finally:
        first.release.set()
        a.join(WAIT)
        b.join(WAIT)
    for v in (a, b):
        assert v.error is None, repr(v.error)
        assert mx.array_equal(v.logits, want_verify).item()
        assert mx.array_equal(plain(model, v.cache, [7]), want_next).item()
    assert second.inside.is_set()


class HeldInInjection(nn.Module):
    """Stands in for the first layer's MLP and holds the thread that calls
    it while that layer's rope is a tree stand-in (inside a tree injection,
    every rope and mask swapped), until released: the injection's probe
    is reached after it, so the injection itself is untouched."""

    def __init__(self, layer):
        super().__init__()
        self.inner = layer.mlp
        # not a child: the layer holds this module (no cycle in the tree)
        object.__setattr__(self, "_attention", layer.self_attn)
        self.inside, self.release = threading.Event(), threading.Event()

    def __call__(self, x):
        if isinstance(self._attention.rope, TreeRoPE) and not self.inside.is_set():
            self.inside.set()
            assert self.release.wait(WAIT), "never released"
        return self.inner(x)


def drafted(drafter, model, context, root):
    """The device round of ``drafter`` on ``model``, its tokens read (in the
    calling thread: a lazy array belongs to the thread that built it)."""
    drafter.start(model, context)
    return drafter.draft(root).tree


@pytest.mark.parametrize("shape", [dict(branching=[2, 1]), dict(budget=4, width=2)],
                         ids=["fixed [2,1]", "confidence n=4 width 2"])
def test_a_tree_verify_waits_for_a_drafting_level_of_the_same_model(shape):
    """A tree drafter's wide level injects without ``adapter.verify`` (no
    snapshot to keep), still holding the verify's turn: a verify of the same
    model in another thread queues instead of meeting the level's ropes."""
    mode = dict(mode="tree", **shape)
    model = helpers.own_llama()
    context, root = helpers.prompt(10, seed=4), 7
    want_tree = drafted(make_drafter(**mode), model, context, root)
    want_verify, want_next = reference(model, context)
    held = HeldInInjection(model.model.layers[0])
    model.model.layers[0].mlp = held
    result = {}

    def draft():
        try:
            result["tree"] = drafted(make_drafter(**mode), model, context, root)
        except BaseException as e:  # reported by the test
            result["error"] = e

    a = threading.Thread(target=draft, daemon=True)
    b = Verifier(adapter_for(model), prefilled(model, context))
    a.start()
    try:
        assert held.inside.wait(WAIT), result.get("error")
        b.start()
        deadline = time.monotonic() + WAIT
        while guard.TURN.waiting() == 0 and b.is_alive():
            assert time.monotonic() < deadline, "the verify never queued"
            time.sleep(0.001)
        assert b.error is None, repr(b.error)  # queued, not refused or run
    finally:
        held.release.set()
        a.join(WAIT)
        b.join(WAIT)
    assert "error" not in result, repr(result.get("error"))
    assert result["tree"].tokens == want_tree.tokens
    assert result["tree"].parents == want_tree.parents
    assert b.error is None, repr(b.error)
    assert mx.array_equal(b.logits, want_verify).item()
    assert mx.array_equal(plain(model, b.cache, [7]), want_next).item()
