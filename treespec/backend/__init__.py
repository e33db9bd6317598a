"""What the running backend computes, measured on MLX alone: which BLAS multiplies,
MLX CUDA's attention choice, whether quantized products are sound, whether a
sliding-window ring's rows are computed alike. Below everything that judges exactness."""
