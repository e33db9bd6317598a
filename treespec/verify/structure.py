"""What a model must look like to verify a tree, checked on the model itself.

No list of family names: a model is accepted when its structure is one the
tree verify handles, and refused with the specific reason otherwise:

- every cache ``make_prompt_cache`` gives it (CacheList entries included)
  is a mode treespec.caches knows: an attention cache a tree mask can
  replace, or an ``ArraysCache`` a recurrent mixer receives on its own
  (treespec.mixers; an attention that keeps a recurrent state of its own is
  refused by name);
- every rope (``rope`` or ``rotary_emb`` of an attention, outside the
  mixers) is a class known to take a vector of per-node offsets
  (treespec.verify.attention.TREE_ROPES); an attention without a rope is
  fine (NoPE: no position to give it);
- no function a forward runs computes positions itself (arange, or
  mx.fast.rope outside a rope module: treespec.verify.codescan), unless a
  stand-in of treespec.verify.positions re-indexes exactly those values.

The run-time half of the same checks is the probe of every injected verify
(the mask, the ropes and the position stand-ins were reached) and the
exactness probe of treespec.evidence.gate.
"""

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from ..caches import leaves, mode_of
from ..mixers import Discovery, discover, slots
from .attention import ROPE_ATTRS, rope_owners, rope_refusal
from .audited import record_note
from .codescan import positional_code
from .positions import HANDLED, position_inputs
from .strategy import TREE

__all__ = ["Family", "Structure", "structure"]


@dataclass(frozen=True)
class Family:
    """What the adapter found out about a model."""

    # Kind of recurrent strategy (a key of treespec.verify.strategy's
    # registry), None when the model has no recurrent cache.
    recurrent: Optional[str] = None
    # Attribute of the attention modules holding the RoPE.
    rope_attr: str = "rope"
    # Its audit record, or why it has none (treespec.verify.audited).
    record: str = "structurally accepted, no audit record"
    # Whether some module receives per-position values (treespec.verify.positions).
    positions: bool = False


class Structure(NamedTuple):
    """What :func:`structure` found, with what it walked to find it, so that
    the adapter built from it does not walk the model again for the same."""

    family: Family
    found: Discovery  # where the recurrent mixers are
    why: Optional[str]  # the first structural reason it cannot verify a tree, or None
    walked: list  # mixers.slots(model)
    positions: list  # position_inputs(model, walked)
    owners: List[tuple]  # (name, module) of every rope owner, outside the mixers


def _where(where) -> str:
    return f"layer {where[0]}" + "".join(f", CacheList entry {j}" for j in where[1:])


def cache_refusal(model: nn.Module) -> Tuple[Optional[str], bool]:
    """(why its caches cannot verify a tree or None, whether it has a
    recurrent one), from a fresh ``make_prompt_cache``."""
    recurrent = False
    for where, c in leaves(make_prompt_cache(model)):
        mode = mode_of(c)
        if mode.recurrent:
            recurrent = True
        elif mode.attention:
            why = mode.verify_refusal(c)
            if why:
                return f"{_where(where)}: {why}", recurrent
        else:
            return (f"{_where(where)}: cache {type(c).__module__}.{type(c).__qualname__} is "
                    "not a cache mode treespec knows (no tree mask or exact rollback is "
                    "known for it)"), recurrent
    return None, recurrent


def structure(model: nn.Module) -> Structure:
    """The model's family as found, where its recurrent mixers are, and the
    first structural reason it cannot verify a tree (None when it can); with
    the walks that found them (:class:`Structure`)."""
    why, recurrent = cache_refusal(model)
    found = discover(model) if recurrent else Discovery()
    why = why or found.refusal
    skip = frozenset(id(m.module) for m in found.mixers)
    # the first attribute name some module holds a rope under (one walk
    # per name tried, the common one first)
    attr, owners = ROPE_ATTRS[0], []
    for a in ROPE_ATTRS:
        owners = rope_owners(model, a, skip)
        if owners:
            attr = a
            break
    if why is None:
        for name, owner in owners:
            bad = rope_refusal(owner[attr])
            if bad:
                why = f"{name}.{attr}: {bad}"
                break
    walked = slots(model)  # one walk for the two readers below
    positions = position_inputs(model, walked)
    if why is None:
        ropes = {id(owner[attr]) for _, owner in owners}
        findings = positional_code(model, skip | ropes, walked)
        if positions:
            findings = [f for f in findings if not _handled(f[0])]
        if findings:
            name, at, what = findings[0]
            more = f" (and {len(findings) - 1} more: {', '.join(f[0] for f in findings[1:])})" \
                if len(findings) > 1 else ""
            why = (f"{name} ({at}) {what}: a tree verify gives positions only through its "
                   f"ropes and cache masks, so this would see flattened indices{more}")
    family = Family(TREE if recurrent else None, attr, record_note(model), bool(positions))
    return Structure(family, found, why, walked, positions, owners)


def _handled(qualified: str) -> bool:
    return any(qualified == f"{m}.{q}" for m, q in HANDLED)
