"""The ranks stay in step whatever each rank's disk holds.

What made the chain differ from classic decoding in 3 of 8 early two-rank runs
(issue 45), reproduced on purpose here: the gate's probe runs forwards of the
target, so all-reduces, and its verdict is memoized on each machine's disk
(keyed by that rank's weight shard and treespec's source, which an edit changes
between two ranks' reads). Where rank 0 read a stored verdict and rank 1
measured, rank 1's probe forwards were summed with rank 0's decoding forwards:
its probe "found" differences of 17, it declined to classic, both ranks decoded
garbage and the ring then lost its peer. A sharded decode (treespec.distributed
.group.decode_kwargs) has every rank measure the probe and none read the memo.
"""

import pytest

from .helpers_launch import run_worker

pytestmark = pytest.mark.exactness

SPEC = {"family": "llama", "how": "tensor", "checks": ["text"], "modes": ["chain"],
        "prompts": 1, "max_tokens": 16}


def test_a_sharded_decode_is_classic_decodings_text_when_only_one_rank_holds_a_gate_memo(
        tmp_path):
    """Rank 0's memo holds the verdict a previous run stored, rank 1's is
    empty: the chain still emits classic decoding's tokens, in step every
    round. Fails (the worker dies: ring peer lost, after a declined probe)
    with decode_kwargs leaving the default gate name, tried."""
    warm, empty = tmp_path / "warm", tmp_path / "empty"
    # Warmed with a memo folder per rank, both empty: both probe, in step. (One
    # folder for both would race: the later rank could read the earlier's
    # verdict and skip its probe forwards, the very drift this test is about.)
    run_worker({**SPEC, "plain_gate": True,
                "memo": {"0": str(warm), "1": str(tmp_path / "scratch")}}, tmp_path / "first")
    assert any((warm / "gate").iterdir()), "the first run stored no verdict to read"
    reports = run_worker({**SPEC, "memo": {"0": str(warm), "1": str(empty)}}, tmp_path / "second")
    for rank in reports:
        prompt = rank["text"][0]
        assert prompt["chain"]["tokens"] == prompt["classic"], rank["rank"]
