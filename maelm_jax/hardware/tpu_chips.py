"""TPU chip kinds and slice names: the one table `maelm_jax.compile` reads.

Cloud TPU names a slice `<kind>-<N>` ("v5p-64", "v5litepod-16"), but libtpu's compile-only
topologies want `<generation>:<shape>` ("v5:2x4x4"). For v4 and v5p, N counts TensorCores
(two per chip); JAX sees one device per chip ("megacore"). For v5e and v6e, N counts chips.
Power-of-two sizes get the shapes Cloud TPU gives them; any other slice can be named by its
shape ("v5p:4x4x12").
"""

import dataclasses
import math
import re

from maelm_jax.config.run_config import ConfigError

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class ChipKind:
    name: str
    aliases: tuple[str, ...]  # accepted in slice names; `name` first
    generation: str  # libtpu's topology prefix
    torus_dims: int  # 3: shapes AxBxC, 2: AxB
    cores_per_chip: int  # what N in "<kind>-N" counts per chip
    hbm_bytes: int  # published capacity
    usable_hbm_bytes: int  # what XLA reports as available; `fits` is judged against this
    peak_bf16_flops: float  # per chip, dense
    chip_config_name: str | None  # libtpu's device layout; "megacore": one device per chip


# Published Google Cloud numbers (v5p is listed as "95 GB"); usable HBM is the compiler's
# "available HBM" from its out-of-memory message (libtpu 0.0.42), and is what `fits` uses.
CHIPS = {
    c.name: c
    for c in (
        ChipKind("v4", ("v4",), "v4", 3, 2, 32 * GiB, int(30.75 * GiB), 275e12, "megacore"),
        ChipKind(
            "v5e", ("v5e", "v5litepod"), "v5e", 2, 1, 16 * GiB, int(15.75 * GiB), 197e12, None
        ),
        ChipKind("v5p", ("v5p",), "v5", 3, 2, 95 * GiB, int(95.74 * GiB), 459e12, "megacore"),
        ChipKind("v6e", ("v6e",), "v6e", 2, 1, 32 * GiB, int(31.25 * GiB), 918e12, None),
    )
}
_ALIASES = {alias: chip for chip in CHIPS.values() for alias in chip.aliases}
EXAMPLES = ("v4-32", "v5p-64", "v5litepod-16", "v5e-16", "v6e-64", "v5p:4x4x12", "v6e:8x16")


@dataclasses.dataclass(frozen=True)
class Slice:
    """One slice's chip kind and torus shape (chips along each axis)."""

    chip: ChipKind
    shape: tuple[int, ...]

    @property
    def num_chips(self) -> int:
        return math.prod(self.shape)

    @property
    def libtpu_name(self) -> str:
        return f"{self.chip.generation}:{'x'.join(map(str, self.shape))}"

    @property
    def accelerator_type(self) -> str:
        return f"{self.chip.name}-{self.num_chips * self.chip.cores_per_chip}"


def _rejected(name: str, why: str) -> ConfigError:
    kinds = ", ".join(a for c in CHIPS.values() for a in c.aliases)
    return ConfigError(
        f"topology={name!r} is not allowed: {why}; use <kind>-<N> or <kind>:<shape> with kind "
        f"one of {kinds} (e.g. {', '.join(EXAMPLES)})"
    )


def default_shape(chip: ChipKind, num_chips: int) -> tuple[int, ...]:
    """Cloud TPU's shape for a power-of-two slice: double the last of the smallest axes.

    3D: 4 chips 2x2x1, 8 2x2x2, 16 2x2x4, 32 2x4x4, 64 4x4x4, 128 4x4x8, ...
    2D: 1 chip 1x1, 4 2x2, 8 2x4, 16 4x4, 32 4x8, 64 8x8, 128 8x16, 256 16x16.
    """
    shape = [2, 2, 1] if chip.torus_dims == 3 else [1, 1]
    while math.prod(shape) < num_chips:
        smallest = min(shape)
        last = max(i for i, s in enumerate(shape) if s == smallest)
        shape[last] *= 2
    return tuple(shape)


def parse(name: str) -> Slice:
    """ "v5p-64" / "v5litepod-16" / "v5p:2x4x4" -> Slice; anything else is a ConfigError."""
    match = re.fullmatch(r"([a-z0-9]+?)(?:-(\d+)|:(\d+(?:x\d+)*))", name.strip().lower())
    if not match or match.group(1) not in _ALIASES:
        raise _rejected(name, "unknown chip kind or form")
    chip = _ALIASES[match.group(1)]
    if match.group(3):
        shape = tuple(int(s) for s in match.group(3).split("x"))
        if len(shape) != chip.torus_dims or min(shape) < 1:
            raise _rejected(name, f"{chip.name} shapes have {chip.torus_dims} positive axes")
        return Slice(chip, shape)
    count = int(match.group(2))
    chips, odd = divmod(count, chip.cores_per_chip)
    smallest = 4 if chip.torus_dims == 3 else 1
    if odd or chips < smallest or chips & (chips - 1):
        per = "TensorCores, 2 per chip" if chip.cores_per_chip == 2 else "chips"
        raise _rejected(
            name,
            f"{chip.name}-N counts {per}; N/{chip.cores_per_chip} must be a power of two >= "
            f"{smallest} (give other slices by shape, e.g. {chip.name}:"
            f"{'x'.join(['4'] * chip.torus_dims)})",
        )
    return Slice(chip, default_shape(chip, chips))
