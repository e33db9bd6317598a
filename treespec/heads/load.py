"""``--draft-head``: a hidden-state head for a target, checked before it loads.

``spec`` is ``"mtp"`` (the MTP module inside the target's own checkpoint) or
a head directory: a speculators EAGLE-3 head (``speculators_model_type:
eagle3``) or an MTP-only directory (``model_type: <family>_mtp`` with the
target's ``text_config``, weights without the ``mtp.`` prefix: the layout
mlx-vlm's MTP split writes). Every misfit (hidden size, vocabulary, layer
ids, missing tensors, an unknown format) is an :class:`OptionError` naming
the flag and the reason, raised after reading files and before any module is
built; nothing about the target is touched either way.
"""

from pathlib import Path
from typing import Dict

import mlx.core as mx
import mlx.nn as nn

from ..errors import OptionError
from . import eagle3, mtp
from .files import read_file, read_prefixed
from .target import TargetView, view

__all__ = ["load_head", "FLAG"]

FLAG = "--draft-head"


def _refuse(flag: str, spec: str, reason: str):
    # "--draft-head X" for the command line, "draft_head=X" for a keyword.
    sep = "" if flag.endswith("=") else " "
    raise OptionError(f"{flag}{sep}{spec}: {reason}")


def load_head(spec: str, target_model: nn.Module, target_dir=None, *, flag: str = FLAG):
    """The head ``spec`` names, for ``target_model`` loaded from ``target_dir``."""
    try:
        t = view(target_model)
    except ValueError as e:
        _refuse(flag, spec, str(e))
    if spec == "mtp":
        return _checkpoint_mtp(spec, t, target_dir, flag)
    path = Path(spec)
    if not path.is_dir():
        _refuse(flag, spec, "neither 'mtp' (the target checkpoint's own MTP module) nor a head directory")
    config = eagle3.read_config(path)
    if config is None:
        _refuse(flag, spec, "the head directory has no config.json")
    if config.get("speculators_model_type") == eagle3.TYPE:
        return _eagle3(spec, path, config, t, flag)
    kind = str(config.get("model_type", ""))
    if kind.endswith("_mtp"):
        return _dir_mtp(spec, path, config, kind[: -len("_mtp")], t, flag)
    _refuse(flag, spec, f"unknown head format (config.json has speculators_model_type "
                        f"{config.get('speculators_model_type')!r}, model_type {kind!r}; "
                        f"known: speculators eagle3, <family>_mtp)")


# ---------------------------------------------------------------------------
# MTP
# ---------------------------------------------------------------------------


def _checkpoint_mtp(spec, t: TargetView, target_dir, flag):
    if target_dir is None:
        _refuse(flag, spec, "the target's checkpoint directory is not known, so its mtp.* tensors cannot be read")
    raw, formats = read_prefixed(Path(target_dir), mtp.PREFIX)
    if not raw:
        _refuse(flag, spec, f"the target checkpoint {target_dir} holds no mtp.* tensors "
                            "(a converted checkpoint may have dropped them; use the original release)")
    return _mtp(spec, raw, formats, t, t.family, t.args, flag)


def _dir_mtp(spec, path: Path, config: dict, family: str, t: TargetView, flag):
    if family != t.family:
        _refuse(flag, spec, f"an MTP head for model_type {family!r}, the target is {t.family!r}")
    text = config.get("text_config") or {}
    for key, have in (("hidden_size", t.hidden_size), ("vocab_size", t.vocab_size)):
        if key in text and int(text[key]) != have:
            _refuse(flag, spec, f"its text_config {key} is {text[key]}, the target's is {have}")
    raw, formats = {}, {}
    for p in sorted(path.glob("model*.safetensors")):
        weights, fmt = read_file(p)
        for name, value in weights.items():
            key = name if name.startswith(mtp.PREFIX) else mtp.PREFIX + name
            raw[key], formats[key] = value, fmt
    if not raw:
        _refuse(flag, spec, "the head directory holds no model*.safetensors tensors")
    return _mtp(spec, raw, formats, t, family, t.args, flag)


def _mtp(spec, raw: Dict[str, mx.array], formats, t: TargetView, family, args, flag):
    if family not in mtp.FAMILIES:
        _refuse(flag, spec, f"no MTP layer for the target's model_type {family!r} "
                            f"(known: {', '.join(mtp.FAMILIES)})")
    fc = raw.get(mtp.PREFIX + "fc.weight")
    if fc is None:
        _refuse(flag, spec, "its MTP tensors have no mtp.fc.weight")
    if tuple(fc.shape) != (t.hidden_size, 2 * t.hidden_size):
        _refuse(flag, spec, f"mtp.fc.weight is {tuple(fc.shape)}, a target of hidden size "
                            f"{t.hidden_size} needs ({t.hidden_size}, {2 * t.hidden_size})")
    try:
        weights = mtp.mtp_weights(raw, formats, family)
        head = mtp.MTPHead(family, args, t)
        return head.load(weights)
    except ValueError as e:
        _refuse(flag, spec, f"its MTP tensors do not fit a {family} MTP layer of this target: {e}")


# ---------------------------------------------------------------------------
# EAGLE-3
# ---------------------------------------------------------------------------


def _eagle3(spec, path: Path, config: dict, t: TargetView, flag):
    for key in ("transformer_layer_config", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids"):
        if key not in config:
            _refuse(flag, spec, f"its speculators config has no {key}")
    layer = config["transformer_layer_config"]
    th = int(config.get("target_hidden_size") or layer.get("hidden_size", 0))
    if th != t.hidden_size:
        _refuse(flag, spec, f"target_hidden_size is {th}, the target's hidden size is {t.hidden_size}")
    if "vocab_size" in layer and int(layer["vocab_size"]) != t.vocab_size:
        _refuse(flag, spec, f"its vocabulary is {layer['vocab_size']} tokens, the target's is {t.vocab_size}")
    ids = config["eagle_aux_hidden_state_layer_ids"]
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= t.num_layers]
    if bad:
        _refuse(flag, spec, f"eagle_aux_hidden_state_layer_ids {list(ids)}: {bad} outside the target's "
                            f"layers (ids count hidden states: 1..{t.num_layers} are the outputs of its "
                            f"{t.num_layers} decoder layers)")
    _, weights = eagle3.read_dir(path)
    if not weights:
        _refuse(flag, spec, "the head directory holds no model*.safetensors tensors")
    draft = int(config["draft_vocab_size"])
    head_rows = weights.get("lm_head.weight")
    if head_rows is not None and head_rows.shape[0] != draft:
        _refuse(flag, spec, f"lm_head has {head_rows.shape[0]} rows, draft_vocab_size is {draft}")
    d2t = weights.get("d2t")
    if d2t is None and draft != t.vocab_size:
        _refuse(flag, spec, f"a draft vocabulary of {draft} tokens needs d2t to map it to the target's {t.vocab_size}")
    if d2t is not None:
        _check_d2t(spec, d2t, weights.get("t2d"), draft, t.vocab_size, flag)
    embed = weights.get("embed_tokens.weight")
    h = int(layer.get("hidden_size", 0))
    if embed is None and h != t.hidden_size:
        _refuse(flag, spec, f"its hidden size {h} differs from the target's {t.hidden_size} and it has "
                            "no embed_tokens of its own to use instead of the target's")
    try:
        head = eagle3.Eagle3Head(config, t, own_embedding=embed is not None)
        return head.load(weights)
    except (ValueError, KeyError, TypeError) as e:
        _refuse(flag, spec, f"its tensors do not fit its config: {e}")


def _check_d2t(spec, d2t, t2d, draft, vocab, flag):
    if tuple(d2t.shape) != (draft,):
        _refuse(flag, spec, f"d2t has shape {tuple(d2t.shape)}, draft_vocab_size is {draft}")
    targets = (mx.arange(draft) + d2t.astype(mx.int64)).tolist()
    if min(targets) < 0 or max(targets) >= vocab:
        _refuse(flag, spec, f"d2t maps draft ids outside the target's {vocab}-token vocabulary")
    if len(set(targets)) != draft:
        _refuse(flag, spec, "d2t maps two draft ids to one target id")
    if t2d is not None:
        held = sorted(i for i, v in enumerate(t2d.tolist()) if v)
        if tuple(t2d.shape) != (vocab,) or held != sorted(targets):
            _refuse(flag, spec, "t2d does not mark exactly the target ids d2t maps to")
