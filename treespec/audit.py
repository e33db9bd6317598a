"""`treespec audit`: run the exactness contracts against one checkpoint and its adapter.

    treespec audit --model PATH [--draft-model PATH] [--adapter module:attr]
                   [--json] [--block N] [--allow-inexact]

Each property is one function below: it takes a :class:`Subject` (the model,
the adapter factory and walk under audit, the options) and returns
:class:`Check` records (name, status, detail, first failure, max |diff|).
:func:`check` runs one property by name, :func:`run` all of them;
suites/audit/test_user_model.py parametrises pytest over :data:`PROPERTIES`
with the same functions.

References are the suites' own: a plain mlx-lm forward over each node's
root path from a copy of the identically prefilled cache (contract 6), a
cache that was only ever fed the accepted path (contract 7), mlx-lm's chain
accept loop (contract 2) and ``mlx_lm.generate`` (contract 9). Equality is
bit for bit unless ``--allow-inexact`` (then within ``--tolerance``, and
reported as "inexact").

A user adapter (``--adapter module:attr``) is any callable ``attr(model)``
returning an object with ``verify(tree, cache, start=0)``,
``commit(cache, tree, path, offset=None)`` and ``check(tree, cache, start=0)``
(treespec.verify.TreeAdapter's interface); if it also has
``walk(tree, target_tokens)`` that walk is audited and used instead of
treespec.walk.tree_walk.
"""

import copy
import hashlib
import importlib
import importlib.util
import json
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from .tree import DraftTree
from .verify import TreeRefused, adapter_for
from .walk import chain_walk, tree_walk

PROPERTIES = (
    "adapter",
    "linear-verify",
    "tree-verify",
    "rollback",
    "walk-linear",
    "walk-siblings",
    "e2e",
    "probe",
)
PASS, FAIL, SKIP, INEXACT = "pass", "FAIL", "skip", "inexact"
# A one-token step on a wrapped sliding window sums its keys in ring order
# (DESIGN.md); after committing a root-only path there, later logits may
# differ in the last bits from a reference that fed the root alone.
KEY_ORDER_BOUND = 1e-3
PROMPTS = ("The quick brown fox jumps over", "def main(): return print(")


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------


@dataclass
class Check:
    """One row of the audit: a property (in one cache mode or decode mode)."""

    name: str
    status: str  # pass | FAIL | skip | inexact
    detail: str
    first_failure: Optional[dict] = None
    max_diff: Optional[float] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status != FAIL

    @property
    def prop(self) -> str:
        """The property this row belongs to (its name without ``[mode]``)."""
        return self.name.split("[", 1)[0]

    def line(self) -> str:
        return f"{self.name}: {self.status}: {self.detail}"


@dataclass
class Options:
    block: int = 4  # chain verify width for e2e and the probe shapes
    draws: int = 3  # random trees per history (and probe draws)
    seed: int = 0
    allow_inexact: bool = False
    tolerance: float = 0.05  # max |diff| accepted as "inexact" with allow_inexact
    max_tokens: Optional[int] = None  # e2e length (default: past the window)


@dataclass
class Subject:
    """What is audited: a model, how to get its adapter, and the drafter."""

    model: Any
    tokenizer: Any = None
    name: str = "model"
    draft_model: Any = None  # None: the target drafts for itself
    draft_name: Optional[str] = None
    factory: Callable = adapter_for  # model -> adapter
    adapter_source: str = "treespec.verify.adapter_for"
    options: Options = field(default_factory=Options)
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def custom(self) -> bool:
        return self.factory is not adapter_for


@dataclass
class Report:
    header: dict
    checks: List[Check]
    probe: Any = None  # treespec.gate.Probe
    seconds: float = 0.0
    probe_before_wrap: Any = None  # the re-measurement of a windowed model

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failed(self) -> List[str]:
        return [c.name for c in self.checks if not c.ok]

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "header": self.header,
            "checks": [{**asdict(c), "ok": c.ok} for c in self.checks],
            "failed": self.failed(),
            "probe": self.probe.to_json() if self.probe is not None else None,
            "probe_before_wrap": (self.probe_before_wrap.to_json()
                                  if self.probe_before_wrap is not None else None),
            "seconds": round(self.seconds, 2),
        }


class _Tally:
    """Comparisons of one property: counts, worst difference, first failure."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.count = self.failures = self.inexact = 0
        self.worst = 0.0
        self.first: Optional[dict] = None
        self.notes: List[str] = []
        self.refused: List[str] = []

    def compare(self, got: mx.array, want: mx.array, where: dict, bound: Optional[float] = None) -> bool:
        """``bound``: a known, pinned inexact case compared within it."""
        self.count += 1
        if got.shape == want.shape and mx.array_equal(got, want).item():
            return True
        if got.shape != want.shape:
            diff, flip = float("inf"), True
        else:
            diff = float(mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32))).item())
            flip = _argmax(got) != _argmax(want)
        self.worst = max(self.worst, diff) if diff == diff else float("nan")
        if bound is not None and diff <= bound:
            return True
        if self.opts.allow_inexact and diff <= self.opts.tolerance:
            self.inexact += 1
            return True
        self.failures += 1
        if self.first is None:
            self.first = {**where, "max_abs_diff": diff, "argmax_flip": flip}
        return False

    def fail(self, where: dict):
        self.count += 1
        self.failures += 1
        if self.first is None:
            self.first = where

    def note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)

    def check(self, name: str, what: str) -> Check:
        notes = "".join(f"; {n}" for n in self.notes)
        if self.failures:
            worst = ""
            if self.first and self.worst > self.first.get("max_abs_diff", self.worst):
                worst = f" (max |diff| overall {self.worst:.3g})"
            return Check(name, FAIL, f"{self.failures}/{self.count} {what} differ; first: "
                         f"{_where(self.first)}{worst}{notes}", self.first, self.worst)
        if self.count == 0:
            why = self.refused[0] if self.refused else "nothing to compare"
            return Check(name, SKIP, f"{why}{notes}", None, None)
        if self.inexact:
            return Check(name, INEXACT, f"{self.inexact}/{self.count} {what} within "
                         f"--tolerance {self.opts.tolerance:g} (max |diff| {self.worst:.3g}), "
                         f"the rest bit-identical{notes}", None, self.worst)
        return Check(name, PASS, f"{self.count} {what} bit-identical{notes}", None, self.worst)


def _argmax(x: mx.array) -> int:
    return int(mx.argmax(x.reshape(-1, x.shape[-1])[-1]).item())


def _where(first: Optional[dict]) -> str:
    """A failure location as one readable clause."""
    if not first:
        return "?"
    f = dict(first)
    parts = []
    if "message" in f:
        parts.append(f.pop("message"))
    if "node" in f:
        path = "-".join(map(str, f.get("path", ())))
        parts.append(f"node {f['node']} (path {path})")
    if "step" in f:
        parts.append(f"decode step {f['step']} (tokens {f.get('tokens')})")
    if "committed" in f:
        parts.append(f"after committing {f['committed']}")
    if "history" in f:
        parts.append(f"at {f['history']}")
    if "mode" in f:
        parts.append(f"[{f['mode']}]")
    if "max_abs_diff" in f:
        d = f["max_abs_diff"]
        parts.append(f"max |diff| {d:.3g}" + (", argmax flipped" if f.get("argmax_flip") else ""))
    return " ".join(parts)


# ---------------------------------------------------------------------------
# The subject: loading, the adapter under audit, the walk
# ---------------------------------------------------------------------------


def load_adapter(spec: str) -> Callable:
    """``module:attr`` (or ``path/to/file.py:attr``) -> the callable there."""
    from .cli import CliError

    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise CliError(f"--adapter {spec!r}: expected module:attr, e.g. mypkg.adapters:make")
    try:
        if module.endswith(".py") or "/" in module:
            path = Path(module)
            mspec = importlib.util.spec_from_file_location(path.stem, path)
            if mspec is None or not path.exists():
                raise ImportError(f"no such file {module}")
            mod = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(mod)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # as `python -m` would
            mod = importlib.import_module(module)
        obj = mod
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise CliError(f"--adapter {spec!r}: {type(e).__name__}: {e}")
    if not callable(obj):
        raise CliError(f"--adapter {spec!r}: {type(obj).__name__} is not callable (model -> adapter)")
    return obj


def subject(model_path, draft_path=None, adapter: Optional[str] = None,
            options: Optional[Options] = None) -> Subject:
    """Load the checkpoints (mlx_lm.load) and the adapter factory."""
    from .cli import check_same_tokenizer, load_checkpoint

    factory, source = adapter_for, "treespec.verify.adapter_for"
    if adapter is not None:  # first: a bad spec fails before any load
        factory, source = load_adapter(adapter), adapter
    model, tokenizer = load_checkpoint(model_path, "model")
    draft = None
    if draft_path is not None:
        draft, draft_tok = load_checkpoint(draft_path, "draft-model")
        try:
            check_same_tokenizer(tokenizer, draft_tok, model, draft)
        except AttributeError:
            # cli.check_same_tokenizer reads model.args.vocab_size, which
            # nested configs (qwen3_5's text_config) lack: compare the
            # vocabularies and the logit widths instead.
            check_same_tokenizer(tokenizer, draft_tok, None, None)
            a, b = (m(mx.array([[1]]), cache=make_prompt_cache(m)).shape[-1] for m in (model, draft))
            if a != b:
                from .cli import CliError

                raise CliError(f"vocabulary sizes differ: target {a}, draft {b}")
    return Subject(model, tokenizer, str(model_path), draft, draft_path and str(draft_path),
                   factory, source, options or Options())


def the_adapter(s: Subject):
    """The adapter under audit (made once), or raises TreeRefused."""
    if "adapter" not in s._memo:
        try:
            s._memo["adapter"] = (s.factory(s.model), None)
        except TreeRefused as e:
            s._memo["adapter"] = (None, e)
    adapter, refusal = s._memo["adapter"]
    if refusal is not None:
        raise refusal
    return adapter


def the_walk(s: Subject) -> Tuple[Callable, str]:
    """The adapter's own ``walk`` if it has one, else treespec's tree_walk."""
    try:
        adapter = the_adapter(s)
    except TreeRefused:
        adapter = None
    walk = getattr(adapter, "walk", None)
    if callable(walk):
        return walk, f"{type(adapter).__name__}.walk"
    return tree_walk, "treespec.walk.tree_walk"


def vocab_size(s: Subject) -> int:
    if "vocab" not in s._memo:
        cache = make_prompt_cache(s.model)
        s._memo["vocab"] = int(s.model(mx.array([[1]]), cache=cache).shape[-1])
    return s._memo["vocab"]


def window(model) -> Optional[int]:
    """The smallest sliding window among the model's own caches, if any."""
    sizes = [c.max_size for c in make_prompt_cache(model) if isinstance(c, RotatingKVCache)]
    return min(sizes) if sizes else None


def _cache_summary(model) -> str:
    names = [type(c).__name__ for c in make_prompt_cache(model)]
    parts, i = [], 0
    while i < len(names):
        j = i
        while j < len(names) and names[j] == names[i]:
            j += 1
        parts.append(names[i] + (f" x{j - i}" if j - i > 1 else ""))
        i = j
    w = window(model)
    return ", ".join(parts) + (f" (window {w})" if w else "")


# ---------------------------------------------------------------------------
# Cache states: histories and cache modes
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheMode:
    """``native``: the model's make_prompt_cache; ``kv-q{bits}-g{group}``: its
    KVCache layers converted to QuantizedKVCache after the history, as
    mlx-lm's ``kv_bits`` does."""

    name: str = "native"
    kv_bits: Optional[int] = None
    kv_group: Optional[int] = None


def cache_modes(model) -> Tuple[List[CacheMode], Optional[str]]:
    """The modes this model runs in, and why quantized KV is n/a (or None)."""
    cache = make_prompt_cache(model)
    model(mx.array([[1]]), cache=cache)
    dims = sorted({c.keys.shape[-1] for c in cache if type(c) is KVCache})
    modes = [CacheMode()]
    if not dims:
        return modes, "no KVCache layer to quantize"
    group = next((g for g in (64, 32) if all(d % g == 0 for d in dims)), None)
    if group is None:
        return modes, f"KV head_dim {dims} is not a multiple of a quantization group (32, 64)"
    modes += [CacheMode(f"kv-q{b}-g{group}", b, group) for b in (4, 8)]
    return modes, None


@dataclass(frozen=True)
class History:
    """One prompt forward, then single steps (they rotate a window's ring)."""

    prompt: tuple
    steps: tuple = ()

    @property
    def offset(self) -> int:
        return len(self.prompt) + len(self.steps)

    def label(self, w: Optional[int]) -> str:
        how = f"{len(self.prompt)} prompt + {len(self.steps)} steps" if self.steps else "prompt"
        wrapped = ", window wrapped" if w and self.offset >= w else ""
        return f"offset {self.offset} ({how}{wrapped})"


def histories(s: Subject) -> List[History]:
    """Cache states before and after the sliding window wraps (8 stands in
    for the window of a model without one), as suites/verify uses: empty,
    short, just below the window, wrapped by the prompt (concatenating
    update), wrapped by single steps (ring rotated in place), and both."""
    if "histories" not in s._memo:
        w = window(s.model) or 8
        rng = random.Random(f"{s.options.seed}:histories")
        v = vocab_size(s)
        toks = lambda n: tuple(rng.randrange(v) for _ in range(n))
        # A long window is wrapped by single steps with a long prompt first:
        # thousands of one-token steps would cost minutes on a real model.
        by_steps = History(toks(2), toks(w + 2)) if w <= 64 else History(toks(w - 2), toks(4))
        both = History(toks(w), toks(w // 2 + 1)) if w <= 64 else History(toks(w), toks(3))
        s._memo["histories"] = [
            History(()),
            History(toks(3)),
            History(toks(max(w - 2, 1)), toks(1)),
            History(toks(w + 3)),
            by_steps,
            both,
        ]
    return s._memo["histories"]


def base_cache(s: Subject, hist: History, mode: CacheMode) -> list:
    """The cache after ``hist`` in ``mode``, replayed once per audit: callers
    get a copy (``clone``), never the memoized one."""
    memo = s._memo.setdefault("caches", {})
    key = (hist, mode)
    if key not in memo:
        memo[key] = replay(s.model, hist, mode)
    return clone(memo[key])


def replay(model, hist: History, mode: CacheMode) -> list:
    cache = make_prompt_cache(model)
    if hist.prompt:
        mx.eval(model(mx.array(hist.prompt)[None], cache=cache))
    for t in hist.steps:
        mx.eval(model(mx.array([[t]]), cache=cache))
    if mode.kv_bits:
        cache = [c.to_quantized(group_size=mode.kv_group, bits=mode.kv_bits)
                 if type(c) is KVCache else c for c in cache]
    mx.eval([c.state for c in cache])
    return cache


def clone(cache) -> list:
    return copy.deepcopy(cache)


def fingerprint(cache) -> str:
    """Every attribute of every cache, arrays as bytes, hashed."""
    h = hashlib.sha256()

    def feed(v):
        if isinstance(v, mx.array):
            h.update(f"{v.dtype}{v.shape}".encode())
            if v.size:
                h.update(np.array(v.view(mx.uint8) if v.dtype.size else v).tobytes())
        elif isinstance(v, (list, tuple)):
            h.update(f"{type(v).__name__}{len(v)}".encode())
            for x in v:
                feed(x)
        elif isinstance(v, dict):
            for k in sorted(v):
                h.update(str(k).encode())
                feed(v[k])
        elif isinstance(v, (int, float, str, bool, type(None))):
            h.update(repr(v).encode())
        else:
            h.update(f"obj{id(v)}".encode())

    for c in cache:
        h.update(type(c).__name__.encode())
        feed(dict(vars(c)))
    return h.hexdigest()


def _offset(cache) -> int:
    from .draft import cache_offset

    return cache_offset(cache)


def plain(model, cache, tokens) -> mx.array:
    """Logits [T, vocab] of a plain mlx-lm forward over ``tokens``."""
    out = model(mx.array(list(tokens))[None], cache=cache)[0]
    mx.eval(out)
    return out


def keys_rotated(cache) -> bool:
    """After a one-token step: does a wrapped RotatingKVCache hand the
    attention its keys out of time order (``_update_in_place``)?"""
    return any(
        isinstance(c, RotatingKVCache) and c.offset > c.keys.shape[2] and c._idx != c.keys.shape[2]
        for c in cache
    )


def _wrapped(cache) -> bool:
    return any(isinstance(c, RotatingKVCache) and c.offset >= c.max_size for c in cache)


# ---------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------


def random_tree(rng: random.Random, vocab: int, n: int, style: str = "random") -> DraftTree:
    """A tree of ``n`` nodes: ``random`` (uniform parents), ``fan``, ``chain``
    or ``mixed``; any style but chain is made branching when n >= 3."""
    parents = [-1]
    for i in range(1, n):
        if style == "chain":
            parents.append(i - 1)
        elif style == "fan":
            parents.append(0)
        elif style == "mixed":
            parents.append(rng.choice([0, i - 1, rng.randrange(i)]))
        else:
            parents.append(rng.randrange(i))
    if style != "chain" and n >= 3 and parents == list(range(-1, n - 1)):
        parents[-1] = 0
    return DraftTree([rng.randrange(vocab) for _ in range(n)], parents)


def branching_trees(s: Subject, rng: random.Random) -> List[DraftTree]:
    """``draws`` random branching trees, plus one deeper than a small window
    (the window then cuts inside the tree itself)."""
    v = vocab_size(s)
    styles, sizes = ("random", "mixed", "fan"), (6, 10, 13)
    trees = [random_tree(rng, v, sizes[d % 3], styles[d % 3]) for d in range(s.options.draws)]
    w = window(s.model)
    if w and w <= 32:
        deep = [-1] + list(range(0, w + 2)) + [3, w // 2]
        trees.append(DraftTree([rng.randrange(v) for _ in deep], deep))
    return trees


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------


def check_adapter(s: Subject) -> List[Check]:
    """The adapter exists (or the family's refusal, by name), has the
    TreeAdapter interface, and its ``check`` only reads."""
    try:
        adapter = the_adapter(s)
    except TreeRefused as e:
        return [Check("adapter", FAIL, f"refused ({s.adapter_source}): {e}",
                      {"message": str(e), "family": e.family})]
    missing = [m for m in ("verify", "commit", "check") if not callable(getattr(adapter, m, None))]
    if missing:
        return [Check("adapter", FAIL, f"{adapter!r} from {s.adapter_source} lacks "
                      f"{', '.join(missing)} (TreeAdapter interface)", {"missing": missing})]
    hist = histories(s)[3]
    cache = base_cache(s, hist, CacheMode())
    before = fingerprint(cache)
    tree = random_tree(random.Random(f"{s.options.seed}:adapter"), vocab_size(s), 7)
    note = ""
    try:
        adapter.check(tree, cache)
    except TreeRefused as e:
        note = f"; check refuses a branching tree: {e.reason}"
    if fingerprint(cache) != before:
        return [Check("adapter", FAIL, "check() wrote into the cache (it must only read)",
                      {"message": "check() changed the cache", "history": hist.label(window(s.model))})]
    walk = the_walk(s)[1]
    return [Check("adapter", PASS, f"{adapter!r} from {s.adapter_source}; walk {walk}{note}")]


def check_linear_verify(s: Subject) -> List[Check]:
    """A linear tree's verify rows equal one plain forward over the chain
    (what mlx-lm's speculative decoding runs), from the same cache state."""
    adapter, model = the_adapter(s), s.model
    rng = random.Random(f"{s.options.seed}:linear")
    v, w = vocab_size(s), window(model)
    lengths = sorted({1, 2, s.options.block, s.options.block + 2} | ({w + 3} if w and w <= 32 else set()))
    tally = _Tally(s.options)
    for hist in histories(s):
        base = base_cache(s, hist, CacheMode())
        for n in lengths:
            tree = DraftTree.linear([rng.randrange(v) for _ in range(n)])
            logits = _verify_copy(tally, adapter, tree, base, hist, w, f"chain of {n}", "refused")
            if logits is None:
                continue
            ref = plain(model, clone(base), tree.tokens)
            where = {"history": hist.label(w), "chain": n, "tree": list(tree.parents)}
            if logits.shape != ref.shape:
                tally.fail({**where, "message": f"verify returned {tuple(logits.shape)}, "
                            f"expected {tuple(ref.shape)}"})
                continue
            for i in range(n):
                tally.compare(logits[i], ref[i], {**where, "node": i, "path": list(range(i + 1))})
    if tally.refused:
        tally.note(f"{len(tally.refused)} chains refused ({tally.refused[0]})")
    return [tally.check("linear-verify", f"rows of chains {lengths} at {len(histories(s))} offsets")]


def _verify_copy(tally, adapter, tree, base, hist, w, what, refused):
    """The evaluated verify logits of ``tree`` on a copy of ``base``, or None
    when the adapter refuses: the refusal is noted and (contract 8) the copy
    must be left as it was."""
    cache = clone(base)
    try:
        logits = adapter.verify(tree, cache)
        mx.eval(logits)
        return logits
    except TreeRefused as e:
        tally.refused.append(f"{refused}: {e.reason}")
        if fingerprint(cache) != fingerprint(base):
            tally.fail({"message": f"a refused verify of a {what} changed the cache",
                        "history": hist.label(w)})
        return None


def check_tree_verify(s: Subject, mode: CacheMode = CacheMode()) -> Check:
    """Every node's verify row equals the last row of a plain forward over
    that node's root path from a copy of the same cache (contract 6)."""
    adapter, model = the_adapter(s), s.model
    rng = random.Random(f"{s.options.seed}:tree:{mode.name}")
    w = window(model)
    tally = _Tally(s.options)
    trees = 0
    for hist in histories(s):
        base = base_cache(s, hist, mode)
        for tree in branching_trees(s, rng):
            trees += 1
            logits = _verify_copy(tally, adapter, tree, base, hist, w, f"{len(tree)}-node tree",
                                  "adapter refuses branching trees")
            if logits is None:
                continue
            where = {"history": hist.label(w), "mode": mode.name, "tree": list(tree.parents)}
            if logits.shape[0] != len(tree):
                tally.fail({**where, "message": f"verify returned {logits.shape[0]} rows "
                            f"for {len(tree)} nodes"})
                continue
            for i in range(len(tree)):
                path = tree.path_to(i)
                ref_cache = clone(base)
                ref = plain(model, ref_cache, [tree.tokens[j] for j in path])[-1]
                bound_ref = None
                if len(path) == 1 and not mx.array_equal(ref, logits[0]).item() and keys_rotated(ref_cache):
                    # The root alone is a one-token step over ring-ordered keys;
                    # the verify's root row must equal a time-ordered forward's.
                    bound_ref = plain(model, clone(base), [tree.tokens[0]] * 2)[0]
                    tally.note("root rows on a wrapped window compared with a time-ordered "
                               "forward (DESIGN.md key order)")
                tally.compare(logits[i], ref if bound_ref is None else bound_ref,
                              {**where, "node": i, "path": path})
    if tally.refused and tally.count:
        tally.note(f"{len(tally.refused)} trees refused ({tally.refused[0]})")
    name = f"tree-verify[{mode.name}]"
    return tally.check(name, f"nodes of {trees // len(histories(s))} trees x "
                       f"{len(histories(s))} offsets")


def _rollback_paths(tree: DraftTree, d: int, rng) -> List[int]:
    """Root only, the deepest branch in full, or the path to a random node."""
    choice = d % 3
    node = 0 if choice == 0 else int(np.argmax(tree.depths())) if choice == 1 else rng.randrange(len(tree))
    return tree.path_to(node)


def check_rollback(s: Subject, mode: CacheMode = CacheMode()) -> Check:
    """Two rounds of verify + commit of a random root path; then single- and
    multi-token decode steps give the same logits as a cache that was only
    ever fed the paths (contract 7)."""
    from .rollback import RollbackRefused

    adapter, model = the_adapter(s), s.model
    rng = random.Random(f"{s.options.seed}:rollback:{mode.name}")
    v, w = vocab_size(s), window(model)
    tally = _Tally(s.options)
    linear_only = None
    verify_differs = None
    for hist in histories(s)[1:]:
        base = base_cache(s, hist, mode)
        for d in range(s.options.draws):
            ours, ref = clone(base), clone(base)
            exact, committed = True, []
            for r in range(2):
                offset, wrapped = _offset(ours), _wrapped(ours)
                tree = random_tree(rng, v, rng.randrange(5, 10), ("random", "mixed")[r])
                before = fingerprint(ours)
                try:
                    logits = adapter.verify(tree, ours)
                except TreeRefused as e:
                    if fingerprint(ours) != before:
                        tally.fail({"message": "a refused verify changed the cache",
                                    "history": hist.label(w), "mode": mode.name})
                    linear_only = linear_only or e.reason
                    tree = DraftTree.linear(tree.tokens[: rng.randrange(2, 6)])
                    try:
                        logits = adapter.verify(tree, ours)
                    except TreeRefused as e:
                        tally.refused.append(f"the adapter refuses chains here too: {e.reason}")
                        break
                mx.eval(logits)
                path = _rollback_paths(tree, d + r, rng)
                if wrapped and len(path) == 1 < len(tree):
                    # The reference feeds the root alone: a one-token step on
                    # a full window sums its keys in ring order (DESIGN.md).
                    exact = False
                pre = fingerprint(ours)
                try:
                    adapter.commit(ours, tree, path, offset)
                except RollbackRefused as e:
                    if fingerprint(ours) != pre:
                        tally.fail({"message": f"a refused commit changed the cache ({e})",
                                    "history": hist.label(w), "mode": mode.name})
                    tally.refused.append(f"commit refused: {e}")
                    break
                ref_rows = plain(model, ref, [tree.tokens[j] for j in path])
                committed.append(path)
                if r == 0 and exact and verify_differs is None and not mx.array_equal(
                        logits[mx.array(path)], ref_rows).item():
                    verify_differs = path
            else:
                where = {"history": hist.label(w), "mode": mode.name, "committed": committed}
                chunks = [[rng.randrange(v)] for _ in range(2)] + [[rng.randrange(v) for _ in range(3)],
                                                                    [rng.randrange(v)]]
                for k, chunk in enumerate(chunks):
                    a, b = plain(model, ours, chunk), plain(model, ref, chunk)
                    tally.compare(a, b, {**where, "step": k, "tokens": chunk},
                                  None if exact else KEY_ORDER_BOUND)
                if not exact:
                    tally.note("root-only commits on a wrapped window compared within "
                               f"{KEY_ORDER_BOUND:g} (DESIGN.md key order)")
    if linear_only:
        tally.note(f"linear trees only: the adapter refuses branching trees ({linear_only})")
    if tally.refused:
        tally.note(f"{len(tally.refused)} commits refused ({tally.refused[0]})")
    if tally.failures and verify_differs is not None:
        tally.note(f"the verify rows along path {verify_differs} already differed from the "
                   "reference's (see tree-verify)")
    return tally.check(f"rollback[{mode.name}]", "later decode steps")


def check_walk_linear(s: Subject) -> List[Check]:
    """On linear trees the walk accepts and emits exactly what mlx-lm's
    chain accept loop does, at every accept length (contract 2)."""
    walk, source = the_walk(s)
    rng = random.Random(f"{s.options.seed}:walk-linear")
    tally = _Tally(s.options)
    for n in range(0, 9):
        for accept in range(0, n + 1):
            drafts = [rng.randrange(16) for _ in range(n)]
            targets = drafts[:accept]
            if accept < n:
                targets.append((drafts[accept] + 1 + rng.randrange(15)) % 16)
            targets += [rng.randrange(16) for _ in range(n + 1 - len(targets))]
            tree = DraftTree.linear([rng.randrange(16)] + drafts)
            want = chain_walk(drafts, targets)
            try:
                got = walk(tree, targets)
                got = (tuple(got.path), tuple(got.emitted))
            except Exception as e:  # a walk that crashes fails the property
                got = f"{type(e).__name__}: {e}"
            if got == (want.path, want.emitted):
                tally.count += 1
            else:
                tally.fail({"message": f"drafts {drafts}, targets {targets}: {source} gave "
                            f"{_walk_str(got)}, the chain walk path {list(want.path)} "
                            f"emitted {list(want.emitted)}"})
    check = tally.check("walk-linear", "linear walks")
    if check.status == PASS:
        check.detail = (f"{tally.count} linear walks (0-8 drafts, every accept length) by "
                        f"{source} equal mlx-lm's chain accept loop")
    return [check]


def _walk_str(got) -> str:
    if isinstance(got, str):
        return got
    return f"path {list(got[0])} emitted {list(got[1])}"


def walk_violation(tree: DraftTree, targets: Sequence[int], path, emitted) -> Optional[str]:
    """Why (path, emitted) is not the greedy descent of contract 3 (a root
    path; at each node the FIRST child carrying the target's token; stop when
    none does; emit the accepted tokens then the target's token), or None."""
    path, emitted = list(path), list(emitted)
    if not path or path[0] != 0:
        return f"path {path} does not start at the root"
    for a, b in zip(path, path[1:]):
        if not 0 <= b < len(tree) or tree.parents[b] != a:
            return f"path {path} is not a root path (node {b} is not a child of {a})"
    for a, b in zip(path, path[1:]):
        first = next((c for c in tree.children(a) if tree.tokens[c] == targets[a]), None)
        if first is None:
            return f"at node {a} the walk took child {b} though no child carries the target's {targets[a]}"
        if b != first:
            return (f"at node {a} the walk took child {b}, but child {first} comes first with "
                    f"the same token {targets[a]} (first child wins)")
    last = path[-1]
    match = [c for c in tree.children(last) if tree.tokens[c] == targets[last]]
    if match:
        return f"the walk stopped at node {last} though child {match[0]} carries the target's {targets[last]}"
    want = [tree.tokens[i] for i in path[1:]] + [targets[last]]
    if emitted != want:
        return f"emitted {emitted}, expected the accepted tokens then the target's: {want}"
    return None


def check_walk_siblings(s: Subject) -> List[Check]:
    """Random branching trees over a 3-token vocabulary (duplicate siblings
    everywhere): the walk is the greedy descent, first child wins (contract 3)."""
    walk, source = the_walk(s)
    rng = random.Random(f"{s.options.seed}:walk-siblings")
    tally = _Tally(s.options)
    for k in range(300):
        tree = random_tree(rng, 3, rng.randrange(2, 16), ("random", "mixed", "fan")[k % 3])
        targets = []
        for i in range(len(tree)):
            kids = tree.children(i)
            targets.append(tree.tokens[rng.choice(kids)] if kids and rng.random() < 0.8
                           else rng.randrange(3))
        try:
            got = walk(tree, targets)
            why = walk_violation(tree, targets, got.path, got.emitted)
        except Exception as e:
            why = f"the walk raised {type(e).__name__}: {e}"
        if not why:
            tally.count += 1
        else:
            tally.fail({"message": f"tree {list(tree.parents)} tokens {list(tree.tokens)}, "
                        f"targets {targets}: {why}", "tree": list(tree.parents)})
    check = tally.check("walk-siblings", "walks")
    if check.status == PASS:
        check.detail = f"{tally.count} walks over duplicate siblings by {source} are greedy, first child wins"
    return [check]


def _e2e_modes(block: int) -> Dict[str, dict]:
    budget = max(2, 2 * (block - 1))
    return {
        f"chain-b{block}": dict(mode="chain", block=block),
        "tree-2x2x1": dict(mode="tree", branching=[2, 2, 1]),
        f"tree-confidence-b{budget}": dict(mode="tree", budget=budget, width=3),
    }


def e2e_tokens(s: Subject) -> int:
    if s.options.max_tokens:
        return s.options.max_tokens
    w = window(s.model)
    return max(32, w + 16) if w and w <= 48 else 32


def drafter_note(s: Subject) -> str:
    if s.draft_model is not None:
        return str(s.draft_name or "the given draft model")
    return ("the target itself (no --draft-model): it drafts its own greedy tokens, so "
            "rounds rarely reject; rollback[...] covers rejections")


@contextmanager
def routed(s: Subject):
    """While active, treespec.decode and treespec.gate use the audited
    adapter (and walk) for the target, and the drafter falls back to it for a
    family adapter_for refuses. A stand-in for ``adapter=``/``walk=``
    parameters those functions do not take; everything is put back."""
    walk = the_walk(s)[0]
    if not s.custom and walk is tree_walk:
        yield
        return
    from . import decode as dec
    from . import draft as drf
    from . import gate as gt

    target, factory = s.model, s.factory

    def for_target(model, *a, **k):
        return factory(model) if model is target else adapter_for(model, *a, **k)

    def for_drafter(model, *a, **k):
        try:
            return adapter_for(model, *a, **k)
        except TreeRefused:
            if not s.custom:
                raise
            return factory(model)

    saved = [(dec, "adapter_for"), (gt, "adapter_for"), (drf, "adapter_for"), (dec, "tree_walk")]
    saved = [(m, a, getattr(m, a)) for m, a in saved]
    try:
        dec.adapter_for, gt.adapter_for, drf.adapter_for = for_target, for_target, for_drafter
        dec.tree_walk = walk
        yield
    finally:
        for m, a, v in saved:
            setattr(m, a, v)


def check_e2e(s: Subject) -> List[Check]:
    """Temperature 0: chain and tree speculative decoding emit the bytes of
    ``mlx_lm.generate`` (contract 9), one row per decode mode."""
    import mlx_lm

    from .decode import decode, detokenize

    if s.tokenizer is None:
        return [Check("e2e", SKIP, "no tokenizer (an in-memory model): nothing to detokenize")]
    the_adapter(s)
    n = e2e_tokens(s)
    draft = s.draft_model if s.draft_model is not None else s.model
    eos = list(s.tokenizer.eos_token_ids)
    prompts = [s.tokenizer.encode(p) for p in PROMPTS]
    expected = s._memo.setdefault("generate", {})
    for p, ids in zip(PROMPTS, prompts):
        if p not in expected:
            expected[p] = mlx_lm.generate(s.model, s.tokenizer, prompt=ids, max_tokens=n)
    out = []
    for name, kw in _e2e_modes(s.options.block).items():
        t0 = time.perf_counter()
        first, accepted, proposed, refused = None, 0, 0, None
        for k, (p, ids) in enumerate(zip(PROMPTS, prompts)):
            try:
                with routed(s):
                    result = decode(s.model, ids, draft_model=draft, max_tokens=n,
                                    eos_token_ids=eos, gate=False, **kw)
            except TreeRefused as e:
                refused = e.reason
                break
            text = detokenize(s.tokenizer, result.tokens)
            accepted, proposed = accepted + result.stats.accepted, proposed + result.stats.proposed
            if text != expected[p] and first is None:
                at = next((i for i, (a, b) in enumerate(zip(text, expected[p])) if a != b),
                          min(len(text), len(expected[p])))
                first = {"prompt": k, "position": at, "expected": expected[p][max(0, at - 8):at + 16],
                         "got": text[max(0, at - 8):at + 16],
                         "message": f"prompt {k}: text differs from char {at}: expected "
                                    f"{expected[p][max(0, at - 8):at + 16]!r}, got "
                                    f"{text[max(0, at - 8):at + 16]!r}"}
        rate = f"{accepted}/{proposed} drafts accepted" if proposed else "no drafts"
        if refused:
            c = Check(f"e2e[{name}]", SKIP, f"the adapter refuses this mode's trees: {refused}")
        elif first is not None:
            status = INEXACT if s.options.allow_inexact else FAIL
            c = Check(f"e2e[{name}]", status, f"{first['message']} ({rate})", first)
        else:
            c = Check(f"e2e[{name}]", PASS, f"{len(PROMPTS)} prompts x {n} tokens byte-identical "
                      f"to mlx_lm.generate ({rate})")
        c.seconds = time.perf_counter() - t0
        out.append(c)
    return out


def probe_shapes(block: int) -> List[tuple]:
    """The shapes the e2e drafters verify (their ``probe_shapes``), in order."""
    from .draft import make_drafter

    shapes = []
    for kw in _e2e_modes(block).values():
        for sh in make_drafter(**kw).probe_shapes():
            if tuple(sh) not in shapes:
                shapes.append(tuple(sh))
    return shapes


def _probe(s: Subject, shapes, context: Optional[int] = None):
    """treespec.gate's measurement of ``shapes`` with the adapter under audit
    (compare_shape, not the memoized gate.probe: its key does not name the
    adapter). Returns (Probe, refused shapes)."""
    from .gate import CONTEXT, Probe, compare_shape, configuration

    context = CONTEXT if context is None else context
    config = configuration(s.model)
    blob = json.dumps([config, shapes, s.adapter_source, context, s.options.draws, s.options.seed])
    probe = Probe(hashlib.sha256(blob.encode()).hexdigest()[:16], config)
    refused = []
    with routed(s):
        for sh in shapes:
            try:
                probe.shapes.append(compare_shape(s.model, sh, draws=s.options.draws,
                                                  seed=s.options.seed, context=context))
            except TreeRefused as e:
                refused.append((sh, e.reason))
    return probe, refused


def _depth(parents) -> int:
    return int(DraftTree([0] * len(parents), parents).depth())


def check_probe(s: Subject) -> List[Check]:
    """treespec.gate's exactness probe (each node of a tree verify vs
    single-token steps over its root path, the way classic decoding computes
    it) over the e2e drafters' shapes, with the adapter under audit.

    On a sliding window the probe's context wraps the ring, and a one-token
    step then sums its keys in ring order (DESIGN.md): a difference there
    with no argmax flip is re-measured before the window wraps; identical
    there, it is reported as the known key-order case (inexact, not a
    failure), with the gate's consequence."""
    from .gate import CONTEXT

    the_adapter(s)
    shapes = probe_shapes(s.options.block)
    probe, refused = _probe(s, shapes)
    s._memo["probe"] = probe
    note = f"; {len(refused)} branching shapes refused ({refused[0][1]})" if refused else ""
    bad = [r for r in probe.shapes if not r.identical]
    ms = sorted({r.m for r in probe.shapes})
    if not bad:
        return [Check("probe", PASS, f"{len(probe.shapes)} shapes (M {ms[0]}-{ms[-1]}) x "
                      f"{s.options.draws} draws bit-identical to single-token steps, 0 argmax "
                      f"flips{note}", max_diff=0.0)]
    first = {"shape": list(bad[0].shape), "node": bad[0].first_node,
             "max_abs_diff": bad[0].max_abs_diff,
             "message": f"M={bad[0].m} shape {','.join(map(str, bad[0].shape))} node {bad[0].first_node}"}
    detail = (f"{len(bad)}/{len(probe.shapes)} shapes differ from single-token steps, max |diff| "
              f"{probe.max_abs_diff:.3g}, {probe.argmax_flips} argmax flips; first: {first['message']}")
    w = window(s.model)
    if w and probe.argmax_flips == 0 and probe.max_abs_diff <= KEY_ORDER_BOUND:
        fits = [sh for sh in shapes if _depth(sh) + 2 <= w]
        depth = max((_depth(sh) for sh in fits), default=0)
        context = w - depth - 1
        if fits and context < CONTEXT:
            before, _ = _probe(s, fits, context)
            s._memo["probe_before_wrap"] = before
            if before.identical:
                return [Check("probe", INEXACT, (
                    f"{detail}; before the window wraps (context {context}) all {len(before.shapes)} "
                    f"shapes are bit-identical: only the known key-order case (a one-token step on "
                    f"a wrapped window sums its keys in ring order; tree-verify checks wrapped "
                    f"windows against time-ordered forwards). treespec.gate declines speculative "
                    f"decoding here unless --allow-inexact{note}"), first, probe.max_abs_diff)]
            bad2 = next(r for r in before.shapes if not r.identical)
            detail += (f"; before the window wraps too: M={bad2.m} shape "
                       f"{','.join(map(str, bad2.shape))} node {bad2.first_node} by {bad2.max_abs_diff:.3g}")
    return [Check("probe", INEXACT if s.options.allow_inexact else FAIL, detail + note, first,
                  probe.max_abs_diff)]


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def _per_mode(fn):
    def run(s: Subject) -> List[Check]:
        modes, why_not = cache_modes(s.model)
        out = []
        for m in modes:
            t0 = time.perf_counter()
            out.append(fn(s, m))
            out[-1].seconds = time.perf_counter() - t0
        if why_not:
            out.append(Check(f"{fn.__name__[6:].replace('_', '-')}[kv-quant]", SKIP, f"n/a: {why_not}"))
        return out

    return run


CHECKS = {
    "adapter": check_adapter,
    "linear-verify": check_linear_verify,
    "tree-verify": _per_mode(check_tree_verify),
    "rollback": _per_mode(check_rollback),
    "walk-linear": check_walk_linear,
    "walk-siblings": check_walk_siblings,
    "e2e": check_e2e,
    "probe": check_probe,
}
NEEDS_ADAPTER = {"linear-verify", "tree-verify", "rollback", "e2e", "probe"}


def check(prop: str, s: Subject) -> List[Check]:
    """Run one property; its rows. A crash is a failure of that property."""
    if prop not in CHECKS:
        raise ValueError(f"unknown property {prop!r}; known: {', '.join(PROPERTIES)}")
    t0 = time.perf_counter()
    if prop in NEEDS_ADAPTER:
        try:
            the_adapter(s)
        except TreeRefused:
            return [Check(prop, SKIP, "no adapter (see the adapter row)")]
    try:
        out = CHECKS[prop](s)
    except Exception as e:
        import traceback

        tb = traceback.extract_tb(e.__traceback__)[-1]
        out = [Check(prop, FAIL, f"crashed: {type(e).__name__}: {e} "
                     f"({Path(tb.filename).name}:{tb.lineno})",
                     {"message": f"{type(e).__name__}: {e}"})]
    dt = time.perf_counter() - t0
    for c in out:
        c.seconds = c.seconds or dt / len(out)
    return out


def header(s: Subject) -> dict:
    from . import blas
    from .gate import configuration

    import mlx_lm

    cfg = configuration(s.model)
    try:
        adapter = repr(the_adapter(s))
    except TreeRefused as e:
        adapter = f"refused: {e.reason}"
    return {
        "model": s.name,
        "model_type": cfg["model_type"],
        "dtypes": cfg["dtypes"],
        "weight_quant": cfg["weight_quant"],
        "weights": cfg["weights"],
        "caches": _cache_summary(s.model),
        "adapter": adapter,
        "adapter_source": s.adapter_source,
        "walk": the_walk(s)[1],
        "drafter": drafter_note(s),
        "blas": blas.describe(blas.detect()),
        "device": cfg["device"],
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "options": asdict(s.options),
    }


def run(s: Subject, properties: Sequence[str] = PROPERTIES) -> Report:
    t0 = time.perf_counter()
    checks = []
    for prop in properties:
        checks += check(prop, s)
    return Report(header(s), checks, s._memo.get("probe"), time.perf_counter() - t0,
                  s._memo.get("probe_before_wrap"))


def audit(model_path, draft_path=None, adapter: Optional[str] = None,
          properties: Sequence[str] = PROPERTIES, **options) -> Report:
    """In-process ``treespec audit``: load, run, return the :class:`Report`."""
    return run(subject(model_path, draft_path, adapter, Options(**options)), properties)


def format_report(report: Report) -> str:
    h = report.header
    quant = f", {'/'.join(h['weight_quant'])} weights" if h["weight_quant"] else ""
    lines = [
        f"treespec audit: {h['model']}",
        f"  model    {h['model_type']} ({', '.join(d.removeprefix('mlx.core.') for d in h['dtypes'])}{quant}); "
        f"caches {h['caches']}",
        f"  adapter  {h['adapter']} from {h['adapter_source']}; walk {h['walk']}",
        f"  drafter  {h['drafter']}",
        f"  BLAS     {h['blas'].removeprefix('BLAS: ')}",
        f"  device   {h['device']}; mlx {h['mlx']}, mlx-lm {h['mlx_lm']}",
        "",
    ]
    width = max([len("property")] + [len(c.name) for c in report.checks])
    lines.append(f"{'property':<{width}}  {'result':<7}  detail")
    lines.append(f"{'-' * width}  {'-' * 7}  {'-' * 6}")
    for c in report.checks:
        lines.append(f"{c.name:<{width}}  {c.status:<7}  {c.detail}")
    if report.probe is not None:
        lines += ["", report.probe.table()]
    if report.probe_before_wrap is not None:
        lines += ["", "before the window wraps:", report.probe_before_wrap.table()]
    counts = {st: sum(c.status == st for c in report.checks) for st in (PASS, INEXACT, SKIP, FAIL)}
    summary = ", ".join(f"{n} {st}" for st, n in counts.items() if n)
    verdict = "PASSED" if report.ok else f"FAILED ({', '.join(report.failed())})"
    lines += ["", f"{verdict}: {summary} in {report.seconds:.1f} s"]
    return "\n".join(lines)


def cmd_audit(args) -> int:
    props = PROPERTIES
    if args.only:
        props = [p.strip() for p in args.only.split(",") if p.strip()]
        unknown = [p for p in props if p not in PROPERTIES]
        if unknown:
            from .cli import CliError

            raise CliError(f"--only: unknown properties {unknown}; known: {', '.join(PROPERTIES)}")
    options = Options(block=args.block, draws=args.draws, seed=args.seed,
                      allow_inexact=args.allow_inexact, tolerance=args.tolerance,
                      max_tokens=args.max_tokens)
    report = run(subject(args.model, args.draft_model, args.adapter, options), props)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(format_report(report))
    return 0 if report.ok else 1


def add_parser(sub):
    p = sub.add_parser(
        "audit",
        help="run the exactness contracts against a checkpoint and its tree adapter",
        description="Audit tree speculative decoding on one mlx-lm checkpoint: adapter, "
        "per-node verify, rollback in every cache mode, walks, end-to-end text and the "
        "exactness probe. Exit status 1 if any property fails.",
    )
    p.add_argument("--model", required=True, help="mlx-lm checkpoint directory to audit")
    p.add_argument("--draft-model", help="drafter checkpoint for the e2e text diff "
                   "(default: the model drafts for itself)")
    p.add_argument("--adapter", help="module:attr of a callable model -> adapter (the "
                   "TreeAdapter interface; a walk(tree, target_tokens) method overrides the walk) "
                   "used instead of treespec.verify.adapter_for")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--block", type=int, default=4, help="chain verify width for the e2e "
                   "chain mode and the probe shapes (default 4)")
    p.add_argument("--allow-inexact", action="store_true", help="accept differences up to "
                   "--tolerance (reported as 'inexact') instead of requiring bit identity")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="max |diff| of logits accepted with --allow-inexact (default 0.05)")
    p.add_argument("--draws", type=int, default=3, help="random trees per cache state (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="e2e length (default: 32, or the sliding window + 16)")
    p.add_argument("--only", help=f"comma-separated subset of: {', '.join(PROPERTIES)}")
    p.set_defaults(func=cmd_audit)
