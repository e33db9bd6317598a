"""The built-in trained pair (treespec/pair): a target and a drafter trained
on the Python standard library by treespec/pair/train.py.

Pinned here: both open with `mlx_lm.load` with no network; they share the
zoo's tokenizer byte for byte; on held-out text (whole lines of stdlib files
that the training split never saw, committed as heldout_sample.json) the
target predicts better than the drafter, the drafter far better than a
uniform guess over the vocabulary, the drafter picks the target's greedy
token often, and all of it reproduces what the training run recorded in
metrics.json. The losses are computed here, independently of the script.
"""

import hashlib
import json
import math
import socket
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, make_prompt_cache

import treespec
from treespec import zoo

PAIR = Path(treespec.__file__).resolve().parent / "pair"
ROLES = ("target", "draft", "draft-weak")
DRAFTERS = ROLES[1:]
UNIFORM = math.log(zoo.VOCAB_SIZE)  # nats/token of a uniform guess


def recorded(drafter="draft"):
    """What the training run recorded: the pair's metrics.json, or the weak
    drafter's own (treespec/pair/train.py train-draft)."""
    name = "metrics.json" if drafter == "draft" else f"{drafter}-metrics.json"
    return json.loads((PAIR / name).read_text())


def sample():
    return json.loads((PAIR / "heldout_sample.json").read_text())


@pytest.fixture(scope="module")
def loaded():
    """Both checkpoints through mlx_lm.load, with the hub told it is offline
    and every socket connection refused."""

    def refuse(*args, **kwargs):
        raise OSError("network access attempted while offline")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "create_connection", refuse)
        mp.setattr(socket, "getaddrinfo", refuse)
        return {role: mlx_lm.load(str(PAIR / role)) for role in ROLES}


def next_token_stats(model, ids):
    """Summed next-token cross entropy (float32 log-softmax) and argmax."""
    logits = model(mx.array([ids]))[0, :-1].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    y = mx.array(ids[1:])
    nll = -mx.take_along_axis(logp, y[:, None], axis=-1).sum()
    return nll.item(), np.array(mx.argmax(logits, axis=-1))


@pytest.fixture(scope="module")
def heldout(loaded):
    """Losses of every model and each drafter's greedy agreement with the
    target over the held-out sample: each segment tokenized on its own, cut
    to max_tokens, one forward. {drafter: {target_loss, draft_loss,
    greedy_agreement, tokens}}."""
    s = sample()
    tok = loaded["target"][1]
    sums = {role: 0.0 for role in ROLES}
    agree = {d: 0 for d in DRAFTERS}
    tokens = 0
    for seg in s["segments"]:
        ids = tok.encode(seg["text"])[: s["max_tokens"]]
        greedy = {}
        for role in ROLES:
            nll, greedy[role] = next_token_stats(loaded[role][0], ids)
            sums[role] += nll
        for d in DRAFTERS:
            agree[d] += int((greedy["target"] == greedy[d]).sum())
        tokens += len(ids) - 1
    return {d: {"target_loss": sums["target"] / tokens, "draft_loss": sums[d] / tokens,
                "greedy_agreement": agree[d] / tokens, "tokens": tokens} for d in DRAFTERS}


def test_both_checkpoints_load_offline_as_llama_with_kv_caches(loaded):
    for role in ROLES:
        model, tok = loaded[role]
        cfg = json.loads((PAIR / role / "config.json").read_text())
        assert cfg["model_type"] == "llama" and cfg["vocab_size"] == zoo.VOCAB_SIZE
        caches = make_prompt_cache(model)
        assert len(caches) == cfg["num_hidden_layers"]
        assert all(type(c) is KVCache for c in caches), role
        out = model(mx.array([[1, 2, 3]]))
        assert out.shape == (1, 3, zoo.VOCAB_SIZE)


def test_the_target_is_the_bigger_model_and_both_fit_the_size_budget(loaded):
    params = {r: sum(v.size for _, v in tree_flatten(loaded[r][0].parameters())) for r in ROLES}
    assert params["target"] > 4 * params["draft"], params
    assert params["draft"] > params["draft-weak"], params
    for role in ROLES:
        dtypes = {v.dtype for _, v in tree_flatten(loaded[role][0].parameters())}
        assert dtypes == {mx.float16}, (role, dtypes)
    # The hidden-state heads (head-*/, heads-*: issue 44) have a budget of their own.
    heads = [f for f in PAIR.rglob("*") if f.is_file() and f.relative_to(PAIR).parts[0].startswith("head")]
    total = sum(f.stat().st_size for f in PAIR.rglob("*") if f.is_file() and f not in heads)
    assert total < 8_000_000, f"treespec/pair holds {total} bytes"
    for name in ("head-mtp", "head-eagle3"):
        size = sum(f.stat().st_size for f in (PAIR / name).iterdir())
        assert size < 2_000_000, f"treespec/pair/{name} holds {size} bytes"


def test_both_share_the_zoo_tokenizer_byte_for_byte(loaded, tmp_path):
    zoo.save_tokenizer(tmp_path)
    for role in ROLES:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            assert (PAIR / role / name).read_bytes() == (tmp_path / name).read_bytes(), (role, name)
    tt, td = loaded["target"][1], loaded["draft"][1]
    assert tt.get_vocab() == td.get_vocab() == zoo.tokenizer().get_vocab()
    assert list(tt.eos_token_ids) == list(td.eos_token_ids) == [zoo.token_id("<eos>")]
    text = "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # grüße\n"
    assert tt.encode(text) == td.encode(text)
    assert tt.decode(tt.encode(text)) == text


def test_the_heldout_sample_comes_from_heldout_files_only():
    """The split rule, recomputed: a stdlib file is held out iff the sha256
    of its relative path is 0 mod 20. Training never saw these files."""
    s = sample()
    assert s["rule"] == "sha256(relpath) % 20 == 0"
    for seg in s["segments"]:
        h = int.from_bytes(hashlib.sha256(seg["file"].encode()).digest()[:8], "big")
        assert h % 20 == 0, seg["file"]
    assert len({seg["file"] for seg in s["segments"]}) == len(s["segments"])


@pytest.mark.slow
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_the_target_beats_the_drafter_and_both_beat_uniform_on_heldout_text(heldout, drafter):
    h = heldout[drafter]
    assert 2000 <= h["tokens"] <= 4000, h
    # Measured on an H200 and on this CPU: target 0.82, drafter 1.09, weak
    # drafter 1.84 nats/token, uniform 5.95. Margins well inside those gaps,
    # far outside float noise.
    assert h["target_loss"] < h["draft_loss"] - 0.15, h
    assert h["draft_loss"] < UNIFORM - 3.0, h
    assert h["target_loss"] < 1.0, h


@pytest.mark.slow
def test_the_drafter_often_picks_the_targets_greedy_token(heldout):
    assert heldout["draft"]["greedy_agreement"] > 0.7, heldout


@pytest.mark.slow
def test_the_weak_drafter_agrees_with_the_target_in_the_gemma_pairs_regime(heldout):
    """The second drafter stands for a pair like the reference record's
    Gemma 4 one (greedy agreement 60-70%): clearly below the default's."""
    weak = heldout["draft-weak"]["greedy_agreement"]
    assert 0.55 < weak < 0.72, weak
    assert weak < heldout["draft"]["greedy_agreement"] - 0.1, heldout


@pytest.mark.slow
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_heldout_figures_reproduce_what_the_training_run_recorded(heldout, drafter):
    """The metrics files hold the training machine's own evaluation of the
    saved float16 checkpoints on this sample; a different backend moves it
    only by float noise, a damaged or swapped checkpoint by far more."""
    rec, h = recorded(drafter)["sample"], heldout[drafter]
    assert h["tokens"] == rec["tokens"]
    for key in ("target_loss", "draft_loss"):
        assert h[key] == pytest.approx(rec[key], abs=0.01), key
    assert h["greedy_agreement"] == pytest.approx(rec["greedy_agreement"], abs=0.01)
