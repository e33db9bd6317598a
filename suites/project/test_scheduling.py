"""suites/scheduling.py: the longest tests first, and the tests of one
quantized configuration on one worker, one after another, so a backend that
compiles kernels on first use (MLX's CUDA) compiles them once per run."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from suites.helpers_subprocess import project_env
from suites.scheduling import kernel_group, scheduled, unit

F = "suites/verify/test_root_paths.py::test_every_node_sees_what_a_plain_forward_over_its_root_path_sees"


@pytest.mark.parametrize("nodeid, group", [
    (f"{F}[llama-bfloat16-q4-h3-pair]", "kernels bfloat16 weights q4 g64"),
    (f"{F}[llama-bfloat16-q4-h0-fan]", "kernels bfloat16 weights q4 g64"),
    (f"{F}[llama-float32-q4-h0-fan]", "kernels float32 weights q4 g64"),
    (f"{F}[qwen3_next-float32-q8]", "kernels float32 weights q8 g64"),
    ("suites/plants/test_sizes.py::test_w[float32-q3-g128]", "kernels float32 weights q3 g128"),
    ("suites/plants/test_sizes.py::test_kv[hd64-4bit-g32]", "kernels - kv q4 g32"),
    ("suites/rollback/test_cache_commit.py::test_c[quantized-4bit-g64-float16]", "kernels float16 kv q4 g64"),
    ("suites/rollback/test_model_commit.py::test_r[short-qwen3_5-quantized-8bit-g32]", "kernels - kv q8 g32"),
    (f"{F}[llama-float32-h3-pair]", None),  # no quantization named
    ("suites/sampling/test_rule.py::test_s[q1-in-residual-only-tree-3x2-T1]", None),  # q1: no bit width
    ("suites/e2e/test_x.py::test_y[gemma4_text-q4x]", None),  # q4x is not a token of its own
    ("suites/e2e/test_x.py::test_q4", None),  # the test's name, not its parameters
])
def test_a_test_s_kernel_group_is_the_quantization_its_parameter_id_names(nodeid, group):
    assert kernel_group(nodeid) == group


@pytest.mark.parametrize("nodeid, expected", [
    (f"{F}[gemma3_text-bfloat16-h11-pair]", "model suites/verify/test_root_paths.py gemma3_text bfloat16"),
    ("suites/rollback/test_model_commit.py::test_h[qwen3_5/float16]",
     "model suites/rollback/test_model_commit.py qwen3_5 float16"),
    # a quantization names the kernels, which outweigh the model
    (f"{F}[llama-bfloat16-q4-h3-pair]", "kernels bfloat16 weights q4 g64"),
    # no dtype right after the family, or not at the start: a unit of its own
    (f"{F}[qwen3-h3-pair]", f"{F}[qwen3-h3-pair]"),
    ("suites/e2e/test_x.py::test_y[code-gemma3_text-float16]", "suites/e2e/test_x.py::test_y[code-gemma3_text-float16]"),
])
def test_a_test_s_unit_is_its_kernel_group_else_its_file_s_model_else_itself(nodeid, expected):
    assert unit(nodeid) == expected


def _item(nodeid, *slow):
    mark = SimpleNamespace(args=slow) if slow else None
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: mark if name == "slow" else None)


def test_the_longest_tests_come_first_each_unit_gathers_and_larger_units_lead_the_rest():
    pair, fan = f"{F}[llama-bfloat16-q4-h3-pair]", f"{F}[llama-bfloat16-q4-h0-fan]"
    g1, g2 = f"{F}[gemma3_text-bfloat16-h3-pair]", f"{F}[gemma3_text-bfloat16-h11-fan]"
    items = [
        _item("a.py::fast_1"),
        _item(fan),
        _item("a.py::slow_1", "seconds"),
        _item(g1),
        _item("a.py::minutes_1", "minutes"),
        _item("a.py::slow_2", "seconds"),
        _item(pair, "seconds"),
        _item("a.py::minutes_2", "minutes"),
        _item("a.py::fast_2"),
        _item(g2),
    ]
    # minutes tests each paired with a slow one, then the slow rest; the fan
    # test (not slow itself) joins its group where the slow pair test put it;
    # then the units of no slow test, the two-test gemma3 unit before singles
    assert [i.nodeid for i in scheduled(items)] == [
        "a.py::minutes_1", "a.py::slow_1", "a.py::minutes_2", "a.py::slow_2",
        pair, fan, g1, g2, "a.py::fast_1", "a.py::fast_2"]


MODULE = '''
import os
import pytest

# a kernel group's tests interleaved with tests of no group: xdist's plain
# load scheduling deals them out in turn, so it would split the group
CASES = [c for i in range(6) for c in (f"llama-bfloat16-q4-h{i}", f"plain-{i}")]


@pytest.mark.parametrize("case", CASES)
def test_where(case):
    with open(os.environ["WHERE_LOG"], "a") as f:
        f.write(f"{case} {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''


def test_a_kernel_group_runs_on_one_worker_under_xdist(tmp_path):
    (tmp_path / "test_module.py").write_text(MODULE)
    log = tmp_path / "where.log"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "suites.scheduling",
         "-p", "no:cacheprovider", "test_module.py"],
        cwd=tmp_path, env=project_env(WHERE_LOG=str(log)), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    where = dict(line.split() for line in log.read_text().splitlines())
    assert len(where) == 12
    grouped = {w for case, w in where.items() if case.startswith("llama")}
    assert len(grouped) == 1, where
    assert set(where.values()) == {"gw0", "gw1"}, where  # and both workers ran tests
