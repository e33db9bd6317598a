"""Reading a head's tensors from safetensors files, beside ``mlx_lm.load``.

mlx-lm's loaders drop tensors they have no module for (Qwen 3.5 / Qwen3-Next
sanitize removes every ``mtp.`` tensor), so a head reads its own from the
checkpoint's files: the ones ``model.safetensors.index.json`` lists for the
wanted names, or, without an index, every ``model*.safetensors`` (the files
``mlx_lm.load`` reads). Nothing here changes a file or a model.
"""

import glob
import json
from pathlib import Path
from typing import Dict, Tuple

import mlx.core as mx

__all__ = ["read_prefixed", "read_file"]

# safetensors metadata "format": mlx-lm's save_model writes "mlx"; a
# checkpoint saved by PyTorch (a hub release) says "pt".
MLX_FORMAT = "mlx"


def _files_for(model_dir: Path, prefix: str):
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        names = sorted({f for k, f in weight_map.items() if k.startswith(prefix)})
        return [model_dir / n for n in names]
    return [Path(p) for p in sorted(glob.glob(str(model_dir / "model*.safetensors")))]


def read_file(path: Path) -> Tuple[Dict[str, mx.array], str]:
    """Every tensor of one safetensors file, and its metadata "format"."""
    weights, metadata = mx.load(str(path), return_metadata=True)
    return weights, (metadata or {}).get("format", "")


def read_prefixed(model_dir, prefix: str) -> Tuple[Dict[str, mx.array], Dict[str, str]]:
    """The tensors of ``model_dir`` whose names start with ``prefix`` (names
    kept whole), and for each the "format" of the file it came from."""
    model_dir = Path(model_dir)
    out, formats = {}, {}
    for path in _files_for(model_dir, prefix):
        if not path.exists():
            continue
        weights, fmt = read_file(path)
        for name, value in weights.items():
            if name.startswith(prefix):
                out[name] = value
                formats[name] = fmt
    return out, formats
