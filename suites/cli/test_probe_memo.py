"""The exactness probe's verdict on disk (treespec.evidence.gate_memo): a second run
reads it instead of probing, a file that is not exactly this probe's is
ignored with a note and never trusted, and the probe's cost is reported
when it is paid."""

import json
import shutil
from pathlib import Path
import re

import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from treespec.evidence import gate, gate_memo
from treespec import zoo
from treespec.cli.main import main
from treespec.kv_options import ProbeCache

SHAPES = [(-1,), (-1, 0), (-1, 0, 0)]


@pytest.fixture
def memo_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TREESPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gate, "_MEMO", {})  # a fresh process, as far as the gate can tell
    return tmp_path / "gate"


@pytest.fixture(scope="module")
def model():
    return zoo.build("llama")


def new_process(monkeypatch):
    monkeypatch.setattr(gate, "_MEMO", {})


def no_probing(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("probed again")
    monkeypatch.setattr(gate, "compare_shape", refuse)


def test_a_second_run_reads_the_verdict_instead_of_probing(memo_dir, model, monkeypatch):
    first = gate.probe(model, SHAPES)
    assert first.source == "measured" and first.seconds > 0
    assert first.memo and list(memo_dir.glob("*.json")) == [Path(first.memo)]
    new_process(monkeypatch)
    no_probing(monkeypatch)
    second = gate.probe(model, SHAPES)
    assert second.source == "disk memo" and second.seconds == 0
    assert second.shapes == first.shapes and second.key == first.key


def _spoil_json(d):
    return "{"


def _format(d):
    d["format"] = "something-else/1"


def _weights(d):
    d["expect"]["keyed"]["weights"] = "0" * 16


def _code(d):
    d["expect"]["treespec_source"] = "0" * 16


def _wrong_type(d):
    d["results"][0]["identical"] = "yes"


def _other_shape(d):
    d["results"][1]["shape"] = [-1, 0, 0, 0]


def _missing(d):
    d["results"].pop()


SPOILED = {"not JSON": (_spoil_json, "corrupt"), "another format": (_format, "not a"),
           "other weights": (_weights, "differs in keyed"),
           "other code": (_code, "differs in treespec_source"),
           "a wrong type": (_wrong_type, "wrong type"),
           "another shape": (_other_shape, "for shape [-1, 0, 0, 0]"),
           "a missing result": (_missing, "do not cover the shapes")}


@pytest.mark.parametrize("spoil,why", SPOILED.values(), ids=SPOILED.keys())
def test_a_file_that_is_not_exactly_this_probes_is_ignored_with_a_note(
        memo_dir, model, monkeypatch, spoil, why):
    first = gate.probe(model, SHAPES)
    path = Path(first.memo)
    data = json.loads(path.read_text())
    spoiled = spoil(data)
    path.write_text(spoiled if isinstance(spoiled, str) else json.dumps(data))
    new_process(monkeypatch)
    notes = []
    again = gate.probe(model, SHAPES, note=notes.append)
    assert again.source == "measured" and again.shapes == first.shapes
    assert len(notes) == 1 and str(path) in notes[0] and why in notes[0], notes
    # ... and the measurement replaced it: the next run reads it back
    new_process(monkeypatch)
    no_probing(monkeypatch)
    assert gate.probe(model, SHAPES).source == "disk memo"


def test_another_version_of_treespec_probes_again(memo_dir, model, monkeypatch):
    gate.probe(model, SHAPES)
    new_process(monkeypatch)
    monkeypatch.setattr(gate_memo, "source_digest", lambda: "another-commit")
    assert gate.probe(model, SHAPES).source == "measured"


def test_a_callers_own_adapter_is_never_stored(memo_dir, model):
    p = gate.probe(model, SHAPES, adapter_name="my.module:adapter")
    assert p.memo is None and not memo_dir.exists()


def test_the_probe_runs_in_the_runs_cache_mode(memo_dir):
    model = zoo.build("qwen3")
    plain = gate.probe(model, SHAPES)
    quantized = gate.probe(model, SHAPES, cache=ProbeCache(kv_bits=8, kv_group_size=32))
    assert quantized.key != plain.key and quantized.config["kv_quant"] == "8bit/g32"
    state = ProbeCache(kv_bits=8, kv_group_size=32).prefilled(model, [1, 2, 3])
    assert {type(c) for c in state} == {QuantizedKVCache}
    assert {type(c) for c in ProbeCache().prefilled(model, [1, 2, 3])} == {KVCache}


TIMES = re.compile(r"gate: exact, probe (.*)$", re.M)


def test_the_command_line_reports_the_probe_when_it_pays_for_it(memo_dir, capsys, monkeypatch):
    assert main(["generate", "-m", "4"]) == 0
    first = TIMES.search(capsys.readouterr().out).group(1)
    assert re.fullmatch(r"[\d.]+ s \(memoized\)", first), first
    new_process(monkeypatch)
    no_probing(monkeypatch)
    assert main(["generate", "-m", "4"]) == 0
    assert TIMES.search(capsys.readouterr().out).group(1) == "read from its memo"


def test_the_source_digest_covers_every_module_of_the_package(tmp_path):
    """A stored verdict is this code's only if every treespec module is the
    one it was measured with: the verify, the caches and the drafters decide
    it as much as the gate does (the digest once covered treespec/evidence/
    alone). Edited in a copy: a module outside evidence/ moves the digest."""
    assert (gate_memo.PACKAGE / "decoding.py").exists() and (gate_memo.PACKAGE / "verify").is_dir()
    copy = tmp_path / "treespec"
    shutil.copytree(gate_memo.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    digest = gate_memo.source_digest.__wrapped__  # unmemoized: the copy changes
    before = digest(copy)
    assert before == gate_memo.source_digest()
    adapter = copy / "verify" / "adapter.py"
    adapter.write_text(adapter.read_text() + "\n# edited\n")
    assert digest(copy) != before
