"""treespec bench --verify rows|kernels|chunks: a row's gate measures the verify
that row decodes with. Its probe is keyed by that verify's memo name
(treespec.verify.MEMO_NAMES; for chunks chunks_name, one per width), so it is
never the flat verify's verdict for the same shapes, memoized in this process
or on disk, and the reverse."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from treespec.bench import measure as B
from treespec.bench.shared_probe import SharedProbe
from treespec.checkpoints import load_default_pair
from treespec.cli.rows import chunks_plan
from treespec.evidence import gate
from treespec.backend.row_chunks import RowChunks
from treespec.verify import adapter_for, chunks_name


class _Off:
    """A row-invariant verify with a defect: every logit moved by 2^-7,
    relatively. Its probe must decline wherever one is measured."""

    def __init__(self, adapter):
        self.adapter = adapter

    def __getattr__(self, name):
        return getattr(self.adapter, name)

    def verify(self, tree, cache, **kw):
        return self.adapter.verify(tree, cache, **kw) * (1 + 2 ** -7)


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_memos(monkeypatch, tmp_path):
    # The planted verify's verdicts neither read the run's real ones nor
    # stay behind for other tests (as suites/planted.py does for plants).
    monkeypatch.setattr(gate, "_MEMO", {})
    monkeypatch.setenv("TREESPEC_CACHE_DIR", str(tmp_path))


# The bench's own SharedProbe, and the gate's decide (memoized per process and
# on disk), which a caller of treespec.bench.measure.bench may pass instead.
# --verify chunks names its width too (treespec.verify.chunks_name): set as the
# bench command sets it.
@pytest.mark.parametrize("mode", ["rows", "chunks"])
@pytest.mark.parametrize("decide", [lambda: gate.decide, SharedProbe], ids=["gate", "shared probe"])
def test_a_rows_probe_is_its_own_never_the_flat_verifys_verdict(own_memos, decide, mode):
    target, draft, tok = load_default_pair()
    kernels, name = (RowChunks(2), chunks_name(2)) if mode == "chunks" else (False, None)
    off = _Off(adapter_for(target, rows=True, kernels=kernels))
    flat = B.Config("chain b=3", "chain", block=3, budget=2)
    rows = B.Config(f"chain b=3 [{mode}]", "chain", block=3, budget=2, verify=mode, adapter=off,
                    adapter_name=name)
    assert rows.verify_kwargs()["adapter_name"] == (name or B.MEMO_NAMES[mode])
    configs = [B.Config("classic", "classic"), flat, rows]
    # The flat verify's verdict, measured shape by shape outside the bench.
    flat_exact = all(gate.compare_shape(target, s, gate.DRAWS).identical
                     for s in flat.probe_shapes())
    kw = {"decide": decide()}
    # Twice, so the second run meets the first's memos (in process, on disk).
    for _ in range(2):
        out = B.bench(target, draft, [tok.encode("def f(x):")], configs,
                      B.BenchOptions(max_tokens=6, repeats=1), **kw)
        got = {r["name"]: r for r in out["rows"]}
        assert got[rows.name]["probe"]["run"] is False, got[rows.name]
        assert got[rows.name]["reason"].startswith("probe: declined"), got[rows.name]["reason"]
        assert got[flat.name]["probe"]["exact"] is flat_exact, got[flat.name]


def test_the_planted_verify_is_one_the_probe_measures():
    # The control: without it the test above could pass for another reason.
    target, _, _ = load_default_pair()
    planted = _Off(adapter_for(target, rows=True))
    assert not gate.compare_shape(target, (-1, 0, 1), gate.DRAWS, adapter=planted).identical


def test_the_bench_command_runs_chunks_at_the_width_the_census_gives():
    """``treespec bench --verify flat,chunks``: the chunked row beside the flat
    one, its width the census's for the largest round (measured here on the
    pair's own shapes), said on stderr; its figure stands behind the gate
    and the text diff like any row's."""
    out = subprocess.run(
        [sys.executable, "-m", "treespec", "bench", "--prompts", "1", "--max-tokens", "4",
         "--repeats", "1", "--blocks", "3", "--trees", "", "--no-auto", "--no-mlx-lm",
         "--no-confidence", "--verify", "flat,chunks", "--json"],
        cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert [r["name"] for r in rows] == ["classic", "chain b=3", "chain b=3 [chunks]"]
    target, _, _ = load_default_pair()
    width = chunks_plan(target, 2, allow_inexact=True).width
    said = "one row a call" if width == 1 else f"calls of at most {width} rows"
    assert f"--verify chunks: linear layers in {said}" in out.stderr, out.stderr
    chunked = rows[-1]
    assert chunked["exact"] or chunked["reason"].startswith(("probe:", "text:")), chunked
