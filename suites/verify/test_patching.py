"""The injection is instance-level and temporary: nothing stays patched after
a verify, even one whose forward raised; no class is ever touched; a target
and its drafter verified in turn (or one inside the other's forward) never
see each other's patches."""

import copy

import mlx.core as mx
import pytest
from mlx_lm.models.cache import RotatingKVCache

from suites.verify import helpers
from suites.families.helpers_models import build as family_model
from suites.verify.helpers import clone, assert_rows_are_root_path_forwards
from treespec import zoo
from treespec.verify import adapter_for
from treespec.errors import TreeRefused
from treespec.verify.adapter import TreeAdapter
from treespec.caches import MODES, attention_caches
from treespec.verify.attention import TreeRoPE, rope_owners

ATTENTION_CACHES = tuple(k for k, mode in MODES.items() if mode.attention)

pytestmark = pytest.mark.exactness

TREE = helpers.branching_trees("gemma3_text")["bushy"]
CLASS_MAKE_MASK = {k: k.__dict__.get("make_mask") for k in ATTENTION_CACHES}


def ropes(model):
    return [(name, owner["rope"]) for name, owner in rope_owners(model)]


def assert_unpatched(model, cache, ropes_before):
    assert [n for n, _ in ropes(model)] == [n for n, _ in ropes_before]
    assert all(rope is before for (_, rope), (_, before) in zip(ropes(model), ropes_before))
    assert not any(isinstance(r, TreeRoPE) for _, r in ropes(model))
    assert all("make_mask" not in vars(c) and "update_and_fetch" not in vars(c) for c in cache)
    assert {k: k.__dict__.get("make_mask") for k in ATTENTION_CACHES} == CLASS_MAKE_MASK


class Boom(Exception):
    pass


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3_next"])
def test_nothing_stays_patched_after_a_verify_that_raised(family):
    model = helpers.model(family)
    adapter = adapter_for(model)
    # Branching on both: a chain is a plain forward with nothing to inject,
    # and the hybrid's branching tree also swaps its recurrent mixers.
    tree = TREE
    cache = helpers.histories(family)[3].replay(model)
    before_ropes = ropes(model)
    # The last full-attention cache raises mid-forward: masks and ropes are
    # injected by then (the earlier layers already ran). Not a ring: a
    # verify answers a ring's update_and_fetch with its layout's.
    victim = [c for c in attention_caches(cache) if not isinstance(c, RotatingKVCache)][-1]

    def explode(keys, values):
        assert any(isinstance(r, TreeRoPE) for _, r in ropes(model)), "not injected yet"
        raise Boom()

    victim.update_and_fetch = explode
    with pytest.raises(Boom):
        adapter.verify(tree, cache)
    del victim.update_and_fetch
    assert_unpatched(model, cache, before_ropes)

    # And the model still verifies exactly afterwards.
    cache = helpers.histories(family)[3].replay(model)
    before = clone(cache)
    assert_rows_are_root_path_forwards(model, before, tree, adapter.verify(tree, cache))


def test_nothing_stays_patched_after_a_verify():
    model = helpers.model("gemma4_text")
    cache = helpers.histories("gemma4_text")[4].replay(model)
    before_ropes = ropes(model)
    adapter_for(model).verify(helpers.branching_trees("gemma4_text")["fan"], cache)
    assert_unpatched(model, cache, before_ropes)


def _swap(model, what):
    layers = model.model.layers
    if what == "a layer":
        layers[1] = copy.deepcopy(layers[1])
    elif what == "the layer list":
        model.model.layers = [copy.deepcopy(layer) for layer in layers]
    else:
        layers[1].self_attn.rope = copy.deepcopy(layers[1].self_attn.rope)


@pytest.mark.parametrize("what", ["a layer", "the layer list", "a rope"])
def test_a_module_swapped_after_a_verify_gets_the_tree_positions_at_the_next(what):
    """The adapter remembers the rope owners it walked for while the module
    tree is unchanged (treespec.module_tree); a layer, the layer list
    or one rope replaced after a verify (equal copies, so the rows must not
    move) is walked for again: every node's row is still its root path's."""
    model = zoo.build("llama")  # not the lru-cached model: its modules are replaced
    adapter = adapter_for(model)
    tree = helpers.branching_trees("llama")["bushy"]
    hist = helpers.history(6)
    mx.eval(adapter.verify(tree, hist.replay(model)))
    _swap(model, what)
    cache = hist.replay(model)
    before = clone(cache)
    assert_rows_are_root_path_forwards(model, before, tree, adapter.verify(tree, cache))


def test_a_rope_changed_in_place_after_a_verify_is_refused_with_every_cache_as_it_was():
    """The rope owners' ropes are asked again at every verify: a rope whose
    class is changed in place (no module replaced, so the module tree reads
    the same and the owners are not walked for again) to one that cannot
    take per-node offsets is refused, every cache as it was."""
    model = zoo.build("llama")
    adapter = adapter_for(model)
    tree = helpers.branching_trees("llama")["bushy"]
    hist = helpers.history(6)
    mx.eval(adapter.verify(tree, hist.replay(model)))
    rope = model.model.layers[1].self_attn.rope
    rope.__class__ = type("PlainRope", (type(rope),), {})
    cache = hist.replay(model)
    before = clone(cache)
    with pytest.raises(TreeRefused, match=r"layers\.1\.self_attn\.rope: .*PlainRope is not a RoPE"):
        adapter.verify(tree, cache)
    assert [c.offset for c in cache] == [c.offset for c in before]
    assert all(mx.array_equal(a.state[0], b.state[0]) for a, b in zip(cache, before))


def test_a_target_and_its_drafter_verified_together_do_not_interfere():
    """The drafter verifies its own tree from inside the target's forward
    (the tightest interleaving two adapters can have): each sees only its own
    patches, and both results are exact."""
    target, drafter = helpers.model("llama"), zoo.drafter("llama")
    t_ad, d_ad = adapter_for(target), adapter_for(drafter)
    hist = helpers.history(7)
    t_cache, d_cache = hist.replay(target), hist.replay(drafter)
    t_before, d_before = clone(t_cache), clone(d_cache)
    d_tree = helpers.branching_trees("llama")["two-chains"]
    d_ropes = ropes(drafter)
    inner = {}

    victim = t_cache[-1]
    real_update = victim.update_and_fetch

    def verify_drafter_inside(keys, values):
        # Target is mid-forward and patched; the drafter must not be.
        assert all(r is b for (_, r), (_, b) in zip(ropes(drafter), d_ropes))
        assert all("make_mask" not in vars(c) for c in d_cache)
        inner["logits"] = d_ad.verify(d_tree, d_cache)
        # ...and the drafter's verify must not have unpatched the target.
        assert all(isinstance(r, TreeRoPE) for _, r in ropes(target))
        assert all("make_mask" in vars(c) for c in t_cache)
        return real_update(keys, values)

    victim.update_and_fetch = verify_drafter_inside
    t_logits = t_ad.verify(TREE, t_cache)
    del victim.update_and_fetch
    assert "logits" in inner
    assert_rows_are_root_path_forwards(target, t_before, TREE, t_logits)
    assert_rows_are_root_path_forwards(drafter, d_before, d_tree, inner["logits"])


def _rotating_elsewhere(attention):
    """Make ``attention`` (a llama Attention) rotate with its real rope,
    kept as a plain attribute (not a child: the module tree is unchanged),
    whatever its ``rope`` child holds."""
    cls = type(attention)

    def __call__(self, x, mask=None, cache=None):
        held = self["rope"]
        self["rope"] = self._own_rope
        try:
            return cls.__call__(self, x, mask=mask, cache=cache)
        finally:
            self["rope"] = held

    object.__setattr__(attention, "_own_rope", attention.rope)
    attention.__class__ = type("RopeElsewhere", (cls,), {"__call__": __call__})


def test_a_forward_that_bypasses_the_tree_ropes_is_refused_at_every_verify():
    """The injection's probe counts the calls of this verify's rope stand-ins
    (an adapter re-arms the same stand-ins verify after verify): a model
    verified once, then changed so that its attentions rotate with ropes the
    injection does not reach (no module is replaced: the adapter keeps its
    rope owners), is refused, with its caches as they were."""
    model = zoo.build("llama")
    adapter = adapter_for(model)
    tree = helpers.branching_trees("llama")["bushy"]
    hist = helpers.history(6)
    cache = hist.replay(model)
    before = clone(cache)
    assert_rows_are_root_path_forwards(model, before, tree, adapter.verify(tree, cache))
    for layer in model.model.layers:
        _rotating_elsewhere(layer.self_attn)
    cache = hist.replay(model)
    before = clone(cache)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="tree injection bypassed: 0 rope call"):
            adapter.verify(tree, cache)
        assert [c.offset for c in cache] == [c.offset for c in before]
        assert all(mx.array_equal(a.state[0], b.state[0]) for a, b in zip(cache, before))



# Position inputs (gpt2, ministral3), one-token attentions (deepseek_v3),
# both (mistral4), recurrent mixers the rope walk skips (qwen3_next).
WALKED = ["gpt2", "ministral3", "deepseek_v3", "mistral4", "qwen3_next", "gemma3_text"]


@pytest.mark.parametrize("family", WALKED)
def test_an_adapter_built_from_structures_walks_finds_what_walking_again_finds(family):
    """adapter_for hands the adapter what ``structure`` walked the model for
    (its module slots, per-position inputs and rope owners) instead of
    walking again: the same modules, in the same order, as an adapter that
    walks the model itself finds."""
    model = family_model(family)
    built = adapter_for(model)
    walked = TreeAdapter(model, built.family, found=built.found)

    def ids(entries):
        return [(e[0], *map(id, e[1:])) for e in entries]
    assert ids(built._positions) == ids(walked._positions)
    assert ids(built._one_token) == ids(walked._one_token)
    assert ids(built.check_model()) == ids(walked.check_model())
    # each case has something to find: ropes (gpt2 has none: learned positions), position
    # inputs, one-token attentions or mixers
    assert built.check_model() or built._positions
