"""Packed-document attention inputs shared by the kernel tests (splash on CPU, cuDNN on GPU):
kept apart from either test module so that neither kernel's imports reach the other's
machine (jax's TPU kernels are missing from some GPU builds)."""

import jax
import jax.numpy as jnp
import numpy as np


def packed_segments(rng, batch: int, length: int, first_id: int) -> np.ndarray:
    """[batch, length] int32: runs of documents numbered from `first_id`, then padding (0)
    at the end of each row."""
    rows = []
    for _ in range(batch):
        padding = int(rng.integers(1, length // 3))
        bounds = np.sort(rng.choice(np.arange(1, length - padding), size=2, replace=False))
        lengths = np.diff([0, *bounds, length - padding])
        ids = np.repeat(first_id + np.arange(3), lengths)
        rows.append(np.concatenate([ids, np.zeros(padding, np.int64)]))
    return np.asarray(rows, np.int32)


def inputs(t: int, s: int, cross: bool, batch: int = 2, heads: int = 2, dim: int = 8):
    """q, k, v (float32) and segment ids; with `cross`, the last query document has no key."""
    rng = np.random.default_rng(t * 1000 + s)
    q_seg = packed_segments(rng, batch, t, first_id=1)
    # Cross: keys of documents 1, 2 and 4, so each row's document 3 sees nothing.
    k_seg = packed_segments(rng, batch, s, first_id=1) if cross else q_seg
    if cross:
        k_seg = np.where(k_seg == 3, 4, k_seg)
    keys = jax.random.split(jax.random.PRNGKey(t + s), 4)
    q = jax.random.normal(keys[0], (batch, t, heads, dim))
    k, v = (jax.random.normal(key, (batch, s, heads, dim)) for key in keys[1:3])
    cotangent = jax.random.normal(keys[3], q.shape)
    return (q, k, v, jnp.asarray(q_seg), jnp.asarray(k_seg)), cotangent


def has_gpu() -> bool:
    """Whether jax sees a GPU: the cuDNN tests skip without one (CI has none)."""
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False
