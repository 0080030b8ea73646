"""An importable `mpi4py`, as NVIDIA's containers ship one: on PYTHONPATH it makes JAX's
opt-in Mpi4pyCluster detector report itself present (it only looks for the package), the
machine a single-host run must not take for a cluster (hardware/distributed.py)."""
