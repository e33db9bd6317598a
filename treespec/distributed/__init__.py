"""A target sharded across processes with MLX's own distributed engine
(``mlx.launch``, ``mx.distributed``, mlx-lm's tensor-parallel
``shard(group)``): every rank verifies the same tree, walks the same path
and commits the same rows (docs/distributed.md).

``flags`` (light): ``--sharded [tensor|pipeline]`` and ``--check-ranks`` of
generate, bench and audit. ``lockstep`` (pure): one round as a row of
integers, and which rank disagrees. ``group``: joining the launcher's group,
the ranks' agreement on what they run and on what they found, and the
per-round rank check. ``shard``: sharding a model tensor-parallel or by
layers, or loading a checkpoint sharded (mlx-lm's ``sharded_load``), with the
reasons a model cannot be.
"""
