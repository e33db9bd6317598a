"""On MLX CUDA, cuDNN attention rebuilds a graph for every new kv length
(treespec/backend/cuda.py): the command line turns it off unless told otherwise
and says so; the library warns. The CUDA backend is stood in for by the
``cuda`` argument or a patched ``cuda_backend``: this machine has none."""

import json
import os
import warnings

import pytest

from treespec.backend import cuda as cuda_env
from treespec import zoo
from treespec.cli.main import main
from treespec.backend.cuda import (
    CUDNN_SDPA,
    CudnnAttentionWarning,
    cudnn_attention_on,
    describe,
    prefer_mlx_attention,
    warn_if_cudnn_attention,
)
from treespec.decoding import decode


def test_on_cuda_the_command_line_turns_cudnn_attention_off_when_unset():
    env = {}
    note = prefer_mlx_attention(env, cuda=True)
    assert env == {CUDNN_SDPA: "0"}
    assert CUDNN_SDPA in note and "kv length" in note


@pytest.mark.parametrize("value", ["1", "0", ""])
def test_a_setting_the_caller_made_is_left_alone(value):
    env = {CUDNN_SDPA: value}
    assert prefer_mlx_attention(env, cuda=True) is None
    assert env == {CUDNN_SDPA: value}


def test_off_cuda_nothing_is_set_or_reported():
    env = {}
    assert prefer_mlx_attention(env, cuda=False) is None and env == {}
    assert describe(env, cuda=False) is None
    assert warn_if_cudnn_attention(env, cuda=False) is False


@pytest.mark.parametrize("value,on", [(None, True), ("", True), ("0", False), (" 0 ", False),
                                      ("1", True), ("2", True)])
def test_the_variable_reads_as_mlx_reads_it(value, on):
    env = {} if value is None else {CUDNN_SDPA: value}
    assert cudnn_attention_on(env) is on
    line = describe(env, cuda=True)
    assert line.startswith("cuDNN attention ON" if on else "cuDNN attention off")


def test_speculative_decoding_warns_when_cudnn_attention_is_on(monkeypatch):
    monkeypatch.setattr(cuda_env, "cuda_backend", lambda: True)
    monkeypatch.delenv(CUDNN_SDPA, raising=False)
    target, draft = zoo.build("llama"), zoo.drafter("llama")
    with pytest.warns(CudnnAttentionWarning, match=CUDNN_SDPA):
        decode(target, [1, 2, 3], "chain", draft_model=draft, max_tokens=4, gate=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudnnAttentionWarning)
        decode(target, [1, 2, 3], "classic", max_tokens=4)  # one query token: not affected
        monkeypatch.setenv(CUDNN_SDPA, "0")
        decode(target, [1, 2, 3], "chain", draft_model=draft, max_tokens=4, gate=False)


def test_the_command_line_sets_it_before_decoding_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(cuda_env, "cuda_backend", lambda: True)
    monkeypatch.delenv(CUDNN_SDPA, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudnnAttentionWarning)  # set before decode's check
        assert main(["generate", "--mode", "chain", "--max-tokens", "4", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["tokens"]
    assert f"{CUDNN_SDPA}=0 set by treespec" in out.err
    assert os.environ[CUDNN_SDPA] == "0"
