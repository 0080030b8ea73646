"""A checkpoint's integrity record: a fingerprint of every array, taken on the device.

Same-size damage to an array file (a flipped bit on disk, a bad copy) restores without any
error and only shows up later as a NaN loss, on every rerun. So before a save hands the
arrays to Orbax's background writer, one jitted reduction computes, per leaf, two uint32
sums of the leaf's raw bits (plain, and weighted by an odd function of the element's flat
position, so moved or swapped values change it too) plus whether every float leaf is
finite. The few bytes come back to the host and go into the checkpoint's manifest; after a
restore the same reduction runs on the restored arrays and must give the same numbers.

Integer sums wrap around identically whatever the order of addition, so the fingerprint of
an array does not depend on its sharding: a checkpoint restored onto another mesh or device
count verifies too. It is a check against damage, not against tampering.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _bits(x: jax.Array) -> jax.Array:
    """The leaf's bits as uint32 values of the leaf's own shape (8-byte types: one more
    axis of 2 words)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
    bits = _bits(x)
    position = jnp.zeros(bits.shape, jnp.uint32)
    for axis, size in enumerate(bits.shape):  # flat index, wrapping like the sums
        position = position * np.uint32(size) + lax.broadcasted_iota(jnp.uint32, bits.shape, axis)
    weight = position * np.uint32(2654435761) + np.uint32(1)  # odd: no weight is 0
    return jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * weight, dtype=jnp.uint32)])


def _finite(x: jax.Array) -> jax.Array:
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.all(jnp.isfinite(x))
    return jnp.bool_(True)


def _keystr(path) -> str:
    return "/".join(
        str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))) for key in path
    )


@functools.cache
def _program(treedef, replicated):
    def fingerprints(leaves):
        finite = jnp.stack([_finite(x) for x in leaves]).all() if leaves else jnp.bool_(True)
        return [_leaf_fingerprint(x) for x in leaves], finite

    return jax.jit(fingerprints, out_shardings=replicated)


def _replicated(leaves):
    """Outputs every process can read: replicated over the leaves' mesh."""
    for leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding):
            return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return None


def record(state) -> tuple[dict[str, list[int]], bool]:
    """({leaf path: [sum, weighted sum]}, every float leaf finite) of a pytree of arrays.

    Collective when the arrays span processes: every process calls it with its state.
    """
    with_path, treedef = jax.tree_util.tree_flatten_with_path(state)
    paths = [_keystr(path) for path, _ in with_path]
    leaves = [leaf for _, leaf in with_path]
    prints, finite = _program(treedef, _replicated(leaves))(leaves)
    prints, finite = jax.device_get((prints, finite))
    return {p: [int(v) for v in np.asarray(f)] for p, f in zip(paths, prints, strict=True)}, bool(
        finite
    )


def first_mismatch(saved: dict[str, list[int]], restored: dict[str, list[int]]) -> str | None:
    """Why the restored arrays differ from the record taken at save time, or None."""
    for path in sorted(set(saved) | set(restored)):
        if saved.get(path) != restored.get(path):
            return (
                f"array {path} does not match its integrity record (saved fingerprint "
                f"{saved.get(path)}, read {restored.get(path)}): its bytes were damaged"
            )
    return None
