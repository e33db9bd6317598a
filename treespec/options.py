"""A decode's options, checked once: which options act in which mode, their
ranges, and the bounds on a round's size.

Pure (standard library only), so the command line checks its flags with the
very code ``treespec.decoding.decode`` runs, before it imports MLX or loads a
model. Every message names the option the way the caller spelled it
(:class:`Spelling`: ``top_p=0.9`` for the library, ``--top-p 0.9`` for the
command line). Nothing is accepted and ignored: an option that cannot act in
the chosen mode is an error naming the option and the mode.

Defaults are mlx-lm's where the meaning is the same (``mlx_lm.generate``):
3 draft tokens per round (chain block 4), KV quantization group size 64
from step 5000.
"""

import math
import numbers
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Sequence, Tuple

from .errors import OptionError

MODES = ("classic", "chain", "tree")

# The most draft nodes one round may verify (the tree budget, a chain's
# drafts, a fixed tree's nodes below the root). It bounds the probe (which
# verifies every shape the run can use, up to this size) and a verify's
# memory (its logits are nodes x vocab float32: 65 x 256k = 67 MB); hybrid
# models have their own, smaller limit on the per-node recurrent state
# (treespec/verify/footprint.py).
MAX_DRAFT_NODES = 64
DEFAULT_BLOCK = 4  # verify width: mlx-lm's num_draft_tokens default, 3, plus the root
DEFAULT_WIDTH = 4  # confidence tree: top-k per expansion
KV_GROUP_SIZE = 64  # mlx-lm generate's --kv-group-size default
QUANTIZED_KV_START = 5000  # mlx-lm generate's --quantized-kv-start default
KV_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize takes
KV_GROUP_SIZES = (32, 64, 128)


class Spelling:
    """How a caller names options in messages: ``spell("top_p", 0.9)``.

    The library's default spells keyword arguments (``top_p=0.9``); the
    command line passes ``flags``: option -> (flag, value shown), e.g.
    ``{"block": ("--num-draft-tokens", lambda b: b - 1)}`` (other options:
    ``--`` and the name with dashes), and ``mode_notes``: why a mode was
    chosen when the caller did not name it."""

    def __init__(self, flags: Optional[Dict[str, Tuple[str, Callable]]] = None,
                 mode_notes: Optional[Dict[str, str]] = None):
        self.flags = flags
        self.mode_notes = mode_notes or {}  # mode -> why it is that mode

    def __call__(self, option: str, *value) -> str:
        if self.flags is None:
            if not value:
                return option
            return f"{option}={value[0]!r}" if value[0] is not True else option
        flag, show = self.flags.get(option, (f"--{option.replace('_', '-')}", lambda v: v))
        if not value:
            return flag
        shown = show(value[0])
        if isinstance(shown, (list, tuple)):
            shown = ",".join(map(str, shown))
        return f"{flag} {shown}" if shown is not True else flag

    def mode(self, mode: str) -> str:
        return self("mode", mode) + self.mode_notes.get(mode, "")


LIBRARY = Spelling()


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def check_sampling(top_k, top_p, min_p, spell: Spelling = LIBRARY, error=OptionError):
    """The filters' ranges in mlx-lm make_sampler's conventions: top_k >= 0
    (0 = off), top_p in [0, 1] (0 and 1 = off), min_p in [0, 1] (0 = off)."""
    if not _is_int(top_k) or top_k < 0:
        raise error(f"{spell('top_k')} must be an integer >= 0 (0 = off), got {top_k!r}")
    if not _is_real(top_p) or not 0.0 <= top_p <= 1.0:
        raise error(f"{spell('top_p')} must be in [0, 1] (0 and 1 = off), got {top_p!r}")
    if not _is_real(min_p) or not 0.0 <= min_p <= 1.0:
        raise error(f"{spell('min_p')} must be in [0, 1] (0 = off), got {min_p!r}")


def check_prompt(n_tokens: int, spell: Spelling = LIBRARY):
    """Every mode needs a first token (the first root; mlx-lm's generate
    refuses an empty prompt too)."""
    if n_tokens < 1:
        raise OptionError(f"{spell('prompt')}: the prompt is empty (no tokens); every mode "
                          "needs at least one token to start from")


def branching_parents(branching: Sequence[int]) -> list:
    """The parent list of the fixed tree with these branching factors (the
    children of each node consecutive, levels in order)."""
    parents, level = [-1], [0]
    for b in branching:
        nxt = []
        for p in level:
            for _ in range(int(b)):
                parents.append(p)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def wide_depth(parents: Sequence[int]) -> Optional[int]:
    """The first depth at which two or more nodes of this tree have children
    (None: its nodes with children form one chain). A fixed tree's drafter
    feeds, at each depth, the nodes that have children; from that depth on
    its levels are more than one chain, which ``batch_levels`` feeds as batch
    rows (treespec.draft.fixed)."""
    depth, having = [0] * len(parents), {}
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    for p in set(parents[1:]):
        having.setdefault(depth[p], set()).add(p)
    wide = [d for d, nodes in having.items() if len(nodes) > 1]
    return min(wide) if wide else None


def tree_nodes(branching: Sequence[int]) -> int:
    """Nodes of the fixed tree with these branching factors, root included."""
    total, level = 1, 1
    for b in branching:
        level *= int(b)
        total += level
        if total > 10 * MAX_DRAFT_NODES:  # enough to refuse; no huge products
            break
    return total


@dataclass(frozen=True)
class KVOptions:
    """mlx-lm's KV cache options (``mlx_lm.generate``'s ``--max-kv-size``,
    ``--kv-bits``, ``--kv-group-size``, ``--quantized-kv-start``); None:
    not given (the group size and start then take mlx-lm's defaults)."""

    max_kv_size: Optional[int] = None
    kv_bits: Optional[int] = None
    kv_group_size: Optional[int] = None
    quantized_kv_start: Optional[int] = None

    @property
    def group_size(self) -> int:
        return KV_GROUP_SIZE if self.kv_group_size is None else self.kv_group_size

    @property
    def start(self) -> int:
        return QUANTIZED_KV_START if self.quantized_kv_start is None else self.quantized_kv_start

    @property
    def default(self) -> bool:
        return self.max_kv_size is None and self.kv_bits is None

    def check(self, spell: Spelling = LIBRARY):
        if self.max_kv_size is not None and (not _is_int(self.max_kv_size) or self.max_kv_size < 1):
            raise OptionError(f"{spell('max_kv_size', self.max_kv_size)}: must be an integer >= 1")
        if self.kv_bits is None:
            for name in ("kv_group_size", "quantized_kv_start"):
                if getattr(self, name) is not None:
                    raise OptionError(f"{spell(name, getattr(self, name))} acts only with "
                                      f"{spell('kv_bits')} (KV cache quantization is off)")
            return
        if self.kv_bits not in KV_BITS or not _is_int(self.kv_bits):
            raise OptionError(f"{spell('kv_bits', self.kv_bits)}: bits must be one of "
                              f"{', '.join(map(str, KV_BITS))}")
        if self.group_size not in KV_GROUP_SIZES or not _is_int(self.group_size):
            raise OptionError(f"{spell('kv_group_size', self.group_size)}: must be one of "
                              f"{', '.join(map(str, KV_GROUP_SIZES))}")
        if not _is_int(self.start) or self.start < 0:
            raise OptionError(f"{spell('quantized_kv_start', self.start)}: must be an integer >= 0")
        if self.max_kv_size is not None:
            # mlx-lm's RotatingKVCache.to_quantized raises NotImplementedError.
            raise OptionError(f"{spell('kv_bits', self.kv_bits)} with "
                              f"{spell('max_kv_size', self.max_kv_size)}: mlx-lm cannot quantize "
                              "a RotatingKVCache (its to_quantized is not implemented)")

    def describe(self) -> dict:
        """The options given, as mlx-lm's ``generate_step`` takes them (its
        keyword arguments; the group size and start resolved)."""
        out = {}
        if self.max_kv_size is not None:
            out["max_kv_size"] = self.max_kv_size
        if self.kv_bits is not None:
            out.update(kv_bits=self.kv_bits, kv_group_size=self.group_size,
                       quantized_kv_start=self.start)
        return out


@dataclass(frozen=True)
class DecodeOptions:
    """What ``decode`` was asked for. ``None``: not given. ``check()`` raises
    OptionError for a value out of range or an option that cannot act in
    ``mode``; the properties give the resolved values."""

    mode: str = "classic"
    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0
    min_p: float = 0.0
    seed: Optional[int] = None
    block: Optional[int] = None
    branching: Optional[Sequence[int]] = None
    parents: Optional[Sequence[int]] = None
    budget: Optional[int] = None
    width: Optional[int] = None
    draft_model: bool = False  # a draft model was given
    drafter: bool = False  # a ready drafter was given
    draft_head: bool = False  # a hidden-state head drafts (treespec.draft.head)
    allow_inexact: bool = False
    kv: KVOptions = KVOptions()
    batch_levels: bool = False  # a fixed tree's wide levels drafted as batch rows

    # -- resolved ---------------------------------------------------------
    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @property
    def fixed(self) -> bool:
        return self.branching is not None or self.parents is not None

    @property
    def resolved_block(self) -> int:
        return DEFAULT_BLOCK if self.block is None else self.block

    @property
    def resolved_width(self) -> int:
        return DEFAULT_WIDTH if self.width is None else self.width

    @property
    def resolved_budget(self) -> int:
        return self.resolved_block - 1 if self.budget is None else self.budget

    def draft_nodes(self) -> Optional[int]:
        """The most draft nodes a round of this shape verifies (None: a
        drafter object, or classic)."""
        if self.mode == "classic" or self.drafter:
            return None
        if self.mode == "chain":
            return self.resolved_block - 1
        if self.parents is not None:
            return len(self.parents) - 1
        if self.branching is not None:
            return tree_nodes(self.branching) - 1
        return self.resolved_budget

    def with_mode(self, mode: str) -> "DecodeOptions":
        return replace(self, mode=mode)

    # -- the checks -------------------------------------------------------
    def check(self, spell: Spelling = LIBRARY) -> "DecodeOptions":
        mode = self.mode
        if mode not in MODES:
            raise OptionError(f"{spell.mode(mode)}: must be one of {', '.join(MODES)}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise OptionError(f"{spell('max_tokens', self.max_tokens)}: must be an integer >= 1")
        self._check_sampling(spell)
        self._check_mode(spell)
        self._check_sizes(spell)
        self._check_batch_levels(spell)
        self.kv.check(spell)
        return self

    def _check_sampling(self, spell):
        t = self.temperature
        if not _is_real(t) or t < 0:
            raise OptionError(f"{spell('temperature', t)}: must be a number >= 0 "
                              "(0 is greedy decoding)")
        if t == 0:
            off = {"top_k": (0,), "top_p": (0.0, 1.0), "min_p": (0.0,)}
            for name, values in off.items():
                v = getattr(self, name)
                if v not in values:
                    raise OptionError(f"{spell(name, v)} acts only when sampling: give "
                                      f"{spell('temperature')} > 0 (0 is greedy decoding)")
            if self.seed is not None:
                raise OptionError(f"{spell('seed', self.seed)} acts only when sampling: give "
                                  f"{spell('temperature')} > 0 (greedy decoding draws nothing)")
            return
        check_sampling(self.top_k, self.top_p, self.min_p, spell)
        if self.seed is not None and not _is_int(self.seed):
            raise OptionError(f"{spell('seed', self.seed)}: must be an integer")

    def _given(self, names):
        return [n for n in names if getattr(self, n) is not None]

    def _check_mode(self, spell):
        mode = self.mode
        shape = ("block", "branching", "parents", "budget", "width")
        if mode == "classic":
            for n in self._given(shape):
                raise OptionError(f"{spell(n, getattr(self, n))} acts only in chain or tree "
                                  f"decoding; {spell.mode('classic')} drafts nothing")
            for n in ("draft_model", "draft_head", "drafter", "allow_inexact"):
                if getattr(self, n):
                    raise OptionError(f"{spell(n, True)} acts only in chain or tree decoding; "
                                      f"{spell.mode('classic')} drafts nothing")
            return
        if self.draft_model and self.draft_head:
            raise OptionError(f"{spell('draft_model', True)} and {spell('draft_head', True)}: "
                              "give one drafter, a draft model or a hidden-state head")
        if not self.draft_model and not self.draft_head:
            raise OptionError(f"{spell.mode(mode)} needs a draft model ({spell('draft_model')})")
        if self.drafter:
            for n in self._given(shape):
                raise OptionError(f"{spell(n, getattr(self, n))} with {spell('drafter')}: the "
                                  "drafter carries its own shape")
            return
        if mode == "chain":
            for n in self._given(("branching", "parents", "budget", "width")):
                raise OptionError(f"{spell(n, getattr(self, n))} shapes a tree; it acts only "
                                  f"in {spell.mode('tree')}, not {spell.mode('chain')}")
            return
        # tree
        if self.branching is not None and self.parents is not None:
            raise OptionError(f"give one fixed shape: {spell('branching', self.branching)} or "
                              f"{spell('parents', self.parents)}, not both")
        if self.fixed:
            which = "branching" if self.branching is not None else "parents"
            for n in self._given(("block", "budget", "width")):
                raise OptionError(f"{spell(n, getattr(self, n))} sizes the confidence tree; "
                                  f"the fixed tree of {spell(which, getattr(self, which))} "
                                  "has the size of its shape")
            return
        if self.block is not None and self.budget is not None:
            raise OptionError(f"{spell('block', self.block)} and {spell('budget', self.budget)} "
                              "both size the confidence tree; give one")
        if self.sampled and not self.draft_head:  # a head's dynamic tree draws its children
            raise OptionError(f"{spell.mode('tree')} at {spell('temperature', self.temperature)} "
                              f"needs a fixed shape ({spell('branching')} or "
                              f"{spell('parents')}): the confidence tree drafts greedily")

    def _check_batch_levels(self, spell):
        """``batch_levels`` changes how a fixed tree's levels of several fed
        nodes are drafted (treespec.draft.fixed); anywhere else it would do
        nothing, so it is refused there. Whether the draft caches can be
        forked into rows is the model's (treespec.decoding.check)."""
        if not isinstance(self.batch_levels, bool):
            raise OptionError(f"{spell('batch_levels', self.batch_levels)}: must be True or False")
        if not self.batch_levels:
            return
        flag = spell("batch_levels", True)
        acts = (f"{flag} acts only on a fixed tree's drafting ({spell.mode('tree')} with "
                f"{spell('branching')} or {spell('parents')})")
        if self.mode != "tree":
            raise OptionError(f"{acts}; {spell.mode(self.mode)} drafts "
                              f"{'nothing' if self.mode == 'classic' else 'one token a level'}")
        if self.drafter:
            raise OptionError(f"{flag} with {spell('drafter')}: the drafter carries its own "
                              "(FixedTreeDrafter(..., batch_levels=True))")
        if self.draft_head:
            raise OptionError(f"{flag} with {spell('draft_head', True)}: a head drafts every "
                              "wide level as batch rows of its own cache already")
        if not self.fixed:
            raise OptionError(f"{acts}; the confidence tree feeds its levels through the tree "
                              "injection (as batch rows it would copy the draft caches at "
                              "every level)")
        if self.sampled:
            raise OptionError(f"{flag} at {spell('temperature', self.temperature)}: the sampled "
                              "tree draws its children on the host, level by level, one "
                              "forward per fed node's level through the tree injection")
        which = "branching" if self.branching is not None else "parents"
        shape = getattr(self, which)
        parents = branching_parents(shape) if which == "branching" else shape
        if wide_depth(parents) is None:
            raise OptionError(f"{flag} with {spell(which, shape)}: no level of this tree feeds "
                              "two or more nodes (its nodes with children form one chain, "
                              "drafted as a chain's one-token steps): nothing to batch")

    def _check_sizes(self, spell):
        if self.block is not None and (not _is_int(self.block) or self.block < 1):
            raise OptionError(f"{spell('block', self.block)}: must be an integer >= 1 (a chain "
                              "needs at least the root: block 1 is 0 draft tokens)")
        if self.budget is not None and (not _is_int(self.budget) or self.budget < 0):
            raise OptionError(f"{spell('budget', self.budget)}: must be an integer >= 0")
        if self.width is not None and (not _is_int(self.width) or
                                       not 1 <= self.width <= MAX_DRAFT_NODES):
            raise OptionError(f"{spell('width', self.width)}: must be an integer in "
                              f"1..{MAX_DRAFT_NODES}")
        if self.branching is not None:
            if not self.branching or any(not _is_int(b) or b < 1 for b in self.branching):
                raise OptionError(f"{spell('branching', self.branching)}: branching factors "
                                  "must be integers >= 1, at least one level")
        if self.parents is not None:
            bad = next((i for i, p in enumerate(self.parents)
                        if not _is_int(p) or (p != -1 if i == 0 else not 0 <= p < i)), None)
            if not self.parents or bad is not None:
                raise OptionError(f"{spell('parents', self.parents)}: a parent list starts with "
                                  "the root's -1 and names an earlier node for every other "
                                  f"node{'' if bad is None else f' (node {bad} does not)'}")
        nodes = self.draft_nodes()
        if nodes is not None and nodes > MAX_DRAFT_NODES:
            n = next(n for n in ("budget", "branching", "parents", "block")
                     if getattr(self, n) is not None)
            raise OptionError(f"{spell(n, getattr(self, n))}: {nodes} draft nodes per round; "
                              f"at most {MAX_DRAFT_NODES} (treespec.options.MAX_DRAFT_NODES "
                              "bounds the probe and a verify's memory)")
