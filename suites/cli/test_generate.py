"""`treespec generate`: the README's first command, its output in every mode,
the prompt as mlx-lm reads it, and its clear errors.

The built-in pair speculates where the regime is exact; elsewhere the gate
may decline (CUDA): the text is then classic decoding's, still mlx-lm's,
and the decline is the verdict, with its reason (suites/helpers_gate.py)."""

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlx_lm
import pytest

from suites.helpers_gate import gate_verdict
from suites.helpers_numerics import exact_backend, model_label
from suites.helpers_subprocess import without_startup_notes
from suites.verdict import E2E, expect
from treespec import caches, zoo
from treespec.backend.census import census, row_width
from treespec.checkpoints import default_pair
from treespec.cli.rows import chunks_plan
from treespec.cli.main import main
from treespec.decoding import decode, detokenize

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args):
    run = subprocess.run([sys.executable, "-m", "treespec", "generate", *args], cwd=ROOT,
                         capture_output=True)
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
    assert d["requested"] == {"kind": "chain", "block": 4, "budget": 3}
    # exact regimes: the gate passes and the run is "chain"; elsewhere it may
    # be "classic (declined chain)", saying why
    verdict = gate_verdict(d["gate"], d["mode"], "chain")
    assert d["rounds"] > 0 and "BLAS" in d["blas"]
    assert set(d["time_ms"]) == {"prefill", "draft", "verify", "walk", "commit"}
    expect(verdict, E2E, *model_label(target))


@pytest.mark.exactness
def test_the_row_invariant_verify_decodes_mlx_lms_text_through_its_own_gate():
    """Where the census keeps a row's bits for one node only, no round would
    be exact and the command refuses in one line (the float16 pair on the
    H100: dense matmul differs from 2 rows); elsewhere it runs, mlx-lm's text
    through its own gate. The census is measured here, on the target's own
    shapes at the widths of the round asked for (its root and budget drafts)."""
    budget = 4
    run = run_cli("--json", "--max-tokens", "24", "--mode", "tree", "--budget", str(budget),
                  "--verify", "rows")
    target, tokenizer = mlx_lm.load(str(default_pair()[0]))
    width, limiting = row_width(census(target, widths=range(1, budget + 2)))
    if width is not None and width < 2:
        err = without_startup_notes(run.stderr)
        assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
        assert err.count("\n") == 1 and err.startswith(
            "treespec generate: error: --verify rows: ") and "--allow-inexact" in err, run.stderr
        assert any(f"{r.op} {r.how} {r.dtype} {r.shape}" in err for r in limiting), (err, limiting)
        return
    assert run.returncode == 0, run.stderr
    d = json.loads(run.stdout)["diagnostics"]
    want = mlx_lm.generate(target, tokenizer, prompt="def fibonacci(n):\n    ", max_tokens=24)
    assert json.loads(run.stdout)["text"] == want
    assert d["verify"] == "rows"
    family, dtype = model_label(target)
    expect(gate_verdict(d["gate"], d["mode"], "tree"), E2E, family, f"{dtype} rows")


@pytest.mark.exactness
def test_the_chunked_verify_decodes_mlx_lms_text_through_its_own_gate():
    """--verify chunks on the zoo's float32 llama (whose products OpenBLAS
    keeps for 3 rows, so the flat verify is declined from 4): a chain of 6
    nodes a round, mlx-lm's text, the chunk width the census of its own
    shapes gives (measured here) said on stderr, and the gate's verdict on
    the chunked verify recorded (exact wherever that verify is:
    suites/verify/test_row_chunks.py)."""
    target_dir, draft_dir = zoo.checkpoint("llama"), zoo.drafter_checkpoint("llama")
    prompt = "def f(x):"
    run = run_cli("--model", str(target_dir), "--draft-model", str(draft_dir), "--json",
                  "--max-tokens", "24", "--mode", "chain", "--block", "6", "--verify", "chunks",
                  "--prompt", prompt)
    assert run.returncode == 0, run.stderr
    target, tokenizer = mlx_lm.load(str(target_dir))
    out = json.loads(run.stdout)
    assert out["text"] == mlx_lm.generate(target, tokenizer, prompt=prompt, max_tokens=24)
    d = out["diagnostics"]
    assert d["verify"] == "chunks"
    plan = chunks_plan(target, 5, False)
    said = "one row a call" if plan.width == 1 else f"calls of at most {plan.width} rows"
    assert f"--verify chunks: linear layers in {said}" in run.stderr, run.stderr
    family, dtype = model_label(target)
    expect(gate_verdict(d["gate"], d["mode"], "chain"), E2E, family, f"{dtype} chunks")


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
    return without_startup_notes(capsys.readouterr().err)


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


def test_a_tokenizer_with_two_ids_swapped_is_refused_showing_them(capsys, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(zoo.drafter_checkpoint("llama"), draft)
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    err = _error(capsys, "--model", str(zoo.checkpoint("llama")), "--draft-model", str(draft))
    ia, ib = vocab[b], vocab[a]  # the target's ids
    assert (f" entries differ, first {a!r}: target {ia}, draft {ib}; "
            f"{b!r}: target {ib}, draft {ia}; speculative decoding needs") in err
    assert "tokenizer differs from the target's: 2 of " in err


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


# ----------------------------------------------------------------------------- output


FINAL = re.compile(r"^(\d+) tokens in [\d.]+ s, [\d.]+ tok/s \((.+)\); gate: (.+)$")


def run_main(capsys, *args):
    assert main(["generate", *args]) == 0
    return capsys.readouterr()


@pytest.mark.parametrize("flags,mode,gate", [
    (["--mode", "classic"], "classic", "not needed (classic decoding)"),
    (["--mode", "chain"], "chain", "exact"),
    (["--mode", "tree", "--tree-branching", "2,1"], "tree", "exact"),
], ids=["classic", "chain", "tree"])
def test_every_run_ends_in_one_line_of_tokens_speed_and_gate(capsys, flags, mode, gate):
    out = run_main(capsys, "-m", "6", *flags).out
    last = out.rstrip("\n").splitlines()[-1]
    match = FINAL.match(last)
    assert match, last
    assert int(match.group(1)) == 6
    if mode != "classic" and not exact_backend() and match.group(3).startswith("declined"):
        # A backend the census measures inexact: the gate may decline, and says so.
        assert match.group(2) == f"classic (declined {mode})", last
        return
    assert match.group(2) == mode and match.group(3).startswith(gate), last


def test_json_keeps_stdout_one_object_and_the_final_line_on_stderr(capsys):
    out = run_main(capsys, "-m", "6", "--json")
    assert json.loads(out.out)["tokens"]
    assert FINAL.match(out.err.rstrip("\n").splitlines()[-1])


def test_quiet_prints_the_text_only(capsys):
    quiet = run_main(capsys, "-m", "6", "--quiet")
    loud = run_main(capsys, "-m", "6", "--json")
    assert quiet.out == json.loads(loud.out)["text"] + "\n" and quiet.err == ""


def test_classic_prints_no_field_that_does_not_apply(capsys):
    target, _ = default_pair()
    out = run_main(capsys, "--model", str(target), "-m", "6")
    diag = out.out.split("\n--\n", 1)[1]
    keys = [line.split(":", 1)[0] for line in diag.splitlines()[:-1]]
    assert keys[0] == "mode" and "emitted" in keys
    for absent in ("requested", "gate", "draft_model", "notes", "acceptance", "rounds"):
        assert absent not in keys, diag
    assert ": \n" not in diag and "None" not in diag
    assert "classic decoding (mlx-lm's generate_step)" in out.err  # --model alone says so


def test_model_alone_equals_mlx_lm_generate(capsys):
    target, _ = default_pair()
    out = json.loads(run_main(capsys, "--model", str(target), "-m", "12", "--json",
                              "-p", "import os").out)
    model, tok = mlx_lm.load(str(target))
    assert out["diagnostics"]["mode"] == "classic"
    assert out["text"] == mlx_lm.generate(model, tok, prompt="import os", max_tokens=12)


@pytest.mark.slow
def test_auto_says_its_reason_once(capsys):
    out = run_main(capsys, "--mode", "auto", "-m", "6")
    lines = [ln for ln in out.out.splitlines() if ln.startswith("auto: ")]
    assert len(lines) == 1 and ", reason=predicted " in lines[0]
    reason = lines[0].split(", reason=", 1)[1]
    assert (out.out + out.err).count(reason[:60]) == 1


# ----------------------------------------------------------------------------- the prompt


def test_prompt_dash_reads_stdin_and_escapes_read_as_mlx_lm_reads_them(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("class Stack:\n"))
    piped = json.loads(run_main(capsys, "-p", "-", "-m", "8", "--json").out)
    escaped = json.loads(run_main(capsys, "-p", "class Stack:\\n", "-m", "8", "--json").out)
    target, tok = mlx_lm.load(str(default_pair()[0]))
    want = mlx_lm.generate(target, tok, prompt="class Stack:\n", max_tokens=8)
    assert piped["text"] == escaped["text"] == want


@pytest.mark.parametrize("mode", ["classic", "chain", "tree"])
def test_an_empty_prompt_is_the_same_error_in_every_mode(capsys, mode):
    err = _error(capsys, "-p", "", "--mode", mode)
    assert err == ("treespec generate: error: --prompt: the prompt is empty (no tokens); every "
                   "mode needs at least one token to start from\n")


@pytest.fixture(scope="module")
def short_positions(tmp_path_factory):
    """The zoo llama, told it was trained for 24 positions."""
    path = tmp_path_factory.mktemp("positions") / "llama24"
    shutil.copytree(zoo.checkpoint("llama"), path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["max_position_embeddings"] = 24
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_a_prompt_past_the_models_positions_is_an_error(capsys, short_positions):
    err = _error(capsys, "--model", str(short_positions), "-p", "x" * 40)
    assert "past the model's max_position_embeddings 24" in err


def test_a_run_that_may_pass_the_models_positions_warns_and_runs(capsys, short_positions):
    out = run_main(capsys, "--model", str(short_positions), "-p", "abc", "-m", "30")
    assert "warning: prompt" in out.err and "max_position_embeddings 24" in out.err
    assert FINAL.match(out.out.rstrip("\n").splitlines()[-1])


# ----------------------------------------------------------------------------- KV cache flags


@pytest.mark.exactness
def test_kv_bits_run_as_mlx_lm_generate_runs_them(capsys):
    flags = ["--kv-bits", "4", "--quantized-kv-start", "12", "-m", "24", "-p", "import os\n"]
    got = json.loads(run_main(capsys, *flags, "--json").out)
    target, tok = mlx_lm.load(str(default_pair()[0]))
    want = mlx_lm.generate(target, tok, prompt="import os\n", max_tokens=24, kv_bits=4,
                           quantized_kv_start=12)
    assert got["text"] == want
    gate_verdict(got["diagnostics"]["gate"], got["diagnostics"]["mode"], "chain")


def test_batch_levels_drafts_wide_levels_as_batch_rows_and_keeps_mlx_lms_text(capsys,
                                                                             monkeypatch):
    """``--batch-levels``: the same fixed tree, its level of two fed nodes
    drafted over forked draft caches (counted at ``caches.fork``; none
    without the flag), and the text still mlx-lm's."""
    forks, fork = [], caches.fork
    monkeypatch.setattr(caches, "fork", lambda c, rows: forks.append(rows) or fork(c, rows))
    flags = ["--mode", "tree", "--tree-branching", "2,1,1,1", "-m", "24", "-p", "import os\n",
             "--json"]
    rows = json.loads(run_main(capsys, *flags, "--batch-levels").out)
    forked = len(forks)
    injected = json.loads(run_main(capsys, *flags).out)
    assert len(forks) == forked and 0 < forked <= rows["diagnostics"]["rounds"]
    assert rows["diagnostics"]["requested"]["batch_levels"] is True
    assert "batch_levels" not in injected["diagnostics"]["requested"]
    target, tok = mlx_lm.load(str(default_pair()[0]))
    want = mlx_lm.generate(target, tok, prompt="import os\n", max_tokens=24)
    gate_verdict(rows["diagnostics"]["gate"], rows["diagnostics"]["mode"], "tree")
    assert rows["text"] == want == injected["text"]


def test_kv_flags_that_cannot_act_here_are_refused_with_the_reason(capsys):
    # mlx-lm's llama builds its own caches, so make_prompt_cache ignores max_kv_size
    err = _error(capsys, "--max-kv-size", "512")
    assert "--max-kv-size 512: this mlx_lm.models.llama model builds its own caches" in err
    err = _error(capsys, "--kv-bits", "8", "-m", "10")
    assert "--kv-bits 8 acts from position 5000 on (--quantized-kv-start 5000)" in err


# ----------------------------------------------------------------------------- against mlx-lm's CLI


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    """The zoo llama with a chat template, as instruct checkpoints have."""
    path = tmp_path_factory.mktemp("template") / "llama"
    shutil.copytree(zoo.checkpoint("llama"), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|reserved_0|>{{ m['role'] }}: "
                            "{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}assistant: {% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


def both_clis(model, *flags, stdin=None):
    """(mlx-lm's `mlx_lm generate --verbose False`, `treespec generate --quiet`) stdout."""
    args = ["--model", str(model), "-m", "12", *flags]
    mlx = subprocess.run([sys.executable, "-m", "mlx_lm", "generate", *args, "--verbose", "False"],
                         cwd=ROOT, capture_output=True, input=stdin)
    ours = subprocess.run([sys.executable, "-m", "treespec", "generate", *args, "--quiet"],
                          cwd=ROOT, capture_output=True, input=stdin)
    assert mlx.returncode == 0 and ours.returncode == 0, (mlx.stderr, ours.stderr)
    return mlx.stdout, ours.stdout


def test_the_prompt_reads_as_mlx_lms_own_command_line_reads_it(templated):
    with_template = both_clis(templated, "-p", "hello there")
    raw = both_clis(templated, "-p", "hello there", "--ignore-chat-template")
    piped = both_clis(templated, "-p", "-", "--ignore-chat-template", stdin=b"hello there")
    for mlx_lm_text, ours in (with_template, raw, piped):
        assert ours == mlx_lm_text
    assert with_template[0] != raw[0] and raw[0] == piped[0]
