"""Which zoo families mlx-lm can shard, and the refusal of those it cannot.

mlx-lm decides what can be sharded: a model class with ``shard(group)`` can be
split tensor-parallel, one whose ``model`` has ``pipeline(group)`` can be split
by layers (mlx_lm.utils.sharded_load reads the same two attributes). These
tests read mlx-lm's classes, not treespec's code: every family mlx-lm can
shard must be a target of the sharded contracts (test_sharded.py, or the
pipelined CLI run of test_cli.py), and every family it cannot must be refused
with the reason, by treespec and by mlx-lm's own sharded_load, before anything
runs. In-process: the refusals come before any collective, so a group of one
(``mx.distributed.init()`` outside mlx.launch) is enough to ask.
"""

import mlx.core as mx
import pytest

from treespec import zoo
from treespec.distributed import shard
from treespec.distributed.flags import PIPELINE, TENSOR
from treespec.errors import OptionError

from .test_cli import PIPELINE_CLI_FAMILY
from .test_sharded import TARGETS

pytestmark = pytest.mark.exactness


def mlx_lm_can(family: str, how: str) -> bool:
    """mlx-lm's own answer, read off its model class as sharded_load reads it."""
    model = zoo.build(family)
    if how == TENSOR:
        return hasattr(model, "shard")
    return hasattr(getattr(model, "model", None), "pipeline")


CASES = [(f, how) for f in zoo.FAMILIES for how in (TENSOR, PIPELINE)]


def test_every_zoo_family_mlx_lm_can_shard_is_a_target_of_the_sharded_contracts():
    """When mlx-lm learns to shard another zoo family (or forgets one), this
    fails until the suite covers it (or refuses it)."""
    covered = {(t["family"], t["how"]) for t in TARGETS.values()}
    covered.add((PIPELINE_CLI_FAMILY, PIPELINE))
    assert covered == {(f, how) for f, how in CASES if mlx_lm_can(f, how)}


@pytest.mark.parametrize("family,how", [c for c in CASES if not mlx_lm_can(*c)],
                         ids=lambda v: str(v))
def test_a_family_mlx_lm_cannot_shard_that_way_is_refused_with_the_reason(family, how):
    """Refused by treespec's shard (the model's module and what it lacks) and
    by its checkpoint loader (mlx-lm's sharded_load's own reason), each one
    line naming the flag; the model is left unsharded."""
    model = zoo.build(family)
    layers = len(model.layers)
    why = shard.refusal(model, how)
    assert why is not None and why.startswith("--sharded")
    assert type(model).__module__ in why and ("shard(group)" if how == TENSOR
                                              else "pipeline(group)") in why
    group = mx.distributed.init()  # a group of one: the refusal comes first
    with pytest.raises(OptionError, match="^--sharded") as e:
        shard.shard(model, group, how)
    assert len(model.layers) == layers
    with pytest.raises(OptionError) as loaded:
        shard.load(zoo.checkpoint(family), group, how=how)
    said = str(loaded.value)
    assert said.startswith("--sharded") and "\n" not in said
    assert ("does not support tensor parallelism" if how == TENSOR
            else "does not support pipelining") in said, said
    assert str(e.value) == why
