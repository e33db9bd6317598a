"""Sharding a target with mlx-lm's own code: ``model.shard(group)``, tensor
parallel (each rank holds a slice of every layer's heads and channels, and
two all-reduces per layer join them). Checkpoints load through mlx-lm's
``sharded_load``. A model mlx-lm cannot shard this way is refused with the
reason, naming the flag; nothing is loaded halfway and used.

mlx-lm's other way, ``pipeline(group)`` (whole layers per rank), is not
offered: its one trial here (qwen3_5, two local ranks) did not finish in 16
minutes, and nothing has shown that its rounds stay in step
(docs/distributed.md#not-offered).
"""

from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import sharded_load

from ..checkpoints import checkpoint_problem
from ..errors import OptionError
from ..models import model_type

FLAG = "--sharded"


def refusal(model) -> "str | None":
    """Why mlx-lm cannot shard ``model`` tensor-parallel, or None."""
    if not hasattr(model, "shard"):
        return (f"{FLAG}: {type(model).__module__} has no shard(group): mlx-lm does not shard "
                "this family tensor-parallel")
    return None


def shard(model, group):
    """``model`` sharded in place over ``group``, evaluated; OptionError
    naming the flag where mlx-lm cannot."""
    why = refusal(model)
    if why is not None:
        raise OptionError(why)
    try:
        model.shard(group)
    except (ValueError, AssertionError, IndexError) as e:  # mlx-lm's own checks (divisibility)
        raise OptionError(f"{FLAG}: mlx-lm's {model_type(model)} cannot be sharded over "
                          f"{group.size()} ranks: {e or type(e).__name__}")
    mx.eval(model.parameters())
    return model


def load(path, group, role: str = "model"):
    """(model, tokenizer) of the checkpoint at ``path``, sharded over
    ``group`` by mlx-lm's ``sharded_load``; OptionError naming ``--role`` or
    the flag."""
    p = Path(path)
    if not p.is_dir():
        raise OptionError(f"--{role} {path}: not an mlx-lm checkpoint directory")
    why = checkpoint_problem(p)
    if why is not None:
        raise OptionError(f"--{role} {path}: {why}")
    try:
        return sharded_load(str(p), tensor_group=group)
    except (ValueError, AssertionError) as e:  # 'does not support tensor parallelism', heads
        raise OptionError(f"{FLAG}: --{role} {path} cannot be sharded by mlx-lm's "
                          f"sharded_load over {group.size()} ranks: {e}")
