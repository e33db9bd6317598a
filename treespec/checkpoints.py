"""mlx-lm checkpoints: loading one by path with errors that name it, the
built-in trained pair, and the check that a target and its drafter share a
tokenizer."""

import json
import struct
from pathlib import Path
from typing import Optional

import mlx_lm

from .errors import UsageError
from .models import vocab_size

PAIR = Path(__file__).parent / "pair"
# The files a tokenizer can be built from (transformers' AutoTokenizer:
# fast, sentencepiece, BPE vocabularies, tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "tiktoken.model")
HEADER_LIMIT = 100_000_000  # the safetensors library refuses longer headers


def safetensors_problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a readable safetensors file, or None: read from
    its 8-byte header length and its JSON header (the layout every
    safetensors file starts with), never its tensors."""
    size = path.stat().st_size
    if size == 0:
        return "empty file (0 bytes)"
    if size < 8:
        return f"only {size} bytes: too short for a safetensors header (8-byte length first)"
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > size - 8:
            return (f"its header claims {length} bytes but the file has only {size}: "
                    "truncated (an incomplete download?) or not a safetensors file")
        if length > HEADER_LIMIT:
            return f"its header claims {length} bytes, more than safetensors allows"
        header = f.read(length)
    try:
        json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return f"its header is not UTF-8 JSON ({e}): a corrupt file or not safetensors"
    return None


def checkpoint_problem(p: Path) -> Optional[str]:
    """What in the checkpoint directory ``p`` mlx_lm.load would fail on, by
    file and cause, or None: its weights files' headers and its tokenizer."""
    for weights in sorted(p.glob("model*.safetensors")):  # mlx-lm's own pattern
        why = safetensors_problem(weights)
        if why:
            return f"{weights.name}: {why}"
    if not any((p / name).exists() for name in TOKENIZER_FILES) and not any(p.glob("*.tiktoken")):
        return (f"no tokenizer: none of {', '.join(TOKENIZER_FILES)} (or *.tiktoken) "
                "is in the directory")
    return None


def load_checkpoint(path, role: str, lazy: bool = False):
    """``mlx_lm.load(path)`` -> (model, tokenizer); ``role`` is the flag that
    named the path (``model``, ``draft-model``), for the error message.
    ``lazy``: weights read from disk only where something evaluates them."""
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").exists():
        raise UsageError(f"--{role} {path}: not an mlx-lm checkpoint directory "
                         "(no config.json there)")
    why = checkpoint_problem(p)
    if why:
        raise UsageError(f"--{role} {path}: {why}")
    try:
        return mlx_lm.load(str(p), lazy=lazy)
    except Exception as e:  # mlx-lm raises many kinds; name the path and role
        raise UsageError(f"--{role} {path}: mlx_lm.load failed: {type(e).__name__}: {e}")


DRAFTERS = {"default": "draft", "weak": "draft-weak"}


def default_pair(drafter: str = "default"):
    """The built-in pair, shipped in the package: a target and drafter trained
    on the Python standard library (treespec/pair/README.md). No downloads.
    ``drafter="weak"``: the second, weaker drafter of the same target
    (greedy agreement ~62% against the default's ~81%)."""
    if drafter not in DRAFTERS:
        raise UsageError(f"no built-in drafter {drafter!r}; known: {', '.join(DRAFTERS)}")
    return PAIR / "target", PAIR / DRAFTERS[drafter]


def load_default_pair(drafter: str = "default"):
    """(target, draft, tokenizer) of the built-in pair, through ``mlx_lm.load``."""
    target_path, draft_path = default_pair(drafter)
    target, tokenizer = mlx_lm.load(str(target_path))
    draft, _ = mlx_lm.load(str(draft_path))
    return target, draft, tokenizer


def vocab_difference(va: dict, vb: dict, show: int = 4) -> str:
    """The first entries (by the lower id) whose id differs between two
    token -> id maps, target's then draft's ('-' where a map lacks it)."""
    diff = [t for t in set(va) | set(vb) if va.get(t) != vb.get(t)]
    diff.sort(key=lambda t: (min(x for x in (va.get(t), vb.get(t)) if x is not None), t))
    shown = "; ".join(f"{t!r}: target {va.get(t, '-')}, draft {vb.get(t, '-')}"
                      for t in diff[:show])
    more = f" and {len(diff) - show} more" if len(diff) > show else ""
    return f"{len(diff)} of {len(set(va) | set(vb))} entries differ, first {shown}{more}"


def check_same_tokenizer(tok_a, tok_b, model_a, model_b):
    """Speculative decoding needs one vocabulary: the same token -> id map,
    and logits of the same width (read off a forward: configs nest it)."""
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va != vb:
        raise UsageError(f"the draft model's tokenizer differs from the target's: "
                         f"{vocab_difference(va, vb)}; speculative decoding needs one "
                         "shared tokenizer")
    ea, eb = vocab_size(model_a), vocab_size(model_b)
    if ea != eb:
        raise UsageError(f"vocabulary sizes differ: target {ea} logits, draft {eb}")
