"""treespec bench --verify rows|kernels: a row's gate measures the verify that
row decodes with. Its probe is keyed by that verify's memo name
(treespec.verify.MEMO_NAMES), so it is never the flat verify's verdict for
the same shapes, memoized in this process or on disk, and the reverse."""

import pytest

from treespec.bench import measure as B
from treespec.bench.shared_probe import SharedProbe
from treespec.checkpoints import load_default_pair
from treespec.evidence import gate
from treespec.verify import adapter_for


class _Off:
    """A row-invariant verify with a defect: every logit moved by 2^-7,
    relatively. Its probe must decline wherever one is measured."""

    def __init__(self, adapter):
        self.adapter = adapter

    def __getattr__(self, name):
        return getattr(self.adapter, name)

    def verify(self, tree, cache, **kw):
        return self.adapter.verify(tree, cache, **kw) * (1 + 2 ** -7)


@pytest.fixture
def own_memos(monkeypatch, tmp_path):
    # The planted verify's verdicts neither read the run's real ones nor
    # stay behind for other tests (as suites/planted.py does for plants).
    monkeypatch.setattr(gate, "_MEMO", {})
    monkeypatch.setenv("TREESPEC_CACHE_DIR", str(tmp_path))


# The bench's own SharedProbe, and the gate's decide (memoized per process and
# on disk), which a caller of treespec.bench.measure.bench may pass instead.
@pytest.mark.parametrize("decide", [lambda: gate.decide, SharedProbe], ids=["gate", "shared probe"])
def test_a_rows_probe_is_its_own_never_the_flat_verifys_verdict(own_memos, decide):
    target, draft, tok = load_default_pair()
    off = _Off(adapter_for(target, rows=True))
    flat = B.Config("chain b=3", "chain", block=3, budget=2)
    rows = B.Config("chain b=3 [rows]", "chain", block=3, budget=2, verify="rows", adapter=off)
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
