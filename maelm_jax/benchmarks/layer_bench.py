"""What the GPU layer benches (bias_speed, relative_kernel_speed) share: mae_lm_base's
encoder attention, batch 64 (or the bench's BATCH argument), 12 heads, 435 kept of 512
tokens at sorted original positions, head size 64, 64 buckets up to distance 128, from fixed
keys so both time the same inputs; and how they time a function."""

import pathlib
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp

from maelm_jax.model.positions import relative_bias as rb

N, T, H, K = 12, 435, 64, 64  # heads, kept tokens, head size, buckets
BATCH = 64


class Inputs(NamedTuple):
    """The layer's inputs at one batch size (`B`), the same for every bench that asks."""

    B: int
    edges: tuple[int, ...]
    zero: int
    keys: jax.Array
    positions: jax.Array  # [B, T] original positions of the kept tokens, ascending
    table: jax.Array  # [K, N] float32, the relative bias's table


def inputs(batch: int = BATCH) -> Inputs:
    edges, zero = rb.bucket_edges(K, 128, 512)
    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    rows = jax.random.split(keys[0], batch)
    positions = jnp.sort(jax.vmap(lambda k: jax.random.permutation(k, 512)[:T])(rows), -1)
    table = jax.random.normal(keys[2], (K, N), jnp.float32)
    return Inputs(batch, edges, zero, keys, positions, table)


def arguments(argv: list[str]) -> tuple[str, int]:
    """(OUTDIR, BATCH) of a bench's command line `OUTDIR [BATCH]`."""
    if len(argv) not in (2, 3):
        name = pathlib.Path(argv[0]).stem
        raise SystemExit(f"usage: python -m maelm_jax.benchmarks.{name} OUTDIR [BATCH={BATCH}]")
    return argv[1], int(argv[2]) if len(argv) == 3 else BATCH


def median_ms(f, args, reps: int = 20) -> float:
    """The median wall time of `reps` calls of `f(*args)`, after the call `f` has been
    compiled by."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]
