"""The backend's measured envelopes, recorded beside the texts: a kernel
change that moves them is a regression, not a wider envelope silently
absorbed.

Every numeric verdict of the suite is judged against the envelope measured
in the same run (docs/numerics.md#the-envelope), so a kernel change that
makes multi-token forwards differ from single-token steps, where they were
bit-identical, would only make the envelope nonzero and the verdicts
"within envelope" or the gate decline: green. Here the e2e pairs' targets
have their envelope measured per width and compared with the one recorded
on this backend and machine (golden/envelopes/<regime>/<machine>/):

- a width recorded 0 that now differs from the steps FAILs (above all the
  zero must hold: it is what makes every check bit for bit);
- a width whose envelope grew beyond ``GROWTH`` x its recording FAILs;
- a width now smaller than recorded passes, saying so (re-record to pin it).

Envelopes are a machine's: the same library picks other kernels on another
CPU (OpenBLAS's Cooperlake and Zen kernels differ), so the recording is
keyed by the device's name as well as the regime. Recording is the goldens
step (``python -m pytest -m goldens --snapshot-update``); a machine without a recording reports it as
a golden not recorded, which ``--strict-verdicts`` turns into a failure."""

import json
import re
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest

from suites.e2e.test_text_diff import PAIRS
from suites.goldens import GOLDEN_MISSING, RECORD_GOLDENS
from suites.verdict import expect
from treespec import zoo
from treespec.backend.blas import regime
from treespec.evidence import numerics

pytestmark = [pytest.mark.exactness, pytest.mark.goldens]

ENVELOPES = "backend: envelopes = recorded"
ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (2, 3, 4, 5, 6, 7, 8)  # the rounds' verify widths on the zoo pairs
CONTEXT = 12  # the 9-32 bucket: the e2e prompts' lengths
GROWTH = numerics.TRIANGLE * numerics.SAFETY  # what the pass rule already allows a sample maximum


def machine() -> str:
    """The device's name and architecture, as a folder name."""
    info = mx.device_info()
    name = f"{info.get('device_name', 'unknown')}-{info.get('architecture', 'unknown')}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def recording(family: str, dtype: str) -> Path:
    # Outside golden/e2e/<regime>/, syrupy's folder, where any file is taken for a
    # snapshot and an unused one fails the run.
    return ROOT / "golden" / "envelopes" / regime() / machine() / f"{family}-{dtype}.json"


def measured(model) -> dict:
    """Width -> the plain envelope at that width alone (max |diff| of a
    multi-token forward from single-token steps over the samples)."""
    m = numerics.Measurement(model, context=CONTEXT)
    return {str(w): m.width(w)[0] for w in WIDTHS}


def compare(recorded: dict, now: dict) -> tuple:
    """(regressions, improvements): lines naming each width that moved."""
    worse, better = [], []
    for w, was in recorded.items():
        got = now.get(w)
        if got is None:
            worse.append(f"width {w}: recorded, not measured now")
        elif was == 0 and got > 0:
            worse.append(f"width {w}: bit-identical to single-token steps when recorded, now "
                         f"differs by {got:.3g} (a kernel made multi-token forwards inexact)")
        elif was > 0 and got > GROWTH * was:
            worse.append(f"width {w}: envelope {was:.3g} when recorded, now {got:.3g} "
                         f"(more than {GROWTH:g}x)")
        elif got < was and (got == 0 or got * GROWTH < was):
            better.append(f"width {w}: {was:.3g} when recorded, now {got:.3g}")
    return worse, better


def test_the_comparison_names_what_moved():
    recorded = {"2": 0.0, "3": 1e-6, "4": 1e-6, "5": 1e-6}
    assert compare(recorded, dict(recorded)) == ([], [])
    worse, better = compare(recorded, {"2": 6e-8, "3": 7e-6, "4": 1e-4, "5": 0.0})
    assert [w.split(":")[0] for w in worse] == ["width 2", "width 4"]
    assert "bit-identical to single-token steps when recorded" in worse[0]
    assert [b.split(":")[0] for b in better] == ["width 5"]


@pytest.mark.parametrize("family, dtype", PAIRS, ids=[f"{f}-{d}" for f, d in PAIRS])
def test_the_envelopes_are_the_recorded_ones(family, dtype, request):
    model, _ = mlx_lm.load(str(zoo.checkpoint(family, dtype=dtype)))
    now = measured(model)
    path = recording(family, dtype)
    if request.config.option.update_snapshots:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"regime": regime(), "machine": machine(), "context": CONTEXT,
                                    "widths": now}, indent=1) + "\n")
        return
    if not path.exists():
        pytest.skip(f"{GOLDEN_MISSING} for regime {regime()} on machine {machine()}: "
                    f"run `{RECORD_GOLDENS}`")
    worse, better = compare(json.loads(path.read_text())["widths"], now)
    figures = ", ".join(f"{w}: {v:.3g}" for w, v in now.items())
    if worse:
        expect(numerics.Verdict(numerics.FAIL, max(now.values()), detail=(
            f"envelopes moved since recorded ({path.relative_to(ROOT)}): " + "; ".join(worse))),
            ENVELOPES, family, dtype)
    expect(numerics.Verdict(numerics.BIT_EXACT, 0.0, detail=(
        f"as recorded ({figures})" + (f"; smaller now, re-record: {'; '.join(better)}"
                                      if better else ""))), ENVELOPES, family, dtype)


def test_a_multi_token_kernel_change_is_caught_where_a_width_was_exact(plant):
    """A matmul moved by a few ulp from two rows on (the plant the gate
    answers by declining, its verdicts all green) is a regression here: each
    width recorded bit-identical to single-token steps now differs."""
    family, dtype = PAIRS[0]
    path = recording(family, dtype)
    if not path.exists():
        pytest.skip(f"{GOLDEN_MISSING} for regime {regime()} on machine {machine()}: "
                    f"run `{RECORD_GOLDENS}`")
    recorded = json.loads(path.read_text())["widths"]
    exact = [w for w, v in recorded.items() if v == 0]
    if not exact:
        pytest.skip(f"no width recorded bit-identical on {regime()}: nothing for the plant to move")
    model, _ = mlx_lm.load(str(zoo.checkpoint(family, dtype=dtype)))
    with plant("matmul-multi-token-few-ulp"):
        worse, _ = compare(recorded, measured(model))
    assert [w.split(":")[0] for w in worse] == [f"width {w}" for w in exact], worse
