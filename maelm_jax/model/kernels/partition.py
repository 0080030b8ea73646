"""How a Pallas kernel splits under a mesh: GSPMD cannot split a `pallas_call`, so under a
mesh it would gather the whole batch onto every device. The kernels (splash, the
relative-bias kernel) `shard_map` themselves over batch and heads, which they treat
independently, as the logical-axis rules say those are sharded."""

import math

import flax.linen as nn
from jax.sharding import PartitionSpec

from maelm_jax.model import logical_axes as ax

SEGMENTS = ("activation_batch", "activation_length")


def batch_and_head_specs(mesh, batch_size: int, num_heads: int, kernel: str):
    """(spec of [B, L, N, H], spec of [B, L]) from the current logical-axis rules.

    Only batch and heads may be split: each shard must see whole sequences, since a query
    needs every key of its document and the kernels have no cross-device softmax. A batch or
    head count the mesh axes do not divide (the one-row batch `init` traces) stays whole.
    """
    batch, length, heads, kv = nn.logical_to_mesh_axes(ax.HEADS)
    segment_batch, segment_length = nn.logical_to_mesh_axes(SEGMENTS)
    if length is not None or segment_length is not None or kv is not None:
        raise ValueError(
            f"{kernel} needs an unsharded sequence and head dim, but the logical "
            f"axis rules shard {ax.HEADS} as {(batch, length, heads, kv)}; map "
            "activation_length and activation_kv to None or use the XLA attention path"
        )
    if segment_batch != batch:
        raise ValueError(
            f"segment ids' batch is sharded as {segment_batch}, the heads' batch as {batch}"
        )

    def divides(axes, size):
        names = (axes,) if isinstance(axes, str) else axes or ()
        return size % math.prod(mesh.shape[name] for name in names) == 0

    batch = batch if divides(batch, batch_size) else None
    heads = heads if divides(heads, num_heads) else None
    return PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
