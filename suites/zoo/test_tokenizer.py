"""The zoo tokenizer: it round-trips text, is pinned, and loads from a saved
checkpoint through mlx-lm as the same tokenizer."""

import mlx_lm
import pytest
from hypothesis import given
from hypothesis import strategies as st

from treespec import zoo

pytestmark = pytest.mark.exactness


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
