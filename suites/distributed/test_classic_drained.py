"""Classic decoding leaves nothing running that a collective could meet.

mlx-lm's ``generate_step`` evaluates one forward ahead on its own stream; when
treespec's classic loop ends (at max_tokens or an EOS) that forward may still
be running. On a sharded target its all-reduces then run beside the caller's
next collective (the gate's probe, on the other stream), and the ring pairs
them by arrival: a CI run under OpenBLAS had rank 1's chain probe "find"
differences of 7.1 at M=1 and rank 0's 6.64, from the same weights. Here the
next collective is a marker all-sum right after classic decoding, rank 1 a
little late so that a forward left running on rank 0 meets its marker.
Without classic's wait on the stream (treespec.rounds.classic), 18 and 19 of 20
markers summed wrong on this machine, tried.
"""

import pytest

from .helpers_launch import RANKS, run_worker

pytestmark = pytest.mark.exactness

SPEC = {"family": "llama", "how": "tensor", "checks": ["drained"], "repeats": 8,
        "pause_s": 0.05}


def test_a_collective_right_after_classic_decoding_meets_the_other_ranks_same_collective(
        tmp_path):
    """Every rank's marker sum is the sum of the ranks' markers (r + 1 each),
    after classic decoding stopped at max_tokens and at an EOS alike."""
    reports = run_worker(SPEC, tmp_path)
    expected = float(sum(r + 1 for r in range(RANKS)))
    for rank in reports:
        assert len(rank["drained"]) == SPEC["repeats"]
        for i, sums in enumerate(rank["drained"]):
            assert set(sums) == {expected}, (rank["rank"], i, sorted(set(sums))[:4])
