"""The rank check's pure part (treespec.distributed.lockstep): a round packs
into one fixed-width row and back, and any difference between ranks' rows is
named with the rank and both paths."""

import numpy as np
import pytest

from treespec.distributed.lockstep import (MOST, WIDTH, disagreement, row, tokens_disagreement,
                                           unpack)


@pytest.mark.parametrize("path,emitted", [((0,), (7,)), ((0, 2, 5), (4, 9, 1, 3)),
                                          (tuple(range(MOST)), tuple(range(MOST)))])
def test_a_round_packs_into_one_row_of_fixed_width_and_back(path, emitted):
    r = row(3, path, emitted)
    assert r.shape == (WIDTH,) and r.dtype == np.int32
    assert unpack(r) == {"round": 3, "path": list(path), "emitted": list(emitted)}


def test_ranks_that_agree_pass_and_the_first_that_differs_is_named():
    same = np.stack([row(2, (0, 1), (5, 6))] * 3)
    assert disagreement(same) is None
    apart = np.stack([row(2, (0, 1), (5, 6)), row(2, (0, 1), (5, 6)), row(2, (0, 3), (5, 8))])
    why = disagreement(apart)
    assert "rank 2" in why and "[0, 1]" in why and "[0, 3]" in why


def test_a_path_past_the_largest_round_is_refused():
    with pytest.raises(ValueError, match="at most"):
        row(0, range(MOST + 1), ())


@pytest.mark.parametrize("counts,tokens,differs", [
    ([3, 3], [[1, 2, 3], [1, 2, 3]], False),
    ([3, 2], [[1, 2, 3], [1, 2, -1]], True),
    ([3, 3], [[1, 2, 3], [1, 9, 3]], True)])
def test_the_whole_emission_is_compared(counts, tokens, differs):
    assert (tokens_disagreement(counts, np.array(tokens)) is not None) == differs
