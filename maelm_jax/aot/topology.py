"""libtpu's compile-only devices: a TPU slice to compile for on a machine without one."""

import importlib.util
import os

import jax
from jax.experimental import topologies

from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import tpu_chips

# libtpu without a TPU: no metadata server to ask, no peers, and no lock on the library
# (another process, e.g. a test run, may hold it).
_LIBTPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
}


class LibtpuMissingError(RuntimeError):
    """Compiling for TPU needs libtpu even without a TPU."""


def topology_devices(slice_: tpu_chips.Slice, num_slices: int = 1) -> list:
    """Compile-only devices for `num_slices` copies of the slice (one per chip)."""
    if num_slices < 1:
        raise ConfigError(f"num_slices={num_slices} is not allowed; it must be >= 1")
    if not (importlib.util.find_spec("libtpu") or os.environ.get("TPU_LIBRARY_PATH")):
        raise LibtpuMissingError(
            "libtpu is not installed, and compiling for TPU needs it (no TPU needed): "
            'pip install -e ".[tpu]"  or  pip install "jax[tpu]==0.10.2"'
        )
    for key, value in {**_LIBTPU_ENV, "TPU_ACCELERATOR_TYPE": slice_.accelerator_type}.items():
        os.environ.setdefault(key, value)
    shape3 = slice_.shape + (1,) * (3 - len(slice_.shape))
    # Hosts hold up to 2x2x1 chips; a whole number of 4x4x4 cubes is a torus on v4/v5p.
    # Both only steer the compiler's choice of collectives, not memory or FLOPs.
    torus = len(slice_.shape) == 3 and all(s % 4 == 0 for s in slice_.shape)
    # One-core chips (v5e, v6e) have no chip_config_name; libtpu takes no None, so leave it out.
    name = slice_.chip.chip_config_name
    chip_config = {} if name is None else {"chip_config_name": name}
    try:
        topology = topologies.get_topology_desc(
            topology_name=slice_.libtpu_name,
            platform="tpu",
            chips_per_host_bounds=tuple(min(s, h) for s, h in zip(shape3, (2, 2, 1), strict=True)),
            num_slices=num_slices,
            wrap=(torus,) * 3,
            **chip_config,
        )
    except jax.errors.JaxRuntimeError as e:
        raise ConfigError(f"libtpu rejects topology {slice_.libtpu_name!r}: {e}") from e
    return list(topology.devices)
