"""mlx-lm checkpoints: loading one by path with errors that name it, the
built-in trained pair, and the check that a target and its drafter share a
tokenizer."""

from pathlib import Path

import mlx_lm

from .errors import UsageError
from .models import vocab_size

PAIR = Path(__file__).parent / "pair"


def load_checkpoint(path, role: str):
    """``mlx_lm.load(path)`` -> (model, tokenizer); ``role`` is the flag that
    named the path (``model``, ``draft-model``), for the error message."""
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").exists():
        raise UsageError(f"--{role} {path}: not an mlx-lm checkpoint directory "
                         "(no config.json there)")
    try:
        return mlx_lm.load(str(p))
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


def check_same_tokenizer(tok_a, tok_b, model_a, model_b):
    """Speculative decoding needs one vocabulary: the same token -> id map,
    and logits of the same width (read off a forward: configs nest it)."""
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va != vb:
        only = sorted(set(va) ^ set(vb))[:5]
        raise UsageError(f"the draft model's tokenizer differs from the target's "
                         f"({len(va)} vs {len(vb)} entries; e.g. {only}); speculative "
                         f"decoding needs one shared tokenizer")
    ea, eb = vocab_size(model_a), vocab_size(model_b)
    if ea != eb:
        raise UsageError(f"vocabulary sizes differ: target {ea} logits, draft {eb}")
