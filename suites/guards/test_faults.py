"""A fault inside ``adapter.verify`` (an exception raised mid-forward: in a
layer, in a mask call, in a recurrent mixer) leaves every cache as it was:
offsets, attention arrays, rotating rings and recurrent states byte for byte
those of an untouched copy, so a retry gives the untouched copy's logits and
commit. Trees branching and linear (a plain forward), and a root-only tree
(a ring's in-place write), on llama, gemma3_text (its window wrapped) and
qwen3_5 (recurrent). And ``put_back`` alone, per cache mode."""

from contextlib import contextmanager

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

from suites.guards import helpers
from suites.guards.helpers import Fault, Raises
from treespec import caches
from treespec.audit.states import clone, fingerprint, plain
from treespec.models import prefilled
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.adapter import TreeAdapter
from treespec.verify.attention import Sites, tree_injected

pytestmark = pytest.mark.exactness

TREES = {
    "branching": (DraftTree([5, 17, 23, 9, 40, 2], [-1, 0, 0, 1, 1, 2]), [0, 1, 4]),
    "chain": (DraftTree.linear([5, 17, 23, 9]), [0, 1, 2]),
    "root-only": (DraftTree([5], [-1]), [0]),
}
CONTEXT = 11  # past gemma3_text's window of 8: its rings have wrapped


@contextmanager
def swapped(owner, attr, stand_in):
    real = getattr(owner, attr)
    setattr(owner, attr, stand_in(real))
    try:
        yield
    finally:
        setattr(owner, attr, real)


class MaskFault(TreeAdapter):
    """Raises from its tree mask (the model asks for it mid-forward)."""

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        return _raising_masks(
            tree_injected(self.model, cache, tree, Sites(self.family.rope_attr, owners), start,
                          plans=plans, ropes=ropes), cache)


@contextmanager
def _raising_masks(injection, cache):
    """The tree injection, with every injected make_mask raising."""
    with injection as probe:
        for c in cache:
            if "make_mask" in vars(c):
                c.make_mask = Raises(c.make_mask)
        yield probe


def fault_points(family):
    """name -> a context manager planting the fault in the shared model."""
    m = helpers.model(family)
    points = {"last layer": lambda: swapped(m.layers[-1], "mlp", Raises)}
    if family == "qwen3_5":
        last_recurrent = [l for l in m.layers if "linear_attn" in l][-1]
        points["mixer"] = lambda: swapped(last_recurrent["linear_attn"], "out_proj", Raises)
    return points


# A chain or a single node is a plain forward: no tree mask is injected, so
# the mask fault is planted in branching trees only.
CASES = [(f, p, t) for f in ("llama", "gemma3_text", "qwen3_5")
         for p in ["last layer", "mask"] + (["mixer"] if f == "qwen3_5" else [])
         for t in TREES if p != "mask" or t == "branching"]


@pytest.mark.parametrize("family, point, tree_name", CASES)
def test_a_fault_inside_verify_leaves_every_cache_as_it_was(family, point, tree_name):
    tree, path = TREES[tree_name]
    model = helpers.model(family)
    cache = prefilled(model, helpers.prompt(CONTEXT, seed=4))
    untouched = clone(cache)
    before = fingerprint(cache)
    if point == "mask":
        real = adapter_for(model)
        adapter = MaskFault(model, real.family, real.recurrent, real.found)
        with pytest.raises(Fault):
            adapter.verify(tree, cache)
    else:
        adapter = adapter_for(model)
        with fault_points(family)[point](), pytest.raises(Fault):
            adapter.verify(tree, cache)
    assert fingerprint(cache) == before
    # A retry is the untouched copy's verify, commit and next step.
    adapter, reference = adapter_for(model), adapter_for(model)
    want = reference.verify(tree, untouched)
    got = adapter.verify(tree, cache)
    assert mx.array_equal(got, want).item()
    adapter.commit(cache, tree, path)
    reference.commit(untouched, tree, path)
    assert mx.array_equal(plain(model, cache, [7, 8]), plain(model, untouched, [7, 8])).item()


def _written(c, n):
    """``n`` one-token updates of ``c``, as a forward's layer writes them."""
    for t in range(n):
        k = mx.full((1, 2, 1, 32), float(t + 1))
        c.update_and_fetch(k, -k)


@pytest.mark.parametrize("make", [
    lambda: KVCache(),
    lambda: QuantizedKVCache(group_size=32, bits=8),
    lambda: RotatingKVCache(max_size=4),
], ids=["kv", "quantized", "rotating"])
@pytest.mark.parametrize("writes", [1, 300], ids=["in-place", "past-the-buffer"])
def test_put_back_undoes_in_place_writes_new_arrays_and_new_attributes(make, writes):
    """What ``restored_on_error`` relies on, per cache mode: after a hold,
    writes (in place inside the buffer, or growing it into new arrays) and an
    attribute a forward set are undone byte for byte by ``put_back``, rows
    past the offset included (an appending cache's own hold, arrays kept by
    copy, not by reference; the others every attribute)."""
    c = make()
    _written(c, 5)
    mx.eval([a for a in vars(c).values() if isinstance(a, mx.array)])
    before = fingerprint([c])
    held = caches.hold([c])
    _written(c, writes)
    c.stray = 1
    caches.put_back(held)
    assert fingerprint([c]) == before