"""The relative-bias kernel (relative_flash.py) as `attention.attend` calls it: lengths padded
to its block, the dropout seed drawn from the layer's key, and under a mesh a `shard_map`
over batch and heads (partition.py) whose shards draw the dropout masks of their own
examples and heads in the whole batch."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from maelm_jax.model.kernels.partition import batch_and_head_specs
from maelm_jax.model.kernels.relative_flash import BLOCK, relative_attention


def relative_attend(q, k, v, query_segments, key_segments, bias, rate, rng, interpret=False):
    """`attention.attend`'s arguments with a `RelativeBias` -> [B, T, N, H], lengths padded
    to `BLOCK` and cut here (padded keys in segment -2, seen by no query); dropout iff
    `rng`, its seed drawn from `rng`. Under a mesh, `shard_map`ped over batch and heads
    (partition.py), each shard's dropout masks those of its examples and heads in the
    whole batch."""
    t, s = q.shape[1], k.shape[1]

    def pad(x, to, fill=0):
        widths = [(0, 0)] * x.ndim
        widths[1] = (0, -to % BLOCK)
        return jnp.pad(x, widths, constant_values=fill) if to % BLOCK else x

    def whole_batch(positions):
        return jnp.broadcast_to(positions, q.shape[:1] + positions.shape[1:])

    seed = jnp.zeros((), jnp.uint32) if rng is None else jax.random.bits(rng, (), jnp.uint32)
    args = (
        pad(q, t),
        pad(k, s),
        pad(v, s),
        pad(query_segments, t, -1),
        pad(key_segments, s, -2),
        pad(whole_batch(bias.query_positions), t),
        pad(whole_batch(bias.key_positions), s),
        bias.table,
        seed,
    )
    static = dict(edges=bias.edges, zero_bucket=bias.zero_bucket, heads=q.shape[2])
    static.update(rate=rate if rng is not None else 0.0, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return _local(*args, **static, batch_axes=None, head_axes=None)[:, :t]
    heads, rows = batch_and_head_specs(mesh, q.shape[0], q.shape[2], "the relative-bias kernel")
    local = functools.partial(_local, **static, batch_axes=heads[0], head_axes=heads[2])
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(heads, heads, heads, rows, rows, rows, rows, P(None, heads[2]), P()),
        out_specs=heads,
        check_vma=False,  # pallas_call has no rule for varying-manual-axes types
    )
    return sharded(*args)[:, :t]


def _local(q, k, v, q_seg, k_seg, q_pos, k_pos, table, seed, *, batch_axes, head_axes, **static):
    """`relative_attention` on one shard's examples and heads."""

    def first(axes, size):
        return 0 if axes is None else jax.lax.axis_index(axes) * size

    offsets = (first(batch_axes, q.shape[0]), first(head_axes, q.shape[2]))
    segments, positions = (q_seg, k_seg), (q_pos, k_pos)
    return relative_attention(q, k, v, segments, positions, table, seed, offsets=offsets, **static)
