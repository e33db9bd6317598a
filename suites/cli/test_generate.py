"""`treespec generate`: the README's first command, and its clear errors."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx_lm
import pytest

from treespec import zoo
from treespec.checkpoints import default_pair
from treespec.cli import main
from treespec.decode import decode, detokenize

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args):
    run = subprocess.run([sys.executable, "-m", "treespec", "generate", *args], cwd=ROOT,
                         capture_output=True, timeout=600)
    # Bytes, decoded here: text mode would turn a generated "\r" into "\n".
    run.stdout, run.stderr = run.stdout.decode(), run.stderr.decode()
    return run


@pytest.mark.exactness
def test_generate_with_no_arguments_runs_the_built_in_pair_and_matches_mlx_lm():
    run = run_cli("--json", "--max-tokens", "24")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    target, tokenizer = mlx_lm.load(str(default_pair()[0]))
    prompt = "def fibonacci(n):\n    "  # the CLI's default prompt
    assert out["text"] == mlx_lm.generate(target, tokenizer, prompt=prompt, max_tokens=24)
    d = out["diagnostics"]
    assert d["mode"] == "chain" and d["requested"] == {"kind": "chain", "block": 4, "budget": 3}
    assert d["rounds"] > 0 and d["gate"]["exact"] and "BLAS" in d["blas"]
    assert set(d["time_ms"]) == {"prefill", "draft", "verify", "walk", "commit"}


def test_tree_mode_with_checkpoint_paths_prints_text_then_diagnostics(tmp_path):
    target = zoo.checkpoint("qwen3_5")
    draft = zoo.drafter_checkpoint("qwen3_5")
    run = run_cli("--model", str(target), "--draft-model", str(draft), "--mode", "tree",
                  "--tree-branching", "2,2,1", "--max-tokens", "16", "--prompt", "hello")
    assert run.returncode == 0, run.stderr
    text, _, diag = run.stdout.partition("\n--\n")
    model, tok = mlx_lm.load(str(target))
    assert text == mlx_lm.generate(model, tok, prompt="hello", max_tokens=16)
    assert "mode: tree" in diag and "branching=[2, 2, 1]" in diag and "effective:" in diag


def test_the_effective_budget_is_reported_next_to_the_requested_one():
    target, draft = zoo.build("llama"), zoo.drafter("llama")
    # 5 tokens with block 8: rounds are cut to what max_tokens still allows.
    s = decode(target, [1, 2, 3], mode="chain", draft_model=draft, block=8, max_tokens=5)
    summary = s.stats.summary()
    assert summary["requested"]["budget"] == 7
    assert summary["effective"]["max_nodes"] <= 5 < 8


def _error(capsys, *args):
    assert main(["generate", *args]) == 2
    return capsys.readouterr().err


def test_a_bad_path_is_a_clear_error(capsys, tmp_path):
    err = _error(capsys, "--model", str(tmp_path / "nope"), "--draft-model", str(tmp_path))
    assert "--model" in err and "not an mlx-lm checkpoint directory" in err


def test_a_draft_model_with_another_tokenizer_is_refused(capsys, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(zoo.drafter_checkpoint("llama"), draft)
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first = next(iter(vocab))
    vocab["X" + first] = vocab.pop(first)
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    err = _error(capsys, "--model", str(zoo.checkpoint("llama")), "--draft-model", str(draft))
    assert "tokenizer differs" in err


def test_a_target_that_refuses_trees_is_a_clear_error(capsys, tmp_path):
    target = tmp_path / "dynamic"
    shutil.copytree(zoo.checkpoint("llama"), target)
    cfg = json.loads((target / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    (target / "config.json").write_text(json.dumps(cfg))
    err = _error(capsys, "--model", str(target), "--draft-model", str(zoo.drafter_checkpoint("llama")),
                 "--mode", "tree")
    assert "refuses tree verification" in err and "DynamicNTKScalingRoPE" in err


def test_classic_mode_needs_no_drafter_and_equals_mlx_lm(capsys):
    target = zoo.checkpoint("gemma3_text")
    assert main(["generate", "--model", str(target), "--mode", "classic", "--max-tokens", "20",
                 "--prompt", "abc", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    model, tok = mlx_lm.load(str(target))
    assert out["text"] == mlx_lm.generate(model, tok, prompt="abc", max_tokens=20)
    assert out["text"] == detokenize(tok, out["tokens"])
