"""Zoo checkpoints: saved as real mlx-lm checkpoints, they load through
`mlx_lm.load` with no network and give bit-identical logits; quantized ones
quantize every eligible layer; a checkpoint is made once, keyed by what it
holds, and racing or failing writers leave one complete checkpoint or none."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest

from suites.helpers_numerics import require_sound
from suites.helpers_subprocess import project_env
from suites.zoo.helpers import REQUIRED, prefill_then_step, random_tokens
from treespec import zoo

pytestmark = pytest.mark.exactness

# All families in float32; dtype and quantization variants where they bite:
# llama (plain), gemma4_text (sliding + proportional rope), qwen3_5 (A_log
# kept float32 under bf16 by its cast_predicate), qwen3_next (quantized MoE).
LOAD_VARIANTS = [(f, "float32", None) for f in REQUIRED] + [
    ("llama", "bfloat16", None),
    ("llama", "float16", None),
    ("llama", "float32", 4),
    ("llama", "bfloat16", 8),
    ("gemma4_text", "bfloat16", None),
    ("gemma4_text", "float32", 4),
    ("qwen3_5", "bfloat16", None),
    ("qwen3_next", "float32", 4),
]


def variant_id(v):
    family, dtype, bits = v
    return f"{family}-{dtype}" + (f"-q{bits}" if bits else "")


@pytest.mark.parametrize("variant", LOAD_VARIANTS, ids=variant_id)
def test_a_saved_checkpoint_loads_offline_with_identical_logits(
    variant, zoo_root, offline
):
    family, dtype, bits = variant
    path = zoo.checkpoint(family, dtype, bits, root=zoo_root)
    loaded, tokenizer = mlx_lm.load(str(path))
    # the same forward twice is the same bytes only on sound kernels
    built = require_sound(zoo.build(family, dtype, bits))

    tokens = random_tokens(1, (2, 12))
    built_first, built_step = prefill_then_step(built, tokens, 11)
    loaded_first, loaded_step = prefill_then_step(loaded, tokens, 11)
    assert built_first.dtype == getattr(mx, dtype)
    assert mx.array_equal(built_first, loaded_first)
    assert mx.array_equal(built_step, loaded_step)
    assert tokenizer.eos_token_id == zoo.token_id("<eos>")


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantized_checkpoint_quantizes_every_eligible_layer(bits, zoo_root):
    path = zoo.checkpoint("llama", "float32", bits, root=zoo_root)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization"]["bits"] == bits
    assert config["quantization"]["group_size"] == zoo.GROUP_SIZE
    loaded, _ = mlx_lm.load(str(path))
    kinds = [type(m) for _, m in loaded.named_modules()]
    assert nn.Linear not in kinds and nn.Embedding not in kinds
    assert kinds.count(nn.QuantizedLinear) == 2 * 7 + 1  # 7 per layer + head
    assert all(m.bits == bits for _, m in loaded.named_modules() if hasattr(m, "bits"))


@pytest.mark.parametrize("family", REQUIRED)
def test_a_saved_config_is_the_family_config(family, zoo_root):
    path = zoo.checkpoint(family, root=zoo_root)
    saved = json.loads((path / "config.json").read_text())
    expected = zoo.config(family)
    assert saved == json.loads(json.dumps(expected))
    assert saved["vocab_size"] == zoo.VOCAB_SIZE


def test_a_checkpoint_is_made_once_and_keyed_by_what_it_holds(tmp_path):
    path = zoo.checkpoint("llama", root=tmp_path)
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert zoo.checkpoint("llama", root=tmp_path) == path
    assert weights.stat().st_mtime_ns == stamp
    others = {
        zoo.checkpoint("llama", "bfloat16", root=tmp_path),
        zoo.checkpoint("llama", bits=4, root=tmp_path),
        zoo.checkpoint("llama", seed=1, root=tmp_path),
        zoo.drafter_checkpoint("llama", root=tmp_path),
    }
    assert len(others) == 4 and path not in others
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in others | {path}
    )


def test_the_checkpoint_root_defaults_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TREESPEC_ZOO_DIR", str(tmp_path / "env-root"))
    path = zoo.checkpoint("qwen3")
    assert path.parent == tmp_path / "env-root"
    assert (path / "config.json").exists()


def test_a_writer_that_loses_the_race_keeps_the_winners_checkpoint(
    tmp_path, monkeypatch
):
    winner = zoo.checkpoint("llama", root=tmp_path / "elsewhere")
    root = tmp_path / "shared"
    real_save = zoo.save

    def save_then_lose(model, path, **kwargs):
        out = real_save(model, path, **kwargs)
        shutil.copytree(winner, root / winner.name)  # another worker got there first
        return out

    monkeypatch.setattr(zoo, "save", save_then_lose)
    path = zoo.checkpoint("llama", root=root)
    assert path == root / winner.name
    assert list(root.iterdir()) == [path]  # the loser's temp directory is gone
    assert mx.array_equal(
        mlx_lm.load(str(path))[0](random_tokens(10, (1, 5))),
        zoo.build("llama")(random_tokens(10, (1, 5))),
    )


def test_a_failed_write_leaves_no_checkpoint_behind(tmp_path, monkeypatch):
    real_save = zoo.save

    def save_then_crash(model, path, **kwargs):
        real_save(model, path, **kwargs)
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(zoo, "save", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        zoo.checkpoint("qwen3", root=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_racing_writers_leave_one_complete_checkpoint(tmp_path):
    # Two processes, as two pytest-xdist workers would, create the same
    # checkpoint at once; both must return the same complete directory.
    script = (
        "import sys; from treespec import zoo; "
        "print(zoo.checkpoint('gemma3_text', root=sys.argv[1]))"
    )
    env = project_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    results = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    paths = {Path(out.strip()) for out, _ in results}
    assert len(paths) == 1
    (path,) = paths
    assert list(tmp_path.iterdir()) == [path]  # no temp directory left behind
    loaded, _ = mlx_lm.load(str(path))
    tokens = random_tokens(9, (1, 6))
    assert mx.array_equal(loaded(tokens), zoo.build("gemma3_text")(tokens))
