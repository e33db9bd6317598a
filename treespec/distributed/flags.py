"""The sharding flags of ``treespec generate``, ``bench`` and ``audit``, and
their checks. Light (argparse and treespec.errors only): the command line
parses and checks them before MLX or mlx-lm is imported.

``--sharded`` (or ``--sharded tensor``): mlx-lm's tensor parallelism,
``model.shard(group)``. ``--sharded pipeline``: mlx-lm's pipeline
parallelism, ``model.model.pipeline(group)`` (whole layers per rank).
``--check-ranks`` (generate only): the per-round comparison of the ranks.
"""

from ..errors import UsageError

FLAG = "--sharded"
TENSOR, PIPELINE = "tensor", "pipeline"
WAYS = (TENSOR, PIPELINE)
CHECK_FLAG = "--check-ranks"


def add(parser, check_ranks: bool = False) -> None:
    """``--sharded [tensor|pipeline]`` on ``parser``, and ``--check-ranks``
    where the command has rounds to compare (generate)."""
    parser.add_argument(FLAG, nargs="?", const=TENSOR, choices=WAYS, default=None,
                        help="under mlx.launch: shard the target across the ranks with mlx-lm's "
                        "own code: tensor (the default: shard(group), each rank a slice of every "
                        "layer) or pipeline (pipeline(group), whole layers per rank), loaded by "
                        "sharded_load; the drafter stays whole on every rank; rank 0 prints")
    if check_ranks:
        parser.add_argument(CHECK_FLAG, action="store_true",
                            help="with --sharded: compare every round's path and emitted tokens "
                            "across the ranks (one small all-gather per round)")


def way(args):
    """The sharding asked for ('tensor', 'pipeline') or None; UsageError
    where ``--check-ranks`` comes without ``--sharded``."""
    how = getattr(args, "sharded", None)
    if getattr(args, "check_ranks", False) and how is None:
        raise UsageError(f"{CHECK_FLAG} compares the ranks of a sharded target: give "
                         f"{FLAG} (under mlx.launch)")
    return how


def refuse_with(how, flag: str, why: str, fix: str = "") -> None:
    """UsageError naming ``flag`` where a sharded run (``how`` not None)
    meets an option that would let the ranks take different forwards."""
    if how is not None:
        raise UsageError(f"{flag}: {why}, and with {FLAG} every rank must run the same "
                         f"forwards in the same order" + (f": {fix}" if fix else ""))
