"""What is audited: the model, its tokenizer and drafter, and the adapter
factory and walk under audit (treespec's own, or ``--adapter module:attr``)."""

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from ..checkpoints import check_same_tokenizer, load_checkpoint
from ..errors import OptionError, TreeRefused, UsageError
from ..heads.load import load_head
from ..models import vocab_size
from ..verify import adapter_for
from ..walk import tree_walk
from .records import Options


@dataclass
class Subject:
    """What is audited: a model, how to get its adapter, and the drafter."""

    model: Any
    tokenizer: Any = None
    name: str = "model"
    draft_model: Any = None  # None: the target drafts for itself
    draft_name: Optional[str] = None
    draft_head: Any = None  # a hidden-state head (treespec.heads) drafting the e2e rows
    factory: Callable = adapter_for  # model -> adapter
    adapter_source: str = "treespec.verify.adapter_for"
    options: Options = field(default_factory=Options)
    # where mlx_lm.load gives this very model (its census runs in child
    # processes that load it there); None: loaded otherwise (sharded, in memory)
    checkpoint: Optional[str] = None
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def custom(self) -> bool:
        return self.factory is not adapter_for


def load_adapter(spec: str) -> Callable:
    """``module:attr`` (or ``path/to/file.py:attr``) -> the callable there."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise UsageError(f"--adapter {spec!r}: expected module:attr, e.g. mypkg.adapters:make")
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
        raise UsageError(f"--adapter {spec!r}: {type(e).__name__}: {e}")
    if not callable(obj):
        raise UsageError(f"--adapter {spec!r}: {type(obj).__name__} is not callable (model -> adapter)")
    return obj


def subject(model_path, draft_path=None, adapter: Optional[str] = None,
            options: Optional[Options] = None, load: Callable = load_checkpoint,
            head: Optional[str] = None) -> Subject:
    """Load the checkpoints (mlx_lm.load; the target through ``load(path,
    "model")``, e.g. sharded across ranks), the adapter factory and
    ``head`` (a ``--draft-head`` spec: treespec.heads.load.load_head)."""
    factory, source = adapter_for, "treespec.verify.adapter_for"
    if adapter is not None:  # first: a bad spec fails before any load
        factory, source = load_adapter(adapter), adapter
    model, tokenizer = load(model_path, "model")
    draft = None
    if draft_path is not None:
        draft, draft_tok = load_checkpoint(draft_path, "draft-model")
        check_same_tokenizer(tokenizer, draft_tok, model, draft)
    found = None
    if head is not None:
        try:
            found = load_head(head, model, model_path)
        except OptionError as e:
            raise UsageError(str(e))
    return Subject(model, tokenizer, str(model_path), draft,
                   head if head is not None else draft_path and str(draft_path),
                   found, factory, source, options or Options(),
                   str(model_path) if load is load_checkpoint else None)


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


def draft_adapter(s: Subject, model):
    """The adapter a drafter uses for ``model``: treespec's own, or, for a
    family treespec refuses, the one under audit."""
    try:
        return adapter_for(model)
    except TreeRefused:
        if not s.custom:
            raise
        return s.factory(model)


def vocab(s: Subject) -> int:
    """The subject's logit width (read once)."""
    if "vocab" not in s._memo:
        s._memo["vocab"] = vocab_size(s.model)
    return s._memo["vocab"]


def window(model) -> Optional[int]:
    """The smallest sliding window among the model's own caches, if any."""
    sizes = [c.max_size for c in make_prompt_cache(model) if isinstance(c, RotatingKVCache)]
    return min(sizes) if sizes else None


def cache_summary(model) -> str:
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
