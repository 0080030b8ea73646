"""What the GPU layer benches (bias_speed.py, relative_kernel_speed.py) share: mae_lm_base's
encoder attention, batch 64 (or the script's third argument), 12 heads, 435 kept of 512
tokens at sorted original positions, head size 64, 64 buckets up to distance 128, from fixed
keys so both time the same inputs; and how they time a function. Import it after putting
the checkout on sys.path."""

import sys
import time

import jax
import jax.numpy as jnp

from maelm_jax.model.positions import relative_bias as rb

B, N, T, H, K = int(sys.argv[3]) if len(sys.argv) > 3 else 64, 12, 435, 64, 64
edges, zero = rb.bucket_edges(K, 128, 512)
keys = jax.random.split(jax.random.PRNGKey(0), 8)
positions = jnp.sort(
    jax.vmap(lambda k: jax.random.permutation(k, 512)[:T])(jax.random.split(keys[0], B)), -1
)
table = jax.random.normal(keys[2], (K, N), jnp.float32)


def median_ms(f, args, reps: int = 20) -> float:
    """The median wall time of `reps` calls of `f(*args)`, after the call `f` has been
    compiled by."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]
