"""What runs after a forward left running on mlx-lm's generation stream waits
for it.

mlx-lm's ``generate_step`` evaluates one forward ahead on its own stream; when
a loop over it ends (at max_tokens or an EOS; ``mlx_lm.generate`` too) that
forward may still be running. On a sharded target its all-reduces then run
beside the next forward's (on the CPU each stream is a thread), and the ring
pairs them by arrival, differently on each rank: a CI run under OpenBLAS had
the chain's probe, run right after classic decoding, "find" differences of 7.1
at M=1 on rank 1 and 6.64 on rank 0, from the same weights. So
treespec.rounds.classic waits for that stream before it returns, and
treespec.decoding.decode before its first forward (the gate's probe runs on
the default stream; right after mlx-lm's generate_step, rank 0's probe began
its first forward while the look-ahead still ran, tried). Here rank 1 is a
little late each time, so that a forward left running on rank 0 meets its next
collective. Without classic's wait, 18 and 19 of 20 marker sums came out
wrong on this machine (results/distributed/README.md), and this test fails.
Without decode's it still passes: which collectives meet depends on their
sizes and timing (a marker of the look-ahead's own size met it; the probe's
24-token prefill, run during a look-ahead made slow, came out right on both
ranks, tried), so the chain after mlx-lm's generate_step is pinned here as a
contract, and decode's wait is a precaution this test cannot make necessary.
"""

import pytest

from .helpers_launch import RANKS, run_worker

pytestmark = pytest.mark.exactness

SPEC = {"family": "llama", "how": "tensor", "checks": ["drained"], "repeats": 9,
        "pause_s": 0.05}


def test_what_runs_after_a_forward_left_on_mlx_lms_stream_meets_the_other_ranks_same(tmp_path):
    """Every rank's marker sum is the sum of the ranks' markers (r + 1 each),
    after treespec's classic decoding stopped at max_tokens and at an EOS
    alike; after mlx-lm's own generate_step, treespec's chain decoding (the
    gate's probe its first forwards) emits mlx-lm's tokens, with the same gate
    verdict on every rank."""
    reports = run_worker(SPEC, tmp_path)
    expected = float(sum(r + 1 for r in range(RANKS)))
    for rank in reports:
        runs = rank["drained"]
        assert [r["before"] for r in runs] == ["max_tokens", "eos", "mlx-lm"] * 3
        for i, r in enumerate(runs):
            assert set(r["sums"]) == {expected}, (rank["rank"], i, sorted(set(r["sums"]))[:4])
            if r["before"] == "mlx-lm":
                assert r["chain"]["tokens"] == r["classic"], (rank["rank"], i, r["chain"])
                assert r["chain"]["gate"] == reports[0]["drained"][i]["chain"]["gate"]
