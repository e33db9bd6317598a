"""The zoo: tiny seeded mlx-lm models that every other suite builds on.

What the suites rely on, pinned here: the weights are a pure function of
(family, seed); each family hands mlx-lm the cache types of the real
architecture; a saved checkpoint loads through `mlx_lm.load` with no network
and gives bit-identical logits; the tokenizer round-trips text; the drafter
agrees with its target only partly; logits are varied, not degenerate.
"""

import hashlib
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlx.utils import tree_flatten
from mlx_lm.models.cache import (
    ArraysCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from suites.helpers_numerics import require_sound
from suites.helpers_subprocess import project_env
from treespec import numerics, zoo
from treespec.blas import regime

pytestmark = pytest.mark.exactness

REPO = Path(__file__).resolve().parents[2]

REQUIRED = ("llama", "qwen3", "gemma3_text", "gemma4_text", "qwen3_5", "qwen3_next")

# What each architecture must hand mlx-lm, written from the model cards (not
# read from zoo): "kv" KVCache, "rotN" RotatingKVCache with a window of N,
# "arrays" the GatedDeltaNet's ArraysCache.
EXPECTED_CACHES = {
    "llama": ["kv", "kv"],
    "qwen3": ["kv", "kv"],
    "gemma3_text": ["rot8", "rot8", "kv", "rot8"],
    "gemma4_text": ["rot16", "kv", "rot16", "kv"],
    "qwen3_5": ["arrays", "arrays", "arrays", "kv"],
    "qwen3_next": ["arrays", "kv", "arrays", "kv"],
}

# sha256 (first 16 hex) over the sorted (name, float32 bytes) of build(f).
# Recomputed on any machine, these must not change: the weights are meant to
# be identical everywhere. If a deliberate change moves them, bump
# zoo.VERSION and update this table.
WEIGHT_HASHES = {
    "llama": "fb6ebb50e794cf91",
    "qwen3": "a4d6531e333fae2f",
    "gemma3_text": "8f97314dec5347b0",
    "gemma4_text": "13237a144b133991",
    "qwen3_5": "c8cc2ad8a8450232",
    "qwen3_next": "1bee3a1e7f9b5ae4",
}

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


@pytest.fixture(scope="session")
def zoo_root(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture
def offline(monkeypatch):
    """No network: the hub is told so, and any socket connection fails."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise OSError("network access attempted while offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def random_tokens(seed, shape, high=zoo.VOCAB_SIZE):
    return mx.array(np.random.RandomState(seed).randint(0, high, size=shape))


def cache_kind(c):
    if isinstance(c, RotatingKVCache):
        return f"rot{c.max_size}"
    if isinstance(c, KVCache):
        return "kv"
    if isinstance(c, ArraysCache):
        return "arrays"
    return type(c).__name__


def prefill_then_step(model, tokens, split):
    """Logits of a prefill over tokens[:, :split] and of one cached step."""
    cache = make_prompt_cache(model)
    first = model(tokens[:, :split], cache=cache)
    step = model(tokens[:, split : split + 1], cache=cache)
    return first, step


def weight_hash(model):
    h = hashlib.sha256()
    for name, value in sorted(tree_flatten(model.parameters())):
        h.update(name.encode())
        h.update(np.array(value).tobytes())
    return h.hexdigest()[:16]


def test_the_zoo_has_every_required_family():
    assert set(REQUIRED) <= set(zoo.FAMILIES)
    for family in zoo.FAMILIES:
        assert zoo.config(family)["model_type"] == family


@pytest.mark.parametrize("family", REQUIRED)
def test_build_is_deterministic_across_calls(family):
    first = dict(tree_flatten(zoo.build(family).parameters()))
    # Disturb every global RNG the build could lean on.
    mx.random.seed(987)
    mx.eval(mx.random.normal((17,)))
    np.random.seed(123)
    np.random.rand(5)
    second = dict(tree_flatten(zoo.build(family).parameters()))
    assert first.keys() == second.keys()
    for name in first:
        assert mx.array_equal(first[name], second[name]), name


@pytest.mark.parametrize("family", REQUIRED)
def test_a_different_seed_gives_different_weights(family):
    a = dict(tree_flatten(zoo.build(family, seed=0).parameters()))
    b = dict(tree_flatten(zoo.build(family, seed=1).parameters()))
    same = [n for n in a if a[n].ndim >= 2 and mx.array_equal(a[n], b[n])]
    assert same == []


@pytest.mark.parametrize("family", REQUIRED)
def test_weights_are_identical_on_every_machine(family):
    assert weight_hash(zoo.build(family)) == WEIGHT_HASHES[family]


@pytest.mark.parametrize("family", REQUIRED)
def test_each_family_gets_the_cache_types_it_claims(family):
    model = zoo.build(family)
    cache = make_prompt_cache(model)
    assert [cache_kind(c) for c in cache] == EXPECTED_CACHES[family]
    assert len(cache) == len(model.layers)
    # The sliding layers start writing over their oldest slot, keep none.
    assert all(c.keep == 0 for c in cache if isinstance(c, RotatingKVCache))


@pytest.mark.parametrize("family", REQUIRED)
def test_each_family_runs_a_cached_forward_of_the_right_shape(family):
    model = zoo.build(family)
    tokens = random_tokens(0, (2, 9))
    first, step = prefill_then_step(model, tokens, 8)
    assert first.shape == (2, 8, zoo.VOCAB_SIZE)
    assert step.shape == (2, 1, zoo.VOCAB_SIZE)
    assert mx.all(mx.isfinite(first)).item() and mx.all(mx.isfinite(step)).item()


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


def test_a_variant_the_cpu_cannot_run_is_refused_with_the_reason():
    if mx.default_device() != mx.cpu:
        pytest.skip("the refusal only applies on the CPU backend")
    with pytest.raises(ValueError, match="gather_mm"):
        zoo.build("qwen3_next", "bfloat16")
    zoo.build("qwen3_next", "bfloat16", bits=4)  # quantized experts are fine


@pytest.mark.parametrize(
    "kwargs",
    [
        {"family": "gpt9"},
        {"family": "llama", "dtype": "float64"},
        {"family": "llama", "bits": 7},  # mx.quantize takes 2, 3, 4, 5, 6 or 8
    ],
)
def test_an_unknown_family_dtype_or_bits_is_refused(kwargs):
    with pytest.raises(ValueError):
        zoo.build(**kwargs)


@given(st.text(max_size=40))
def test_tokenizer_round_trips_text(text):
    tok = zoo.tokenizer()
    assert tok.decode(tok.encode(text)) == text


TEXTS = ["hello wörld", "  leading spaces", "tab\tnew\nline", "emoji 🙂 ü ß 中文", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_the_loaded_tokenizer_round_trips_text_like_the_zoo_one(
    text, zoo_root, offline
):
    _, loaded = mlx_lm.load(str(zoo.checkpoint("llama", root=zoo_root)))
    ids = loaded.encode(text)
    assert ids == zoo.tokenizer().encode(text)
    assert loaded.decode(ids) == text


def test_the_tokenizer_is_pinned():
    tok = zoo.tokenizer()
    assert len(tok) == zoo.VOCAB_SIZE == 384
    assert tok.encode("hello wörld") == [334, 267, 195, 182, 114, 304]
    assert tok.encode("<eos>") == [tok.eos_token_id] == [378]
    assert tok.convert_ids_to_tokens(list(range(3))) == ["Ā", "ā", "Ă"]  # bytes 0-2


@pytest.mark.parametrize("family", REQUIRED)
def test_logits_are_varied_not_degenerate(family):
    model = zoo.build(family)
    tokens = random_tokens(2, (16, 16))
    logits = model(tokens)
    top = np.array(logits.argmax(-1))
    # Many different greedy tokens, rarely just the input token echoed.
    assert len(np.unique(top)) >= 0.4 * top.size
    assert (top == np.array(tokens)).mean() < 0.2
    # The greedy token depends on the context, not only on the last token.
    other = np.array(tokens)
    other[:, :-1] = np.random.RandomState(3).randint(0, zoo.VOCAB_SIZE, (16, 15))
    top_other = np.array(model(mx.array(other))[:, -1].argmax(-1))
    assert (top_other != top[:, -1]).mean() >= 0.5
    # Peaked enough to look like a language model, far from uniform.
    probs = mx.softmax(logits, axis=-1)
    assert 0.15 < probs.max(-1).mean().item() < 0.9


@pytest.mark.parametrize("family", REQUIRED)
def test_the_envelope_sees_what_a_multi_token_forward_does(family):
    """The backend fact the numeric contracts are judged by (treespec.numerics),
    checked directly for each zoo family inside the smallest sliding window
    (8): five tokens in one forward against five single steps. On the CPU's
    reference BLAS they are identical and the measured envelope is 0; on any
    backend, a difference seen here is seen by the envelope's own measurement
    (nonzero, and of the same size: within its bound)."""
    model = zoo.build(family)
    tokens = random_tokens(4, (1, 8))
    cache = make_prompt_cache(model)
    model(tokens[:, :3], cache=cache)
    together = model(tokens[:, 3:], cache=cache)
    cache = make_prompt_cache(model)
    model(tokens[:, :3], cache=cache)
    steps = mx.concatenate([model(tokens[:, i : i + 1], cache=cache) for i in range(3, 8)], axis=1)
    env = numerics.envelope(model, 3, range(1, 6))
    if regime() == "reference":
        assert mx.array_equal(together, steps)
        assert env.exact, env.line()
    same = mx.array_equal(together, steps).item()
    assert same or not env.exact, env.line()
    diff = float(mx.abs(together - steps).max())
    assert diff <= numerics.SAFETY * env.value, (diff, env.line())


def greedy_agreement(family, draft, seed):
    target = zoo.build(family)
    tokens = random_tokens(seed, (32, 16))
    agree = target(tokens).argmax(-1) == draft(tokens).argmax(-1)
    return agree.astype(mx.float32).mean().item()


@pytest.mark.parametrize("family", REQUIRED)
def test_the_default_drafter_agrees_with_its_target_only_partly(family):
    rate = greedy_agreement(family, zoo.drafter(family), seed=5)
    assert 0.3 <= rate <= 0.8, rate


def test_a_drafter_without_noise_is_its_target():
    tokens = random_tokens(6, (2, 10))
    draft = zoo.drafter("qwen3", noise=0.0)
    assert mx.array_equal(draft(tokens), zoo.build("qwen3")(tokens))


def test_more_drafter_noise_means_less_agreement():
    rates = [
        greedy_agreement("llama", zoo.drafter("llama", noise=n), seed=7)
        for n in (0.02, 0.13, 0.6)
    ]
    assert rates[0] > rates[1] > rates[2]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_drafter_checkpoint_loads_offline_with_identical_logits(
    family, zoo_root, offline
):
    path = zoo.drafter_checkpoint(family, root=zoo_root)
    loaded, _ = mlx_lm.load(str(path))
    tokens = random_tokens(8, (1, 9))
    built_first, built_step = prefill_then_step(zoo.drafter(family), tokens, 8)
    loaded_first, loaded_step = prefill_then_step(loaded, tokens, 8)
    assert mx.array_equal(built_first, loaded_first)
    assert mx.array_equal(built_step, loaded_step)
    target = zoo.build(family)(tokens[:, :8])
    assert not mx.array_equal(loaded_first, target)


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
