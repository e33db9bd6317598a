"""Messages say what happened: NaN logits are reported as NaN (not as a
difference of 0), and a checkpoint that cannot be read names the file and
the cause (an empty or truncated weights file, a header that is not JSON, a
missing tokenizer) instead of a decoder error or a sentencepiece hint."""

import math
import shutil
import struct

import mlx.core as mx
import pytest

from suites.audit.helpers_defects import refuses_every_verify
from suites.guards import helpers as guard_helpers
from treespec import decode, zoo
from treespec.checkpoints import load_checkpoint
from treespec.errors import UsageError
from treespec.evidence.gate import decide, probe

pytestmark = pytest.mark.exactness


def test_nan_logits_are_declined_and_reported_as_nan():
    model = zoo.build("llama")
    model.model.embed_tokens.weight = mx.full(model.model.embed_tokens.weight.shape, math.nan)
    shapes = [(-1,), (-1, 0)]
    p = probe(model, shapes)
    assert all(math.isnan(s.max_abs_diff) for s in p.shapes) and math.isnan(p.max_abs_diff)
    decision = decide(model, shapes)
    assert not decision.run
    assert "max |diff| nan" in decision.reason and "max |diff| 0" not in decision.reason


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(zoo.checkpoint("llama"), path)
    return path


def weights(path):
    return path / "model.safetensors"


def corrupt_header(path):
    data = weights(path).read_bytes()
    weights(path).write_bytes(data[:8] + b"\xff\xfe" + data[10:])


def json_garbage(path):
    body = b"this is not json"
    weights(path).write_bytes(struct.pack("<Q", len(body)) + body)


def truncate(path):
    weights(path).write_bytes(weights(path).read_bytes()[:1000])


def empty(path):
    weights(path).write_bytes(b"")


def few_bytes(path):
    weights(path).write_bytes(b"\x01\x02\x03")


def header_too_long(path):
    weights(path).write_bytes(struct.pack("<Q", 10**15) + b"{}")


@pytest.mark.parametrize("damage, cause", [
    (corrupt_header, r"header is not .*JSON"),
    (json_garbage, r"header is not .*JSON"),
    (truncate, r"header.*2\d\d\d bytes.*only 1000"),
    (header_too_long, r"header.*1000000000000000 bytes"),
    (empty, r"empty"),
    (few_bytes, r"3 bytes"),
])
def test_an_unreadable_weights_file_is_named_with_its_cause(checkpoint, damage, cause):
    damage(checkpoint)
    with pytest.raises(UsageError, match=r"--model .*model\.safetensors: .*" + cause) as err:
        load_checkpoint(checkpoint, "model")
    assert "UnicodeDecodeError" not in str(err.value)
    assert "Unable to read" not in str(err.value)


def test_a_missing_tokenizer_is_named_as_missing(checkpoint):
    (checkpoint / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match=r"--draft-model .*no tokenizer.*tokenizer\.json") as err:
        load_checkpoint(checkpoint, "draft-model")
    assert "sentencepiece" not in str(err.value)


def test_an_intact_checkpoint_still_loads(checkpoint):
    model, tokenizer = load_checkpoint(checkpoint, "model")
    assert tokenizer.encode("import os") and model.layers


@pytest.mark.parametrize("mode", [dict(mode="chain", block=3), dict(mode="tree", budget=4)])
def test_an_adapter_refusing_what_the_run_would_verify_is_a_decline_not_an_exception(mode):
    """A refusal met by the gate's probe (an adapter, or a backend, that will
    not verify the run's shapes) ends in a decline saying why, and the text is
    classic decoding's; it escaped decode as a TreeRefused."""
    target = guard_helpers.model()
    adapter = refuses_every_verify(target)
    ids = guard_helpers.prompt(6)
    result = decode(target, ids, draft_model=guard_helpers.drafter(), max_tokens=8,
                    adapter=adapter, adapter_name="refuses_every_verify", **mode)
    gate = result.stats.summary()["gate"]
    assert result.stats.mode == f"classic (declined {mode['mode']})"
    assert "the adapter refuses a shape this run would verify: planted" in gate["reason"]
    assert result.tokens == decode(target, ids, mode="classic", max_tokens=8).tokens
