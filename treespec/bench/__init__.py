"""``treespec bench``: throughput of classic, chain, tree, auto and mlx-lm's own
speculative decoding, each figure beside the exactness checks of the same run;
and the timing helpers the benchmarks share."""
