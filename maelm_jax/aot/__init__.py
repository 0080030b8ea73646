"""Ahead-of-time compiles for TPU slices from a CPU host: memory, FLOPs, the largest batch."""
