"""The machines: TPU chips and peaks, JAX platforms, processes of a multi-host run."""
