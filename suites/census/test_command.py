"""``treespec census``: what it prints, its usage errors, ``--model`` on the
suite's tiny hybrid models, and the census in ``treespec audit``'s report.

The shapes a model's census must list are computed here from the model's
config.json, not read off the model by the census's own walk. Tried: with
the walk skipping nn.Conv1d, the ``--model`` tests fail on both models; with
the flag check not installed, the usage-error tests fail (a traceback from
the census, exit 1, or a census run on bad widths).
"""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest

from suites.census.helpers import claims
from suites.families.helpers_configs import config
from suites.families.helpers_models import build
from suites.helpers_subprocess import project_env, without_startup_notes
from treespec import zoo
from treespec.audit.runner import audit, format_report
from treespec.backend import blas
from treespec.backend import census as c
from treespec.backend.census_position import position_census, position_width
from treespec.cli import census as census_flags
from treespec.cli.main import main

pytestmark = pytest.mark.exactness

ROOT = Path(__file__).resolve().parents[2]
NON_PRODUCTS = ("sdpa", "rms_norm", "rope", "conv1d", "gated_delta", "ssm_update", "ssm_step")
PRODUCTS = ("matmul", "addmm", "quantized_matmul")  # the census's names of a linear's product


def run(capsys, *argv):
    code = main(["census", *argv])
    out = capsys.readouterr()
    return code, out.out, without_startup_notes(out.err)


def test_the_table_names_the_backend_and_gives_a_row_per_op_how_and_dtype(capsys):
    code, out, err = run(capsys, "--dtype", "float32", "--widths", "1..4")
    assert code == 0, err
    head = out.split("\n\n")[0]
    assert blas.describe(blas.detect()).removeprefix("BLAS: ") in head
    assert str(mx.default_device()) in head and mx.__version__ in head
    assert "MLX_ENABLE_TF32=" in head and "widths 1..4" in head
    rows = c.census(dtypes=("float32",), widths=range(1, 5))
    rows += position_census(dtypes=("float32",), widths=range(1, 5))
    assert {r.how for r in rows} >= {"tokens", "position"}
    lines = out.splitlines()
    for r in rows:  # each row once, with its verdict (the position rows their own kind)
        assert sum(ln.split()[:3] == [r.op, r.how, r.dtype] and r.shape in ln
                   and r.verdict in ln for ln in lines) == 1, r
    assert lines[-4].startswith(c.summary(rows))
    width = c.row_width(rows, "float32")[0]
    assert lines[-3].startswith(f"row-invariant verify (--verify rows): float32 up to {width} nodes")
    # --verify chunks: the products' rows (either layout) set the chunk, the
    # rest of the rows the verify rests on the nodes; worked out here by hand
    def cap(r):
        return r.widths[-1] if r.first_differs is None else r.first_differs - 1
    used = [r for r in rows if r.how == "batch" or (r.how == "tokens" and r.op in PRODUCTS)]
    chunk = min(cap(r) for r in used if r.op in PRODUCTS)
    rest = min(cap(r) for r in used if r.op not in PRODUCTS)
    assert lines[-2].startswith(f"with chunked linears (--verify chunks): products in calls of "
                                f"float32 up to {chunk} rows"), lines[-2]
    assert f"; the rest float32 up to {rest} nodes" in lines[-2], lines[-2]
    width = position_width(rows, "float32")[0]
    assert lines[-1].startswith(f"rows by width alone, not place (same-width reference): "
                                f"float32 up to {width}")


def test_json_holds_the_rows_and_the_backend(capsys):
    code, out, _ = run(capsys, "--dtype", "bfloat16,float16", "--widths", "1,3,5", "--json")
    assert code == 0
    got = json.loads(out)
    rows = (c.census(dtypes=("bfloat16", "float16"), widths=(1, 3, 5))
            + position_census(dtypes=("bfloat16", "float16"), widths=(1, 3, 5)))
    assert claims(got["rows"]) == claims(rows)
    assert got["position_width"] == {d: position_width(rows, d)[0] for d in ("bfloat16", "float16")}
    assert {r["dtype"] for r in got["rows"]} == {"bfloat16", "float16"}
    assert got["backend"]["blas"] == blas.describe(blas.detect())
    assert got["backend"]["mlx"] == mx.__version__


@pytest.mark.parametrize("argv, flag", [
    (["--widths", "0"], "--widths"), (["--widths", "1..x"], "--widths"),
    (["--widths", "8..2"], "--widths"), (["--widths", ""], "--widths"),
    (["--dtype", "f32"], "--dtype"), (["--dtype", ","], "--dtype"),
    (["--model", "/nonexistent/checkpoint"], "--model"),
])
def test_bad_flags_are_one_line_errors_naming_the_flag(capsys, argv, flag):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"treespec census: error: {flag}"), err


def test_a_folder_that_is_no_checkpoint_is_refused_naming_model(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    code, out, err = run(capsys, "--model", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "--model" in err, err


def test_the_light_flag_check_knows_the_censuss_dtypes():
    assert census_flags.DTYPES == c.DTYPES and census_flags.parse_widths("1..16") == c.WIDTHS


def test_flag_errors_and_help_load_no_mlx_lm_and_no_census():
    script = ("import sys\nfrom treespec.cli.main import main\n"
              "for argv in (['census', '--widths', '0'], ['census', '--help']):\n"
              "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
              "print('HEAVY', sorted(m for m in ('mlx_lm', 'treespec.backend.census') "
              "if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=project_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout and "--widths" in proc.stderr


def shapes(rows) -> dict:
    out = {}
    for r in rows:
        out.setdefault(r["op"], set()).add(r["shape"])
    return out


def census_of(capsys, path) -> dict:
    code, out, err = run(capsys, "--model", str(path), "--widths", "1..3", "--json")
    assert code == 0, err
    return json.loads(out)


def test_model_lists_a_mamba_checkpoints_own_shapes(capsys, tmp_path):
    cfg = config("mamba")
    path = zoo.save(build("mamba"), tmp_path / "mamba", config=cfg)
    got = census_of(capsys, path)
    inner, state, hidden = cfg["intermediate_size"], cfg["state_size"], cfg["hidden_size"]
    rank, vocab = cfg["time_step_rank"], cfg["vocab_size"]
    assert {k: v for k, v in shapes(got["rows"]).items() if k in NON_PRODUCTS} == {
        "rms_norm": {f"dim {hidden}"},
        "conv1d": {f"channels {inner} kernel {cfg['conv_kernel']} groups {inner}"},
        "ssm_step": {f"inner {inner} state {state}"},
    }
    assert shapes(got["rows"])["matmul"] == {
        f"{hidden}->{2 * inner}", f"{inner}->{rank + 2 * state}", f"{inner}->{hidden}",
        f"{hidden}->{vocab}"}
    assert shapes(got["rows"])["addmm"] == {f"{rank}->{inner}"}  # dt_proj has a bias
    assert {r["dtype"] for r in got["rows"]} == {"float32"}
    assert {r["how"] for r in got["rows"] if r["op"] == "ssm_step"} == {"batch"}


def test_model_lists_a_qwen3_next_checkpoints_own_shapes(capsys):
    cfg = zoo.config("qwen3_next")
    got = census_of(capsys, zoo.checkpoint("qwen3_next"))
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv = 2 * hk * dk + hv * dv
    head = cfg["head_dim"]
    assert {k: v for k, v in shapes(got["rows"]).items() if k.split("+")[0] in NON_PRODUCTS} == {
        **{op: {f"heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']} dim {head} "
                f"keys 24+M"} for op in ("sdpa", "sdpa+causal", "sdpa+mask", "sdpa+additive")},
        "rms_norm": {f"dim {cfg['hidden_size']}", f"dim {head}", f"dim {dv}"},
        "rope": {f"RoPE {int(cfg['partial_rotary_factor'] * head)}/{head} "
                 f"base {cfg['rope_theta']:g} offset 24"},
        "conv1d": {f"channels {conv} kernel {cfg['linear_conv_kernel_dim']} groups {conv}"},
        "gated_delta": {f"heads k{hk}/v{hv} dims k{dk}/v{dv}"},
    }
    hidden = cfg["hidden_size"]
    assert {f"{hidden}->{zoo.VOCAB_SIZE}", f"{hidden}->{2 * hk * dk + 2 * hv * dv}"} <= \
        shapes(got["rows"])["matmul"]
    assert {(r["op"], r["how"]) for r in got["rows"] if r["op"] == "gated_delta"} == {
        ("gated_delta", "steps"), ("gated_delta", "batch")}


def test_each_rope_is_measured_at_its_own_attentions_head_size(capsys):
    # gemma4_text's layers differ: sliding ones rotate all of a 16-wide head,
    # global ones a proportional RoPE over a 32-wide head. Measured at one
    # attention's head size, the global rope's row could not run (MLX: dims
    # must not exceed the input's last dimension).
    cfg = zoo.config("gemma4_text")
    got = census_of(capsys, zoo.checkpoint("gemma4_text"))
    head, wide = cfg["head_dim"], cfg["global_head_dim"]
    sliding = cfg["rope_parameters"]["sliding_attention"]["rope_theta"]
    assert shapes(got["rows"])["rope"] == {f"RoPE {head}/{head} base {sliding:g} offset 24",
                                           f"ProportionalRoPE {wide}/{wide} offset 24"}
    assert [r for r in got["rows"] if r["op"] == "rope" and r.get("error")] == []


def test_the_audit_reports_the_census_of_the_models_shapes():
    report = audit(zoo.checkpoint("qwen3_next"), properties=("adapter",))
    census = report.to_json()["header"]["census"]
    assert {r["op"] for r in census["rows"]} >= {"matmul", "sdpa+mask", "gated_delta", "conv1d"}
    assert all(r["widths"][-1] == 64 for r in census["rows"])  # the long-context trees' sizes
    # measured in child processes that load the checkpoint again: what this process measures
    model = mlx_lm.load(str(zoo.checkpoint("qwen3_next")))[0]
    assert claims(census["rows"]) == claims(c.census(model, widths=census["rows"][0]["widths"]))
    text = format_report(report)
    assert "census: a row of an M-row call against that row alone" in text
    assert census["summary"] in text
