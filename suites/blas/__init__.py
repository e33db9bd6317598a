"""Which CPU BLAS MLX multiplies with (treespec.blas), choosing it, and the verify cost curve."""
