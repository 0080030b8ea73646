"""Where a train step's time goes, by kernel and category (`python -m maelm_jax.bench
kernels`): `trace_files` traces the real step and reads the trace, `summary` sums it up."""
