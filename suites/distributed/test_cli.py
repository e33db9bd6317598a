"""``treespec generate``, ``bench`` and ``audit`` under mlx.launch: a sharded
tree run prints (on rank 0 only) the text of a classic run of the same sharded
checkpoint (a pipelined one: of the unsharded checkpoint, bit for bit); a
sharded bench's rows and a sharded audit's properties pass, every rank having
found the same; every way the group, the model or an option can be wrong is
one line naming the flag, and nothing runs."""

import json
import subprocess
import sys

import pytest

from treespec import zoo
from treespec.audit.records import PASS
from treespec.bench.report import EXACT
from suites.helpers_gate import gate_verdict
from suites.helpers_numerics import exact_backend
from suites.helpers_subprocess import project_env, without_startup_notes

from .helpers_launch import launch

pytestmark = pytest.mark.exactness

# The zoo family whose pipelined run is tested here rather than in test_sharded.py.
PIPELINE_CLI_FAMILY = "qwen3_next"


def _pair(family="llama"):
    return zoo.checkpoint(family), zoo.drafter_checkpoint(family)


def _one_json(done):
    """The one JSON line rank 0 printed (every other rank prints nothing)."""
    assert done.returncode == 0 and "exited with code" not in done.stdout + done.stderr, (
        done.stderr[-3000:])
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1, done.stdout  # rank 0 alone prints
    return lines[0]


def _generate(tmp_path, *flags, family="llama"):
    model, draft = _pair(family)
    pair = ["--model", model] + (["--draft-model", draft] if "classic" not in flags else [])
    return _one_json(launch(["-m", "treespec", "generate", *pair, "-m", "24", "--json", *flags],
                            tmp_path))


def test_a_sharded_tree_run_prints_the_text_of_classic_decoding_of_the_same_sharded_model(
        tmp_path):
    classic = _generate(tmp_path, "--sharded", "--mode", "classic")
    tree = _generate(tmp_path, "--sharded", "--check-ranks", "--mode", "tree",
                     "--tree-branching", "2,2,1")
    assert tree["tokens"] == classic["tokens"]
    assert tree["diagnostics"]["distributed"] == {"ranks": 2, "sharding": "tensor",
                                                  "check_ranks": True}
    gate_verdict(tree["diagnostics"]["gate"], tree["diagnostics"]["mode"], "tree")


def test_a_pipelined_tree_run_prints_the_text_of_classic_decoding_of_the_whole_model(tmp_path):
    """Pipeline parallelism runs each layer whole on one rank, so its text is
    the unsharded model's: the reference is one process, no launcher, classic
    decoding (mlx-lm's generate_step) of the same checkpoint. qwen3_next: a
    hybrid (GatedDeltaNet and attention layers on different ranks)."""
    tree = _generate(tmp_path, "--sharded", "pipeline", "--check-ranks", "--mode", "tree",
                     "--tree-branching", "2,2,1", family=PIPELINE_CLI_FAMILY)
    whole = subprocess.run([sys.executable, "-m", "treespec", "generate", "--model",
                            str(zoo.checkpoint(PIPELINE_CLI_FAMILY)), "--mode", "classic",
                            "-m", "24", "--json"], capture_output=True, text=True,
                           env=project_env())
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert tree["tokens"] == json.loads(whole.stdout)["tokens"]
    assert tree["diagnostics"]["distributed"] == {"ranks": 2, "sharding": "pipeline",
                                                  "check_ranks": True}
    gate_verdict(tree["diagnostics"]["gate"], tree["diagnostics"]["mode"], "tree")


def test_a_sharded_bench_times_rows_whose_text_is_classic_decodings_on_every_rank(tmp_path):
    """Each speculative row (chain, fixed tree, mlx-lm's own speculative
    decoding) of a bench of the sharded target emits the tokens of its classic
    row (mlx-lm's generate_step), diffed by the bench; the command then
    compares every rank's rows (verdicts, tokens, rounds) and exits 2 on a
    difference. Only off an exact backend may the probe decline a row."""
    model, draft = _pair()
    report = _one_json(launch(["-m", "treespec", "bench", "--model", model, "--draft-model",
                               draft, "--sharded", "--no-auto", "--no-confidence", "--prompts",
                               "1", "--max-tokens", "8", "--repeats", "1", "--blocks", "3",
                               "--trees", "2,1", "--json"], tmp_path))
    assert report["distributed"] == {"ranks": 2, "sharding": "tensor"}
    kinds = [r["kind"] for r in report["rows"]]
    assert kinds == ["classic", "chain", "fixed", "mlx-lm"], kinds
    for r in report["rows"][1:]:
        assert (r["exact"] and r["checks"] == EXACT and r["tokens"] == 8) or (
            not exact_backend() and "declined" in (r["reason"] or "")), r


def test_a_sharded_audit_passes_its_properties_on_every_rank(tmp_path):
    """The audit's own references (one-token steps, a cache that only saw the
    accepted path, mlx_lm.generate's text) on the sharded target; the command
    compares every rank's verdicts and exits 2 on a difference."""
    report = _one_json(launch(["-m", "treespec", "audit", "--model", zoo.checkpoint("llama"),
                               "--sharded", "--only", "adapter,tree-verify,rollback,e2e",
                               "--context", "0", "--draws", "1", "--max-tokens", "8",
                               "--json"], tmp_path))
    assert report["header"]["distributed"] == {"ranks": 2, "sharding": "tensor"}
    assert report["ok"] and not report["unverified"], report["failed"]
    assert report["verdict"] == PASS or not exact_backend(), report["verdict"]
    ran = {c["name"].split("[")[0] for c in report["checks"]}
    assert ran == {"adapter", "tree-verify", "rollback", "e2e"}, ran


@pytest.mark.parametrize("command,flags,says", [
    ("generate", ["--sharded"], "--sharded: no distributed group to shard over"),
    ("generate", ["--check-ranks"], "--check-ranks compares the ranks of a sharded target"),
    ("generate", ["--sharded", "--mode", "auto"], "--sharded: --mode auto calibrates by timing"),
    ("bench", ["--sharded"], "--sharded: bench's auto row is chosen by timing on each rank"),
    ("bench", ["--sharded", "--no-auto", "--max-seconds", "9"],
     "--max-seconds: it stops the bench by each rank's own clock"),
    ("bench", ["--sharded", "--no-auto"], "--sharded: no distributed group to shard over"),
    ("audit", ["--sharded"], "--sharded: no distributed group to shard over"),
    ("audit", ["--sharded", "pipeline"], "--sharded pipeline: the audit evaluates forwards "
     "piecewise")])
def test_a_sharding_flag_outside_mlx_launch_is_one_line_naming_it(command, flags, says):
    model, draft = _pair()
    done = subprocess.run([sys.executable, "-m", "treespec", command, "--model", str(model),
                           "--draft-model", str(draft), *flags], capture_output=True,
                          text=True, env=project_env())
    err = without_startup_notes(done.stderr)
    assert done.returncode == 2 and done.stdout == ""
    assert err.count("\n") == 1 and says in err, done.stderr


@pytest.mark.parametrize("command,family,flags,says", [
    ("generate", "gemma3_text", ["--sharded"], "--sharded: --model"),
    ("generate", "llama", [], "--sharded was not given: every rank would decode the whole "
     "model alone"),
    ("bench", "qwen3", ["--sharded", "pipeline", "--no-auto"],
     "does not support pipelining"),
    ("audit", "llama", [], "--sharded was not given")])
def test_under_mlx_launch_a_model_that_cannot_shard_or_a_missing_flag_is_refused(
        tmp_path, command, family, flags, says):
    model, draft = _pair(family)
    extra = {"generate": ["--mode", "classic"], "bench": ["--draft-model", draft],
             "audit": []}[command]
    done = launch(["-m", "treespec", command, "--model", model, *extra, *flags], tmp_path)
    # mlx.launch exits 0 whatever its ranks did: each rank's own status is in its warning.
    assert "exited with code 2" in done.stdout + done.stderr
    errors = [x for x in done.stderr.splitlines()
              if x.startswith(f"treespec {command}: error:")]
    assert errors and all(says in e for e in errors), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
