"""Nothing is coerced silently: a float where an id or a count belongs, a
NaN or negative temperature, a NaN window, positions past int32, a bool or a
float node index, a walk target that is no token, a verify of something that
is not a DraftTree. Each is refused with an error naming the argument."""

import math

import mlx.core as mx
import numpy as np
import pytest

from suites.guards import helpers
from treespec.decoding import decode
from treespec.draft import ChainDrafter, ConfidenceDrafter, FixedTreeDrafter
from treespec.errors import TreeError
from treespec.models import prefilled
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.walk import chain_walk, tree_walk

pytestmark = pytest.mark.exactness


def speculative(mode="chain", **kw):
    kw = {"block": 3, **kw} if mode == "chain" else {"branching": [2, 1], **kw}
    return decode(helpers.model(), kw.pop("prompt", helpers.prompt(6)), mode=mode,
                  draft_model=helpers.drafter(), max_tokens=3, **kw)


@pytest.mark.parametrize("mode", ["classic", "chain", "tree"])
@pytest.mark.parametrize("bad", [9.7, 9.0, np.float32(9), True, "9", None])
def test_a_prompt_id_that_is_not_an_integer_is_refused_not_truncated(mode, bad):
    prompt = helpers.prompt(6)
    prompt[3] = bad
    with pytest.raises((TypeError, ValueError), match=r"prompt\[3\].*not an integer"):
        if mode == "classic":
            decode(helpers.model(), prompt, mode="classic", max_tokens=3)
        else:
            speculative(mode, prompt=prompt)


def test_an_integer_array_prompt_is_taken_and_a_float_array_refused():
    ids = helpers.prompt(6)
    want = decode(helpers.model(), ids, max_tokens=3).tokens
    assert decode(helpers.model(), mx.array(ids), max_tokens=3).tokens == want
    assert decode(helpers.model(), np.array(ids), max_tokens=3).tokens == want
    with pytest.raises(TypeError, match=r"prompt.*float32"):
        decode(helpers.model(), mx.array(ids, dtype=mx.float32), max_tokens=3)


@pytest.mark.parametrize("make", [
    lambda: FixedTreeDrafter(branching=[2.5, 1]),
    lambda: FixedTreeDrafter(branching=[2, True]),
    lambda: ChainDrafter(2.5),
    lambda: ConfidenceDrafter(3.5),
    lambda: ConfidenceDrafter(3, width=2.0),
], ids=["branching-float", "branching-bool", "block", "budget", "width"])
def test_a_drafter_count_that_is_not_an_integer_is_refused(make):
    with pytest.raises((TypeError, ValueError), match=r"(branching|block|budget|width).*integer"):
        make()


@pytest.mark.parametrize("name, mode, value", [
    ("branching", "tree", [2.5, 1]), ("block", "chain", 2.5), ("max_tokens", "chain", 2.5),
    ("budget", "tree", 2.5), ("width", "tree", 1.5)])
def test_decode_refuses_a_count_that_is_not_an_integer(name, mode, value):
    kw = {"max_tokens": 3, name: value}
    with pytest.raises((TypeError, ValueError), match=rf"{name}.*integer"):
        decode(helpers.model(), helpers.prompt(6), mode=mode, draft_model=helpers.drafter(), **kw)


@pytest.mark.parametrize("temperature", [math.nan, -1.0, -0.0001, math.inf, "0.7", None])
def test_a_temperature_that_is_not_a_finite_number_at_least_zero_is_refused(temperature):
    for mode in ("classic", "chain"):
        with pytest.raises((TypeError, ValueError), match=r"temperature"):
            speculative(mode, temperature=temperature) if mode == "chain" else decode(
                helpers.model(), helpers.prompt(6), temperature=temperature, max_tokens=3)


@pytest.mark.parametrize("window", [math.nan, 2.5, 0, -3, True])
def test_a_mask_window_that_is_not_a_positive_integer_is_refused(window):
    tree = DraftTree([1, 2, 3], [-1, 0, 0])
    with pytest.raises(TreeError, match=r"window_size"):
        tree.mask_np(offset=4, window_size=window)


@pytest.mark.parametrize("call", [
    lambda t: t.mask_np(offset=2.5), lambda t: t.mask_np(offset=4, history=1.5),
    lambda t: t.positions_np(offset=1.0), lambda t: t.positions_np(offset=True),
], ids=["mask-offset", "mask-history", "positions-float", "positions-bool"])
def test_a_float_or_bool_offset_is_refused(call):
    with pytest.raises(TreeError, match=r"(offset|history).*integer"):
        call(DraftTree([1, 2, 3], [-1, 0, 1]))


def test_positions_that_would_wrap_past_int32_are_refused():
    tree = DraftTree([1, 2, 3], [-1, 0, 1])  # depth 2
    last = 2**31 - 1
    assert tree.positions_np(last - 2).tolist() == [last - 2, last - 1, last]
    for offset in (last - 1, last, 2**40):
        with pytest.raises(TreeError, match=r"offset.*int32"):
            tree.positions_np(offset)
        with pytest.raises(TreeError, match=r"offset.*int32"):
            tree.positions(offset)


@pytest.mark.parametrize("node", [True, False, 1.0, 0.0, np.float64(1), "1", None])
def test_a_node_index_that_is_not_an_integer_is_refused(node):
    tree = DraftTree([1, 2, 3], [-1, 0, 0])
    for ask in (tree.path_to, tree.children):
        with pytest.raises(TreeError, match=r"node.*not an integer"):
            ask(node)


@pytest.mark.parametrize("bad", [-1, math.nan, None, 2.0, True, "5"])
def test_a_walk_target_that_is_not_a_token_id_is_refused_not_emitted(bad):
    tree = DraftTree([1, 2, 3], [-1, 0, 0])
    with pytest.raises((TypeError, ValueError), match=r"target_tokens\[1\]"):
        tree_walk(tree, [2, bad, 4])
    with pytest.raises((TypeError, ValueError), match=r"target_tokens\[0\]"):
        tree_walk(tree, [bad, 5, 6])
    with pytest.raises((TypeError, ValueError), match=r"target_tokens\[1\]"):
        chain_walk([2, 3], [2, bad, 4])
    with pytest.raises((TypeError, ValueError), match=r"draft_tokens\[0\]"):
        chain_walk([bad, 3], [2, 5, 4])


def test_walks_still_take_numpy_integer_targets():
    tree = DraftTree([1, 2, 3], [-1, 0, 0])
    got = tree_walk(tree, np.array([3, 7, 8]))
    assert got.path == (0, 2) and got.emitted == (3, 8)


@pytest.mark.parametrize("bad", [[5, 6, 7], (5, 6, 7), None, "tree"])
def test_verify_of_something_that_is_not_a_draft_tree_is_a_type_error(bad):
    cache = prefilled(helpers.model(), helpers.prompt(4))
    with pytest.raises(TypeError, match=r"tree.*DraftTree"):
        adapter_for(helpers.model()).verify(bad, cache)
