"""The census in child processes (treespec.backend.census_child): the rows
the in-process census measures, and a row whose kernel crashes the process
reported as a row that could not run, the rows after it still measured.

Checked against the census measured in this process (its own rows, its own
seeded inputs), not against the child's output. Tried: with the crashed
row recorded as an identical row (its error left out), the crash test fails;
with the crashed row measured again in the calling process, the test's own
process dies of the planted SIGSEGV (what a verdict table did on the H200)."""

import mlx_lm
import pytest

from suites.census.helpers import claims
from treespec import zoo
from treespec.backend import census as c
from treespec.backend.census_child import isolated
from treespec.backend.census_position import position_census

pytestmark = pytest.mark.exactness

WIDTHS = (1, 2, 3)


@pytest.mark.parametrize("family", [None, "qwen3_next", "gemma4_text"])
@pytest.mark.parametrize("kind", ["ops", "position", "both"])
def test_the_child_measures_what_the_census_measures_here(family, kind):
    # default shapes, or a checkpoint's own: the child loads it from its path
    # (once for both kinds of row: "both" is the ops' rows, then the position rows)
    path = None if family is None else zoo.checkpoint(family)
    model = None if path is None else mlx_lm.load(str(path))[0]
    dtypes = ("float32", "bfloat16") if path is None else None  # None: the model's own
    here = [r for measure in {"ops": [c.census], "position": [position_census],
                              "both": [c.census, position_census]}[kind]
            for r in measure(model, dtypes=dtypes, widths=WIDTHS)]
    there = isolated(path, dtypes=dtypes, widths=WIDTHS, kind=kind)
    assert here and [(r.op, r.how, r.dtype, r.shape) for r in there] == \
        [(r.op, r.how, r.dtype, r.shape) for r in here]
    assert claims(there) == claims(here)


def test_a_row_that_crashes_its_process_is_a_row_that_could_not_run():
    here = c.census(dtypes=("float32", "bfloat16", "float16"), widths=WIDTHS,
                    measures={"rms_norm": c.MEASURES["rms_norm"]})
    there = isolated(dtypes=("float32", "bfloat16", "float16"), widths=WIDTHS,
                     child="suites.census.crashing")
    assert len(there) == len(here)
    planted = [(r.op, r.how, r.dtype, r.shape) for r in here
               if (r.how, r.dtype) == ("tokens", "float16")]
    crashed = [r for r in there if r.error]
    assert planted and [(r.op, r.how, r.dtype, r.shape) for r in crashed] == planted
    assert {(r.error, r.verdict) for r in crashed} == {
        ("crashed the process: SIGSEGV", "could not run")}
    # every other row, before the crash and after it, as measured here
    assert claims([r for r in there if not r.error]) == \
        claims([r for r in here if (r.how, r.dtype) != ("tokens", "float16")])


def test_unknown_dtypes_and_kinds_are_refused_before_any_child_runs():
    with pytest.raises(ValueError, match="dtypes must be among"):
        isolated(dtypes=("float64",))
    with pytest.raises(ValueError, match="kind must be one of ops, position, both"):
        isolated(kind="positions")
