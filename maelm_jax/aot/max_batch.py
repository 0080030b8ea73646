"""The largest global batch whose train step fits in HBM, found in few compiles."""

import dataclasses
import math
import time

import numpy as np

from maelm_jax.aot.compile_step import compile_step
from maelm_jax.aot.memory import memory_of
from maelm_jax.config import configdict
from maelm_jax.config.run_config import RunConfig
from maelm_jax.step import sharding


@dataclasses.dataclass(frozen=True)
class MaxBatch:
    """The largest global batch that fits, and every probe: (batch, fits, bytes per chip)."""

    batch_size: int  # 0: not even one data-parallel unit fits
    unit: int  # batches are multiples of this
    probes: tuple[tuple[int, bool, int | None], ...]
    seconds: float


def batch_unit(run: RunConfig, devices: list) -> int:
    """What every global batch must be a multiple of: batch shards x micro-batches."""
    mesh = sharding.create_mesh(run.mesh, devices=devices)
    spec = sharding.batch_sharding(mesh, sharding.axis_rules(run.mesh)).spec
    axes = () if not spec or spec[0] is None else spec[0]
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes) * run.loop.grad_accum_steps


def max_batch(run: RunConfig, devices: list, hbm: int, known: tuple | None = None) -> MaxBatch:
    """The largest multiple of the data-parallel unit that fits, exactly, in few compiles.

    Per-chip memory is close to linear in the batch (the state is fixed, activations and
    temporaries grow with it), so a line through compiled probes predicts the edge, and a
    probe on each side of the prediction confirms it. The second probe sits an eighth
    away from the first: an out-of-memory probe gives only the compiler's lower bound (it
    stops at the first allocation that does not fit), so a far one (double the batch) bends
    the line; only compiled probes' totals draw it. Where the line still misses (layout
    changes), a bisection step follows each prediction, so the bracket still halves.
    `known` is a probe already made: (batch, fits, bytes, bytes are a compiled total).
    """
    start = time.perf_counter()
    unit = batch_unit(run, devices)
    probes, exact = {}, set()
    if known and known[0] % unit == 0:
        probes[known[0] // unit] = tuple(known[:3])
        if known[3]:
            exact.add(known[0] // unit)

    def fits(units: int) -> bool:
        if units not in probes:
            compiled, oom, _, _ = compile_step(
                configdict.override(run, {"batch_size": units * unit}), devices
            )
            _, needed = memory_of(compiled, oom)
            probes[units] = (units * unit, compiled is not None and needed <= hbm, needed)
            if compiled is not None:
                exact.add(units)
        return probes[units][1]

    def bracket() -> tuple[int, int | None]:
        """(largest fitting units, 0 if none; smallest larger one that does not, or None)."""
        lo = max((u for u, p in probes.items() if p[1]), default=0)
        return lo, min((u for u, p in probes.items() if u > lo and not p[1]), default=None)

    first = max(1, run.batch_size // unit)
    step = max(1, first // 8)
    fits(first + step if fits(first) else max(1, first - step))
    predict = True  # alternate: a prediction (and its neighbour), then a bisection step
    lo, hi = bracket()
    while hi is None or hi - lo > 1:
        line = predict or hi is None  # nothing to bisect before a probe fails
        guess = _linear_guess({u: probes[u][2] for u in exact}, hbm) if line else None
        if guess is None:  # bisection, or doubling while nothing is known not to fit
            guess = 2 * max(lo, 1) if hi is None else (lo + hi) // 2
        guess = max(guess, lo + 1) if hi is None else min(max(guess, lo + 1), hi - 1)
        neighbour = guess + 1 if fits(guess) else guess - 1  # across the predicted edge
        if line and neighbour > lo and (hi is None or neighbour < hi):
            fits(neighbour)
        predict = not predict
        lo, hi = bracket()
    return MaxBatch(lo * unit, unit, tuple(sorted(probes.values())), time.perf_counter() - start)


def _linear_guess(measured: dict, hbm: int) -> int | None:
    """Units where the least-squares line through the compiled probes' totals reaches
    `hbm` (all of them: single layouts jitter a few MiB); None without two."""
    if len(measured) < 2:
        return None
    units = np.array(sorted(measured), dtype=np.float64)
    slope, intercept = np.polyfit(units, [measured[u] for u in units.astype(int)], 1)
    if slope <= 0:  # no growth seen: the line says nothing
        return None
    return int((hbm - intercept) // slope)
