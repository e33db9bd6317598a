"""Goldens per numerics regime (golden/e2e/<regime>/,
docs/numerics.md#goldens-per-regime): every regime's goldens pin texts and
token ids; only an exact regime's (the CPU reference BLAS) also pin round
statistics, which elsewhere depend on which kernel a machine gets (this
machine's OpenBLAS declines float32 chain b=2, where another machine's ran
it); a regime with no goldens yet says how to record them."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlx
import pytest

from suites.helpers_numerics import exact_backend
from suites.verdict import census_line
from treespec.backend.blas import regime
from suites.helpers_subprocess import project_env

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden" / "e2e"
# The CPU regimes run classic decoding through the same single-token kernels'
# numbers closely enough that every golden text agrees (measured); a GPU
# regime's texts are its own, checked against mlx_lm.generate in its run.
CPU_REGIMES = ("reference", "openblas")


def _blocks(ambr: Path) -> dict:
    return {b.splitlines()[0]: b for b in ambr.read_text().split("# name: ")[1:]}


def _texts(ambr: Path) -> dict:
    """test name -> (text, tokens) from a syrupy amber file."""
    out = {}
    for name, block in _blocks(ambr).items():
        text = re.search(r"^\s+'text': (.*),$", block, re.M)
        tokens = re.search(r"'tokens': list\(\[(.*?)\]\)", block, re.S)
        if text and tokens:
            out[name] = (text.group(1), re.sub(r"\s+", "", tokens.group(1)))
    return out


@pytest.mark.exactness
def test_the_cpu_regimes_goldens_hold_the_same_texts():
    """Round statistics may differ between regimes (the gate declines where
    a BLAS is inexact); the text never may."""
    files = [GOLDEN / r / "test_text_diff.ambr" for r in CPU_REGIMES]
    assert all(f.exists() for f in files), files
    texts = [_texts(f) for f in files]
    assert all(len(t) >= 90 for t in texts), [len(t) for t in texts]
    for other, f in zip(texts[1:], files[1:]):
        assert other.keys() == texts[0].keys(), f
        for name in texts[0]:
            assert other[name] == texts[0][name], f"{f.parent.name}: {name}"


@pytest.mark.exactness
def test_only_exact_regimes_goldens_pin_round_statistics():
    """A regime's goldens pin round statistics in every block or in none
    (whether it was measured exact when recorded), and this backend's, if
    recorded, pin them exactly where the census measures it exact now."""
    files = sorted(GOLDEN.glob("*/test_text_diff.ambr"))
    assert {f.parent.name for f in files} >= set(CPU_REGIMES), files
    pins = {}
    for f in files:
        fields = {tuple(sorted(re.findall(r"^    '(\w[\w/]*)':", b, re.M))) for b in _blocks(f).values()
                  if "test_speculative_text" in b.splitlines()[0]}
        pins[f.parent.name] = all("rounds" in x for x in fields)
        assert pins[f.parent.name] or fields == {("text", "tokens")}, (f, fields)
    if regime() in pins:
        assert pins[regime()] == exact_backend(), (regime(), census_line())


@pytest.mark.exactness
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_a_regime_without_goldens_is_told_how_to_record_them(tmp_path):
    """A backend nobody recorded (here MLX's own reference library, copied
    where no known BLAS lives: an unidentified regime of its own): the text
    diff still runs against mlx_lm.generate in the same run and passes its
    verdict, and only the missing pin is reported, with the one command
    that records it, instead of "Snapshot does not exist". Nothing is
    written to golden/."""
    # The wheel's own reference library (exact), whatever BLAS this run has preloaded.
    bundled = sorted((Path(mlx.__path__[0]).parent / "mlx_cpu.libs").glob("libblas*.so*"))
    if not bundled:
        pytest.skip("this MLX has no bundled reference BLAS (not the Linux CPU wheel)")
    copy = tmp_path / "someblas" / "libblas.so.3"
    copy.parent.mkdir()
    shutil.copy(bundled[0], copy)
    before = sorted(p.name for p in GOLDEN.iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/e2e/test_text_diff.py", "-q", "-rs",
         "-p", "no:cacheprovider", "-p", "no:xdist",
         "-k", "test_speculative_text and llama-float32 and chain-b2 and prose"],
        cwd=ROOT, env=project_env("LD_PRELOAD", LD_PRELOAD=str(copy)), capture_output=True,
        text=True)
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-3000:]
    assert ("golden not recorded for regime unknown-someblas-libblas-so-3: run `python -m "
            "pytest -m goldens --snapshot-update`") in proc.stdout
    assert re.search(r"e2e: text = mlx_lm.generate\s+llama\s+float32\s+bit-exact", proc.stdout), \
        proc.stdout[-3000:]
    assert sorted(p.name for p in GOLDEN.iterdir()) == before


def test_the_snapshot_folders_hold_snapshots_only():
    """syrupy takes every file under golden/e2e/<regime>/ for a snapshot file
    and fails a run that leaves one unused: the envelope recordings live in
    golden/envelopes/ (they once sat in the e2e folders and the whole suite
    exited 1 after 2488 passed tests)."""
    others = [p for p in GOLDEN.rglob("*") if p.is_file() and p.suffix != ".ambr"]
    assert others == [], others
