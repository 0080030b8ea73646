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
# and VFIO groups exist on many GPU VMs too, so a VFIO TPU is recognised as JAX's own TPU
# detection recognises it (jax/_src/hardware_utils.py): a PCI device of Google's vendor with
# a TPU's device ID. Google's vendor alone is no TPU: GCP's GPU VMs carry gVNIC (1ae0:0042)
# and Google's NVMe disks (1ae0:001f). A TPU VM's runtime environment, or a user forcing
# TPU initialisation, sets one of the variables.
_TPU_DEVICE_FILES = "accel*"
GOOGLE_PCI_VENDOR = "0x1ae0"
# jax 0.10.2's `_TPU_PCI_DEVICE_IDS`: v3, an unnamed one, v4, v5p, v5e, v6e, TPU7x. JAX's
# list is private, so a copy is kept, and a newer JAX's own is added where it can be read:
# a later TPU generation that only JAX knows is still no "absent TPU".
_TPU_PCI_DEVICE_IDS = frozenset(
    {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"}
)
_TPU_ENV_VARS = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "TPU_WORKER_ID",
    "TPU_NAME",
    "JAX_FORCE_TPU_INIT",
)
# JAX's own test for a visible NVIDIA GPU (`hardware_utils.has_visible_nvidia_gpu`); without
# one it skips its "cuda" backend and runs on the CPU.
_NVIDIA_DEVICE_FILES = ("nvidia0", "nvidiactl", "dxg")
PCI_DEVICES = "/sys/bus/pci/devices"


def tpu_pci_device_ids() -> frozenset[str]:
    try:
        from jax._src import hardware_utils

        return _TPU_PCI_DEVICE_IDS | frozenset(hardware_utils._TPU_PCI_DEVICE_IDS)
    except (ImportError, AttributeError, TypeError):
        return _TPU_PCI_DEVICE_IDS


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip().lower()
    except OSError:
        return ""


def tpu_pci_device_present(sysfs: str = PCI_DEVICES) -> bool:
    tpus = tpu_pci_device_ids()
    return any(
        _read(os.path.join(device, "vendor")) == GOOGLE_PCI_VENDOR
        and _read(os.path.join(device, "device")) in tpus
        for device in glob.glob(os.path.join(sysfs, "*"))
    )


def tpu_may_be_present(sysfs: str = PCI_DEVICES, dev: str = "/dev") -> bool:
    """True unless no TPU device file, no TPU on the PCI bus and no TPU environment
    variable exists."""
    if any(os.environ.get(name) for name in _TPU_ENV_VARS):
        return True
    if glob.glob(os.path.join(dev, _TPU_DEVICE_FILES)):
        return True
    return tpu_pci_device_present(sysfs)


def cpu_only(sysfs: str = PCI_DEVICES, dev: str = "/dev") -> str | None:
    """Why JAX will run on the CPU alone here, or None where a GPU or TPU is in reach. Told
    from the config, the plugins and the device files, before any backend starts: a GPU's
    start claims most of its memory, and the run that follows starts its own."""
    chosen = jax.config.jax_platforms
    if chosen and set(chosen.split(",")) <= {"cpu"}:
        return f"JAX_PLATFORMS={chosen}"
    if tpu_may_be_present(sysfs, dev):
        return None
    backends = non_tpu_platforms(dev).split(",")
    if "rocm" in backends:
        return None
    if any(os.path.exists(os.path.join(dev, name)) for name in _NVIDIA_DEVICE_FILES):
        return None if "cuda" in backends else "an NVIDIA GPU, but no JAX CUDA plugin"
    return "no GPU or TPU is visible"


def kernel_platform(device) -> str:
    """What decides which kernels a device runs: "tpu", "cpu", "gpu" for an NVIDIA GPU and
    "rocm" for an AMD one (JAX names both "gpu"; cuDNN and Triton-on-CUDA exist on the
    first only)."""
    if device.platform == "gpu" and "rocm" in device.client.platform_version.lower():
        return "rocm"
    return device.platform


def non_tpu_platforms(dev: str = "/dev") -> str:
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
    if any(name.startswith("xla_rocm") for name in plugins) and os.path.exists(
        os.path.join(dev, "kfd")
    ):
        names.append("rocm")
    return ",".join([*names, "cpu"])


def skip_absent_tpu() -> None:
    """Keeps JAX from trying the TPU backend where there is none; call before anything
    asks JAX for devices (backends start once, on first use)."""
    if jax.config.jax_platforms or tpu_may_be_present():
        return
    jax.config.update("jax_platforms", non_tpu_platforms())
