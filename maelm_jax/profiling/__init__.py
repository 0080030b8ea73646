"""Where a train step's time goes. `capture` records an XProf trace of a window of a run's
steps (`config.profile_num_steps`); `trace_files` traces the real step for `python -m
maelm_jax.bench kernels` and reads the trace back, `summary` sums it up by kernel and
category."""
