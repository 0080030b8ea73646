"""Peak dense matmul FLOP/s per device, by JAX's `device_kind`: the one table MFU divides by.

TPU rows come from `tpu_chips` (bf16). JAX's default matmul precision on TPU runs float32
matmuls as one bf16 pass, so a float32 model's peak is the bf16 one. On NVIDIA GPUs JAX's
default precision lets float32 matmuls use TF32 tensor cores (A100 and later), so the
float32 column is the dense TF32 peak. Published dense (no sparsity) numbers: SXM parts by
their family name, the PCIe and NVL cards (lower clocks and power) by their own, which JAX's
`device_kind` carries ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL").
CPUs have no entry: there MFU needs a peak from the user (`config.peak_flops_per_device`).
"""

import dataclasses

from maelm_jax.hardware import tpu_chips


@dataclasses.dataclass(frozen=True)
class Peak:
    bfloat16: float
    float32: float


def _tpu(name: str) -> Peak:
    bf16 = tpu_chips.CHIPS[name].peak_bf16_flops
    return Peak(bf16, bf16)


# device_kind prefix -> peak; the longest matching prefix wins ("TPU v5 lite" before "TPU v5").
PEAKS = {
    "TPU v4": _tpu("v4"),
    "TPU v5 lite": _tpu("v5e"),
    "TPU v5e": _tpu("v5e"),
    "TPU v5p": _tpu("v5p"),
    "TPU v5": _tpu("v5p"),
    "TPU v6 lite": _tpu("v6e"),
    "TPU v6e": _tpu("v6e"),
    "NVIDIA A100": Peak(312e12, 156e12),
    "NVIDIA H100": Peak(989e12, 495e12),
    "NVIDIA H100 PCIe": Peak(756e12, 378e12),
    "NVIDIA H100 NVL": Peak(835e12, 418e12),
    "NVIDIA H200": Peak(989e12, 495e12),
    "NVIDIA H200 NVL": Peak(835e12, 418e12),
    "NVIDIA GH200": Peak(989e12, 495e12),
    "NVIDIA B200": Peak(2250e12, 1100e12),
    "NVIDIA L4": Peak(121e12, 60e12),
}


def peak_flops(device_kind: str, dtype: str) -> float | None:
    """Peak FLOP/s of one device of `device_kind` computing in `dtype` ("bfloat16" or
    "float32"); None for a device the table does not know (CPUs)."""
    matches = [kind for kind in PEAKS if device_kind.startswith(kind)]
    if not matches:
        return None
    return getattr(PEAKS[max(matches, key=len)], dtype)
