"""The zoo's tokenizer: byte-level BPE (the GPT-2/Qwen/Llama-3 kind), its
merges learned locally by a deterministic trainer from a fixed text, so the
same bytes come out on every machine."""

import json
from functools import lru_cache
from pathlib import Path
from typing import Union

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

# ---------------------------------------------------------------------------
# Tokenizer: byte-level BPE, the GPT-2/Qwen/Llama-3 kind, built locally.
# ---------------------------------------------------------------------------

VOCAB_SIZE = 384
SPECIAL_TOKENS = (
    "<pad>",
    "<bos>",
    "<eos>",
    "<|reserved_0|>",
    "<|reserved_1|>",
    "<|reserved_2|>",
    "<|reserved_3|>",
    "<|reserved_4|>",
)
# 256 byte tokens + merges + specials == VOCAB_SIZE exactly, so the model's
# vocab and the tokenizer's agree and no id decodes to nothing.
NUM_MERGES = VOCAB_SIZE - 256 - len(SPECIAL_TOKENS)

# The merges are learned from this text by a tiny deterministic BPE trainer
# below (not the `tokenizers` trainer, whose tie-breaking may change between
# versions): the same text always gives the same merges.
CORPUS = """\
The target model verifies a whole tree of draft tokens in one forward pass.
Each node sees the history and its own ancestors, never its siblings; the
accepted branch is the longest root path the target agrees with, and every
cache is rolled back to that branch before the next round begins. When the
draft is wrong the target still emits one token, so no round is ever wasted.
A sliding window forgets old positions, a recurrent state forgets nothing but
cannot be rewound, and a quantized cache keeps its scales next to its values.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea
shore, and the shells she sells are surely sea shells. In the beginning there
was the word, and then there were the tokens, and then the logits, and then
the argmax. Hello world, hello wörld, grüße aus München, café au lait, naïve
façade; 1234567890 + 2468 = 1237036358. def main(): return print("hello")
"""

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


def _bytes_to_unicode():
    """GPT-2's byte -> printable unicode char map (what ByteLevel uses)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _train_merges(words, num_merges):
    """Greedy BPE: merge the most frequent adjacent pair, ties broken by the
    pair itself, until `num_merges` new tokens exist."""
    words = {tuple(w): c for w, c in words.items()}
    merges, new_tokens = [], set()
    while len(new_tokens) < num_merges:
        counts = {}
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + c
        if not counts:
            raise ValueError("corpus too small for the requested merges")
        pair = min(counts, key=lambda p: (-counts[p], p))
        merges.append(pair)
        new_tokens.add(pair[0] + pair[1])
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    return merges, new_tokens


@lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """The tokenizer.json text; the single source of the tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = {}
    for word, _ in pre.pre_tokenize_str(CORPUS):
        words[word] = words.get(word, 0) + 1
    merges, _ = _train_merges(words, NUM_MERGES)

    # Byte tokens take ids 0..255 in byte order, merged tokens follow in merge
    # order, special tokens close the vocabulary.
    vocab = {ch: b for b, ch in sorted(_bytes_to_unicode().items())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    assert len(vocab) == 256 + NUM_MERGES, len(vocab)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    assert tok.get_vocab_size() == VOCAB_SIZE
    return tok.to_str()


def _tokenizer_config() -> dict:
    # Written by hand (not by save_pretrained) so the file does not depend on
    # the installed transformers version. No BOS is prepended on encode
    # (Qwen-style), so decode(encode(text)) == text.
    added = {
        str(256 + NUM_MERGES + i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "model_max_length": 1 << 20,
        "pad_token": PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def token_id(token: str) -> int:
    """Id of a special token, e.g. ``token_id("<eos>")``."""
    return 256 + NUM_MERGES + SPECIAL_TOKENS.index(token)


def tokenizer():
    """A fresh transformers tokenizer (PreTrainedTokenizerFast) for the zoo."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json()),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(path: Union[str, Path]) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    with open(path / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(_tokenizer_config(), f, indent=2, ensure_ascii=False)
