"""Target adapters: a whole draft tree verified in one forward of an mlx-lm
model (tree mask and depth positions injected per instance), with refusals
that leave the caches untouched."""

from .adapter import Family, TreeAdapter, TreeRefused
from .for_model import ChainAdapter, adapter_for
from .row_invariant import (CHUNK_ROW_ADAPTER, KERNEL_ROW_ADAPTER, MEMO_NAMES, ROW_ADAPTER,
                            KernelRowAdapter, RowAdapter, chunks_name)
from .attention import injected, tree_injected, tree_mask
from .strategy import ChainOnly, RecurrentStrategy, register_recurrent

__all__ = [
    "CHUNK_ROW_ADAPTER",
    "ChainAdapter",
    "ChainOnly",
    "Family",
    "KERNEL_ROW_ADAPTER",
    "KernelRowAdapter",
    "MEMO_NAMES",
    "ROW_ADAPTER",
    "RecurrentStrategy",
    "RowAdapter",
    "TreeAdapter",
    "TreeRefused",
    "adapter_for",
    "chunks_name",
    "injected",
    "register_recurrent",
    "tree_injected",
    "tree_mask",
]
