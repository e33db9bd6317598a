"""``treespec generate`` under mlx.launch: a sharded tree run prints (on rank 0
only) the text of a classic run of the same sharded checkpoint; every way the
group or the model can be wrong is one line naming the flag, and nothing runs."""

import json
import subprocess
import sys

import pytest

from treespec import zoo
from suites.helpers_gate import gate_verdict
from suites.helpers_subprocess import project_env

from .helpers_launch import launch

pytestmark = pytest.mark.exactness


def _pair():
    return zoo.checkpoint("llama"), zoo.drafter_checkpoint("llama")


def _generate(tmp_path, *flags):
    model, draft = _pair()
    pair = ["--model", model] + (["--draft-model", draft] if "classic" not in flags else [])
    done = launch(["-m", "treespec", "generate", *pair, "-m", "24", "--json", *flags], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1, done.stdout  # rank 0 alone prints
    return lines[0]


def test_a_sharded_tree_run_prints_the_text_of_classic_decoding_of_the_same_sharded_model(
        tmp_path):
    classic = _generate(tmp_path, "--sharded", "--mode", "classic")
    tree = _generate(tmp_path, "--sharded", "--check-ranks", "--mode", "tree",
                     "--tree-branching", "2,2,1")
    assert tree["tokens"] == classic["tokens"]
    assert tree["diagnostics"]["distributed"] == {"ranks": 2, "sharding": "--sharded",
                                                  "check_ranks": True}
    gate_verdict(tree["diagnostics"]["gate"], tree["diagnostics"]["mode"], "tree")


@pytest.mark.parametrize("flags,says", [
    (["--sharded"], "--sharded: no distributed group to shard over"),
    (["--check-ranks"], "--check-ranks compares the ranks of a sharded target"),
    (["--sharded", "--mode", "auto"], "--sharded: --mode auto calibrates by timing")])
def test_a_sharding_flag_outside_mlx_launch_is_one_line_naming_it(flags, says):
    model, draft = _pair()
    done = subprocess.run([sys.executable, "-m", "treespec", "generate", "--model", str(model),
                           "--draft-model", str(draft), *flags], capture_output=True,
                          text=True, env=project_env())
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("family,flags,says", [
    ("gemma3_text", ["--sharded"], "--sharded: --model"),
    ("llama", [], "--sharded was not given: every rank would decode the whole model alone")])
def test_under_mlx_launch_a_model_that_cannot_shard_or_a_missing_flag_is_refused(
        tmp_path, family, flags, says):
    done = launch(["-m", "treespec", "generate", "--model", zoo.checkpoint(family),
                   "--mode", "classic", *flags], tmp_path)
    # mlx.launch exits 0 whatever its ranks did: each rank's own status is in its warning.
    assert "exited with code 2" in done.stdout + done.stderr
    errors = [x for x in done.stderr.splitlines() if x.startswith("treespec generate: error:")]
    assert errors and all(says in e for e in errors), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
