"""The benchmarks start: every module of benchmarks/ (found by listing the
folder, so a new one is checked without being named here) prints its usage
for ``python -m benchmarks.NAME --help`` from the repository root, as does
every device script for ``--help``; a module that no longer imports (a
treespec name moved, a typo) fails here, not on the day someone measures.
And one benchmark, the cheapest, runs end to end on the smallest pair (the
zoo's llama, one pass) and writes its record: line 1 the command that
reruns it, line 2 the machine and commit. Not timed: these check that the
benchmarks run, never what they measure."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from suites.helpers_subprocess import project_env

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = {"__init__", "harness"}  # imported by the benchmarks, not run
MODULES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in LIBRARIES)
DEVICE_SCRIPTS = sorted((ROOT / "benchmarks" / "device").glob("*.sh"))


def run(*args, timeout=300):
    return subprocess.run(list(args), cwd=ROOT, env=project_env(), capture_output=True,
                          text=True, timeout=timeout)


def test_the_folder_listing_finds_the_benchmarks_and_the_device_scripts():
    assert {"commit_cost", "verify_cost", "draft_cost", "ab_mlx_lm"} <= set(MODULES)
    assert not LIBRARIES & set(MODULES)
    assert [p.name for p in DEVICE_SCRIPTS] == ["exactness_timed.sh", "scaled_costs_and_bench.sh"]


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_prints_its_usage(name):
    proc = run(sys.executable, "-m", f"benchmarks.{name}", "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"usage: python -m benchmarks.{name} "), proc.stdout[:300]


@pytest.mark.parametrize("script", DEVICE_SCRIPTS, ids=lambda p: p.name)
def test_every_device_script_prints_its_usage(script):
    proc = run("bash", str(script.relative_to(ROOT)), "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: OUT=DIR "), proc.stdout[:300]


def test_the_cheapest_benchmark_runs_and_its_record_starts_with_its_command(tmp_path):
    args = ["--pair", "zoo", "--repeats", "1", "--calls", "1", "--out", str(tmp_path)]
    proc = run(sys.executable, "-m", "benchmarks.commit_cost", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = list(tmp_path.rglob("*.txt"))
    assert len(records) == 1, records
    record = records[0]
    assert record.parent.parent == tmp_path / "cpu-bench"  # <out>/<topic>/<commit>/
    assert record.name == "commit-cost-zoo-llama-float32.txt"
    lines = record.read_text().splitlines()
    words = shlex.split(lines[0])
    env, command = words[:words.index("python")], words[words.index("python"):]
    assert command == ["python", "-m", "benchmarks.commit_cost", *args]
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", w) for w in env), env
    assert f"treespec git {record.parent.name}" in lines[1] and "mlx " in lines[1], lines[1]
    assert lines[2] == "zoo llama float32 and its drafter"
    figures = [line for line in lines if re.search(r"\d ms  x\d", line)]
    assert any("TreeAdapter.commit, branch" in line for line in figures), lines
