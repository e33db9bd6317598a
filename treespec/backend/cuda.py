"""MLX's CUDA backend and cuDNN attention: why treespec turns it off.

On CUDA, MLX runs an attention over several query tokens through a cuDNN
graph that it builds on the host and caches (LRU, 256 entries unless
``MLX_CUDA_SDPA_CACHE_SIZE`` says otherwise) under the exact q/k/v shapes, so
under the kv length. A speculative round's multi-token forwards (the verify,
the drafter's catch-up) meet a kv length no earlier round met, so every round
builds graphs: on the H200 that made speculative rounds several times slower
per token than without cuDNN attention (docs/numerics.md#tf32-and-cudnn-attention-on-cuda;
``results/h200-scaled/probes/sdpa_cache_probe.py`` measured it). Repeating the same lengths hides
it, which is what a benchmark that reruns one prompt measures.
``MLX_CUDA_USE_CUDNN_SDPA=0`` sends those forwards to MLX's own kernels; MLX
reads it once, at the first attention.

treespec's command line sets it to 0 on CUDA unless the caller set it, and
says so; the library leaves the environment alone and warns instead.
"""

import os
import warnings
from typing import MutableMapping, Optional

import mlx.core as mx

CUDNN_SDPA = "MLX_CUDA_USE_CUDNN_SDPA"
WHY = ("cuDNN attention builds a graph for every kv length a multi-token forward meets, and a "
       "speculative round meets a new one every round (on the H200 it made chain rounds several "
       "times slower per token; docs/numerics.md#tf32-and-cudnn-attention-on-cuda)")


class CudnnAttentionWarning(RuntimeWarning):
    """Speculative decoding on MLX CUDA with cuDNN attention enabled."""


def cuda_backend() -> bool:
    return bool(getattr(mx, "cuda", None) and mx.cuda.is_available())


def _resolve(environ, cuda):
    """The defaults of the functions below: this process's environment and backend."""
    return (os.environ if environ is None else environ,
            cuda_backend() if cuda is None else cuda)


def cudnn_attention_on(environ: MutableMapping[str, str]) -> bool:
    """MLX's reading of the variable: unset means on, an integer means itself."""
    value = environ.get(CUDNN_SDPA, "").strip()
    if not value:
        return True
    try:
        return int(value) != 0
    except ValueError:
        return True  # MLX would refuse to start; not ours to judge here


def prefer_mlx_attention(environ: Optional[MutableMapping[str, str]] = None,
                         cuda: Optional[bool] = None) -> Optional[str]:
    """For the command line, before the first forward: on CUDA, with the
    variable unset, set it to 0. Returns what was done (None off CUDA)."""
    environ, cuda = _resolve(environ, cuda)
    if not cuda or CUDNN_SDPA in environ:
        return None
    environ[CUDNN_SDPA] = "0"
    return f"{CUDNN_SDPA}=0 set by treespec: {WHY}"


def describe(environ: Optional[MutableMapping[str, str]] = None,
             cuda: Optional[bool] = None) -> Optional[str]:
    """One line for a report on CUDA (None elsewhere)."""
    environ, cuda = _resolve(environ, cuda)
    if not cuda:
        return None
    if cudnn_attention_on(environ):
        return (f"cuDNN attention ON ({CUDNN_SDPA}={environ.get(CUDNN_SDPA, 'unset')}): "
                f"speculative timings hold only while kv lengths repeat")
    return f"cuDNN attention off ({CUDNN_SDPA}={environ[CUDNN_SDPA]})"


def warn_if_cudnn_attention(environ: Optional[MutableMapping[str, str]] = None,
                            cuda: Optional[bool] = None) -> bool:
    """Called by speculative decoding: warns (once per call site, Python's
    default) when cuDNN attention is on under CUDA. Returns whether it warned."""
    environ, cuda = _resolve(environ, cuda)
    if not cuda or not cudnn_attention_on(environ):
        return False
    warnings.warn(f"{WHY}; set {CUDNN_SDPA}=0 before the first forward (treespec's command "
                  f"line does)", CudnnAttentionWarning, stacklevel=3)
    return True
