"""Sharding a target with mlx-lm's own code, one of two ways:

- ``tensor``: ``model.shard(group)``, tensor parallel (each rank holds a
  slice of every layer's heads and channels, and two all-reduces per layer
  join them);
- ``pipeline``: ``model.model.pipeline(group)``, whole layers per rank (the
  last rank the first layers; per forward one send per stage boundary and one
  all-gather of the last hidden state, so every rank computes the logits).

Checkpoints load through mlx-lm's ``sharded_load`` (which reads only the
rank's own layers' files in pipeline mode). A model mlx-lm cannot shard the
way asked is refused with the reason, naming the flag; nothing is loaded
halfway and used.
"""

from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import sharded_load

from ..checkpoints import checkpoint_problem
from ..errors import OptionError
from ..models import model_type
from .flags import FLAG, PIPELINE, TENSOR, WAYS


def _named(how: str) -> str:
    return FLAG if how == TENSOR else f"{FLAG} {how}"


def refusal(model, how: str = TENSOR) -> "str | None":
    """Why mlx-lm cannot shard ``model`` the way ``how`` says, or None."""
    if how not in WAYS:
        raise ValueError(f"sharding must be one of {WAYS}, got {how!r}")
    if how == TENSOR and not hasattr(model, "shard"):
        return (f"{FLAG}: {type(model).__module__} has no shard(group): mlx-lm does not shard "
                "this family tensor-parallel")
    if how == PIPELINE and not hasattr(getattr(model, "model", None), "pipeline"):
        return (f"{FLAG} pipeline: {type(model).__module__} has no model.pipeline(group): "
                "mlx-lm does not split this family's layers across ranks")
    return None


def shard(model, group, how: str = TENSOR):
    """``model`` sharded in place over ``group`` the way ``how`` says,
    evaluated; OptionError naming the flag where mlx-lm cannot."""
    why = refusal(model, how)
    if why is not None:
        raise OptionError(why)
    try:
        if how == TENSOR:
            model.shard(group)
        else:
            model.model.pipeline(group)
    except (ValueError, AssertionError, IndexError) as e:  # mlx-lm's own checks (divisibility)
        raise OptionError(f"{_named(how)}: mlx-lm's {model_type(model)} cannot be sharded over "
                          f"{group.size()} ranks: {e or type(e).__name__}")
    mx.eval(model.parameters())
    return model


def load(path, group, role: str = "model", how: str = TENSOR):
    """(model, tokenizer) of the checkpoint at ``path``, sharded over
    ``group`` by mlx-lm's ``sharded_load`` the way ``how`` says; OptionError
    naming ``--role`` or the flag."""
    if how not in WAYS:
        raise ValueError(f"sharding must be one of {WAYS}, got {how!r}")
    p = Path(path)
    if not p.is_dir():
        raise OptionError(f"--{role} {path}: not an mlx-lm checkpoint directory")
    why = checkpoint_problem(p)
    if why is not None:
        raise OptionError(f"--{role} {path}: {why}")
    if how == PIPELINE and not (p / "model.safetensors.index.json").is_file():
        raise OptionError(f"{_named(how)}: --{role} {path} has no model.safetensors.index.json, "
                          "which mlx-lm's sharded_load reads to load each rank's layers")
    groups = {"tensor_group": group} if how == TENSOR else {"pipeline_group": group}
    try:
        return sharded_load(str(p), **groups)
    except (ValueError, AssertionError) as e:  # 'does not support tensor parallelism', heads
        raise OptionError(f"{_named(how)}: --{role} {path} cannot be sharded by mlx-lm's "
                          f"sharded_load over {group.size()} ranks: {e}")
