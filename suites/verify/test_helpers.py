"""The suite's own instruments: a deep-copied cache is an independent,
faithful snapshot (every reference forward runs on one), and snapshots see
every byte."""

import mlx.core as mx
import pytest

from suites.verify import helpers
from suites.verify.helpers import clone, plain_rows, fingerprint
from treespec import zoo

pytestmark = pytest.mark.exactness


@pytest.mark.parametrize("family", zoo.FAMILIES)
def test_a_cloned_cache_is_an_independent_faithful_snapshot(family):
    model = helpers.model(family)
    hist = helpers.histories(family)[5]
    cache = hist.replay(model)
    frozen = fingerprint(cache)
    copy = clone(cache)
    assert fingerprint(copy) == frozen
    toks = helpers.tokens(3, 9)
    from_copy = plain_rows(model, copy, toks)
    assert fingerprint(cache) == frozen  # the original did not move
    from_replay = plain_rows(model, hist.replay(model), toks)
    assert mx.array_equal(from_copy, from_replay)


def test_a_snapshot_sees_one_flipped_element():
    model = helpers.model("llama")
    cache = helpers.history(4).replay(model)
    frozen = fingerprint(cache)
    cache[0].values[0, 0, 2, 3] = cache[0].values[0, 0, 2, 3] + 1e-6
    assert fingerprint(cache) != frozen
