"""Where a train step's time goes, for `python -m maelm_jax.bench kernels`: `trace_files`
traces the real step and reads the trace back, `summary` sums it up by kernel and category.
It sits above the loop it times (training/); a run's own trace window is the loop's
(`training.profile_window`)."""
