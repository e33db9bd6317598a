"""Which CPU BLAS MLX multiplies with (treespec.backend.blas), choosing it, and the verify cost curve."""
