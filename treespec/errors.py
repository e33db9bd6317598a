"""The errors treespec raises on purpose, in one place below every module.

Each one is raised before anything is written: a refused verify, commit or
option leaves every cache and model as it was (contract 8). Each message
names what was refused (the family, the cache mode and layer, the argument
or flag) and why.
"""

from typing import Optional


class TreeError(ValueError):
    """A malformed tree. The message names the offending node."""


class TreeRefused(ValueError):
    """This model, cache state or tree cannot be tree-verified. Names the
    family and the reason; the caches are unchanged."""

    def __init__(self, family: str, reason: str):
        super().__init__(f"tree verify refused for model_type {family!r}: {reason}")
        self.family = family
        self.reason = reason


class RollbackRefused(ValueError):
    """A commit that cannot be exact, raised before any cache is modified.

    ``cache_class`` and ``layer`` name the cache that refused (None when the
    path itself is at fault); ``sub`` is the index inside a CacheList."""

    def __init__(self, reason: str, cache_class: Optional[str] = None, where=()):
        self.reason = reason
        self.cache_class = cache_class
        self.layer = where[0] if where else None
        self.sub = tuple(where[1:])
        at = ""
        if cache_class is not None:
            at = f"{cache_class} at layer {self.layer}"
            at += "".join(f", CacheList entry {j}" for j in self.sub) + ": "
        super().__init__(f"rollback refused: {at}{reason}")


class SamplingRefused(ValueError):
    """A sampling option sampled tree verification cannot honour exactly."""


class OptionError(ValueError):
    """An option that cannot act as given: out of range, or meaningless in the
    chosen mode (treespec.options). The message spells the option as its
    caller did: the keyword argument, or the command-line flag."""


class UsageError(Exception):
    """A user-facing error of the command line (a flag, a path, a pair of
    checkpoints): printed without a traceback, exit status 2."""
