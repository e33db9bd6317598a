"""What a command sets in its own process before the first forward: MLX
CUDA's attention choice (treespec.backend.cuda) and the CPU BLAS (treespec.backend.blas,
which may re-execute the command)."""

import sys

from ..backend.blas import BlasUnavailable, ensure_blas
from ..backend.cuda import prefer_mlx_attention
from ..errors import UsageError


def prepare(blas: str = "auto", quiet: bool = False) -> None:
    if (note := prefer_mlx_attention()) and not quiet:  # MLX reads it once
        print(f"note: {note}", file=sys.stderr)
    if blas != "auto":
        try:
            ensure_blas(blas)  # may re-execute this very command
        except BlasUnavailable as e:
            raise UsageError(str(e))
