"""The GPU measurements behind docs/results.md: the real train step per config
(`jax_speed`), `bench kernels` without TensorFlow (`kernel_table`), the relative bias's
pieces and kernel against cuDNN's (`bias_speed`, `relative_kernel_speed`, sharing
`layer_bench`'s inputs), and HuggingFace PyTorch peers (`torch_peer`).
`bash launch/gpu/bench.sh OUT` runs them in named, time-limited parts."""
