"""Which JAX backends a run asks for: on a machine with no TPU, never the TPU one.

With libtpu installed (the test extra pulls it in), JAX tries the TPU backend first on every
machine. Without TPU chips libtpu prints three initialisation errors ("Failed to find host
bounds for accelerator type", "INVALID_ARGUMENT: unexpected worker hostname", "Unable to
initialize backend 'tpu'") before JAX falls back to the GPU or CPU, and a user reads them as
failures. So before any backend starts, `skip_absent_tpu` sets `jax_platforms` to the other
backends when nothing says a TPU is here. A TPU VM keeps JAX's own choice and every TPU
error it prints; so does a run whose user set JAX_PLATFORMS (or --jax_platforms) themselves.
"""

import glob
import os
import pkgutil

import jax

# TPU chips appear as /dev/accel* (v2-v4) or behind VFIO (v5e and later). /dev/vfio/vfio
# and VFIO groups exist on many GPU VMs too, so a VFIO TPU is recognised by its PCI
# vendor, Google's (0x1ae0), as JAX's own TPU detection does; a TPU VM's runtime
# environment, or a user forcing TPU initialisation, sets one of these variables.
_TPU_DEVICE_GLOBS = ("/dev/accel*",)
GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_ENV_VARS = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "TPU_WORKER_ID",
    "TPU_NAME",
    "JAX_FORCE_TPU_INIT",
)


def google_pci_device_present(sysfs: str = "/sys/bus/pci/devices") -> bool:
    for vendor_file in glob.glob(os.path.join(sysfs, "*", "vendor")):
        try:
            with open(vendor_file) as f:
                if f.read().strip().lower() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def tpu_may_be_present(sysfs: str = "/sys/bus/pci/devices") -> bool:
    """True unless no TPU device file, no Google PCI device and no TPU environment
    variable exists."""
    if any(os.environ.get(name) for name in _TPU_ENV_VARS):
        return True
    if any(glob.glob(pattern) for pattern in _TPU_DEVICE_GLOBS):
        return True
    return google_pci_device_present(sysfs)


def kernel_platform(device) -> str:
    """What decides which kernels a device runs: "tpu", "cpu", "gpu" for an NVIDIA GPU and
    "rocm" for an AMD one (JAX names both "gpu"; cuDNN and Triton-on-CUDA exist on the
    first only)."""
    if device.platform == "gpu" and "rocm" in device.client.platform_version.lower():
        return "rocm"
    return device.platform


def non_tpu_platforms() -> str:
    """The installed GPU plugins, then the CPU, as a `jax_platforms` value ("cuda,cpu").

    JAX skips "cuda" by itself where no NVIDIA GPU is visible; ROCm is listed only where
    an AMD GPU is (/dev/kfd), since an explicitly listed backend that fails is an error.
    """
    try:
        import jax_plugins  # a namespace package, absent without plugins

        plugins = [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    except ImportError:
        plugins = []
    names = []
    if any(name.startswith("xla_cuda") for name in plugins):
        names.append("cuda")
    if any(name.startswith("xla_rocm") for name in plugins) and os.path.exists("/dev/kfd"):
        names.append("rocm")
    return ",".join([*names, "cpu"])


def skip_absent_tpu() -> None:
    """Keeps JAX from trying the TPU backend where there is none; call before anything
    asks JAX for devices (backends start once, on first use)."""
    if jax.config.jax_platforms or tpu_may_be_present():
        return
    jax.config.update("jax_platforms", non_tpu_platforms())
