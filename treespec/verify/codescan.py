"""Position arithmetic a tree verify cannot reach, read off the model's code.

A tree verify gives each node its position through the two places mlx-lm
models take positions from: each attention's ``self.rope(x, offset=...)``
(a :class:`~treespec.verify.attention.TreeRoPE` rotates node i by ``offset +
depth``) and each cache's ``make_mask``. A model that computes anything else
per position sees the flattened tree, node i at ``offset + i``, and is
silently wrong wherever that differs from ``offset + depth``: learned
absolute positions (gpt2's ``wpe(arange(L) + offset)``), a query scale that
grows with the position (ministral3's ``1 + beta * log(1 + floor((offset +
arange(L)) / original_max_position_embeddings))``, wrong only for a tree that
straddles a multiple of that length), a chunk mask built from row indices
(llama4), a block-sparse mask (phi3small), rotary embeddings applied with
``mx.fast.rope`` outside a rope module (nanochat, talkie).

mlx-lm's models spell all of these with ``arange`` or a direct
``mx.fast.rope``, so :func:`positional_code` reads the bytecode of every
function a forward can run (each module's methods and the module-level
functions they call, outside mlx-lm's shared layers) and names each one that
does either. The adapter refuses the model unless a stand-in of
treespec.verify.positions replaces exactly those values. The ropes and the
recurrent mixers (run one token per depth, where ``arange(1) + offset`` is
the node's position) are not read. The exactness probe stays the guard at
run time for what no reading can see.
"""

import dis
import types
from functools import lru_cache
from typing import Iterable, List, Optional, Set, Tuple

import mlx.nn as nn

from ..mixers import slots

# mlx-lm's shared layers: masks there come from cache.make_mask, and the
# routing, SSM and delta-rule helpers are per token or run inside a mixer.
SHARED = {f"mlx_lm.models.{m}" for m in (
    "base", "cache", "rope_utils", "switch_layers", "activations", "pipeline", "ssm",
    "gated_delta", "mla", "bitlinear_layers")}
# Methods no forward runs.
NOT_FORWARD = {"__init__", "sanitize", "make_cache", "shard", "quant_predicate",
               "cast_predicate", "load_weights", "extra_repr", "__repr__", "__post_init__",
               "from_dict", "_extra_repr"}

# Functions read and cleared by hand: (module, qualname) -> why its arange
# is not a position a tree verify gets wrong.
REVIEWED = {
    ("mlx_lm.models.gear", "_softcap_attention"): (
        "builds a causal mask from arange only when handed the string 'causal'; a "
        "tree verify hands it the tree mask array"),
}

Finding = Tuple[str, str, str]  # (module.qualname, file:line, what)


def _instructions(code) -> Iterable:
    yield from dis.get_instructions(code)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _instructions(c)


@lru_cache(maxsize=None)
def _reads(code) -> Tuple[bool, bool, Tuple[str, ...]]:
    """(uses arange, calls fast.rope, global names) of one code object."""
    arange = rope = False
    names = []
    prev = None
    for ins in _instructions(code):
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME"):
            if ins.argval == "arange":
                arange = True
            if ins.argval == "rope" and prev == "fast":
                rope = True
            if ins.opname == "LOAD_GLOBAL":
                names.append(ins.argval)
            prev = ins.argval
        else:
            prev = None
    return arange, rope, tuple(names)


def _functions(cls) -> List[types.FunctionType]:
    out = []
    for klass in cls.__mro__:
        if klass is object or klass.__module__.split(".")[0] in ("mlx", "builtins"):
            continue
        if klass.__module__ in SHARED:
            continue
        for name, value in vars(klass).items():
            if name in NOT_FORWARD:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            if isinstance(value, types.FunctionType):
                out.append(value)
    return out


def _scan(fn, seen: Set[int], found: List[Finding]) -> None:
    if id(fn.__code__) in seen:
        return
    seen.add(id(fn.__code__))
    mod = getattr(fn, "__module__", "") or ""
    if mod in SHARED or mod.split(".")[0] in ("mlx", "numpy", "builtins"):
        return
    arange, rope, names = _reads(fn.__code__)
    key = (mod, fn.__qualname__)
    where = f"{fn.__code__.co_filename.rsplit('/', 1)[-1]}:{fn.__code__.co_firstlineno}"
    whats = []
    if key not in REVIEWED:
        if rope:
            whats.append("applies rotary embeddings with mx.fast.rope itself, not through a "
                         "rope module treespec can hand per-node positions to")
        if arange:
            whats.append("computes with arange in the forward (positions or masks from "
                         "flattened indices)")
    if whats:
        found.append((f"{mod}.{fn.__qualname__}", where, " and ".join(whats)))
    for name in names:
        callee = fn.__globals__.get(name)
        if isinstance(callee, types.FunctionType):
            _scan(callee, seen, found)


def positional_code(model: nn.Module, skip: Optional[Set[int]] = None,
                    walked: Optional[list] = None) -> List[Finding]:
    """Every function a forward of ``model`` can run that computes positions
    itself: ``(module.qualname, file:line, what)``, in model order. ``skip``:
    ids of modules whose whole subtree is not read (ropes, mixers).
    ``walked``: ``slots(model)`` if the caller has it."""
    skip = skip or set()
    classes, inside = [], None
    # ``slots`` lists in model order, each module right before its subtree:
    # a path under the last skipped module's is in its subtree.
    walked = slots(model) if walked is None else walked
    for path, _, _, module in [("", None, None, model)] + walked:
        if inside is not None and path.startswith(inside):
            continue
        if id(module) in skip:
            inside = path + "."
            continue
        if type(module) not in classes:
            classes.append(type(module))
    seen: Set[int] = set()
    found: List[Finding] = []
    for cls in classes:
        for fn in _functions(cls):
            _scan(fn, seen, found)
    return found
