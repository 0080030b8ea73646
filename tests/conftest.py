"""Test-session setup: 8 simulated CPU devices, set before anything imports jax."""

import os
import pathlib
import sys

# Tiny test programs spend far longer in LLVM than running; level 0 halves compile time.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8"
    + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
