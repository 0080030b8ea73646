"""Attention through the Pallas splash kernel on TPU, with document segment ids.

`splash_attend` is a drop-in for `attention._attend_block` without bias or dropout: the
same segment semantics, so a layer can swap paths without changing what a query sees. The
kernel never builds the [B, N, T, S] scores in HBM, which are the largest temporaries of
the XLA path (attention.py's module docstring); that is the reason to use it.

What the kernel does not do for us, and this module does:

- Scale the queries (it computes q k^T as given).
- Take lengths that are not multiples of its block (the MAE-LM encoder sees 435 of 512
  tokens): we pad both sequences, with segment ids that match no real id, so padded keys
  are invisible and padded queries are sliced off.
- Handle a query whose segment has no key (a 3ML-cross query of a fully masked document,
  or a padded query): the kernel's masked logits are a finite constant, so such a row comes
  out as a uniform average of all values. `_attend_block` gives zeros there, so we do too.
- Partition itself: `shard_map` over batch and heads (partition.py).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

from maelm_jax.model.kernels.partition import batch_and_head_specs

# Splash tiles both sequences in multiples of the TPU's 128 lanes (segment ids are laid out
# along lanes); a smaller block_kv is rejected with NotImplementedError.
LANES = 128


def splash_attend(
    q, k, v, query_segments, key_segments, *, interpret: bool = False, block: int = 512
):
    """q [B, T, N, H], k and v [B, S, N, H], segment ids [B, T] and [B, S] -> [B, T, N, H]
    in q's dtype, equal to `_attend_block(q, k, v, query_segments, key_segments, None, 0.0,
    None)`.

    `block` caps the kernel's tile (a multiple of 128); shorter sequences get one tile of
    their length rounded up to 128. `interpret` runs the kernel in the Pallas interpreter,
    which is how it runs on CPU (tests), at interpreter speed.
    """
    if block < LANES or block % LANES:
        raise ValueError(f"block={block} must be a positive multiple of {LANES}")
    local = functools.partial(_attend_local, interpret=interpret, block=block)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return local(q, k, v, query_segments, key_segments)
    heads, segments = batch_and_head_specs(mesh, q.shape[0], q.shape[2], "splash attention")
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(heads, heads, heads, segments, segments),
        out_specs=heads,
        # pallas_call has no rule for varying-manual-axes types; the body is per shard.
        check_vma=False,
    )
    return sharded(q, k, v, query_segments, key_segments)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad(x, length: int, fill):
    """Pads axis 1 of `x` to `length` with `fill`."""
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, length - x.shape[1])
    return jnp.pad(x, widths, constant_values=fill)


def _kernel(num_heads: int, q_block: int, kv_block: int, q_len: int, kv_len: int, interpret):
    """A splash kernel for one example of [N, q_len, H] queries over kv_len keys.

    The static mask is full: all masking comes from segment ids, which vary per example and
    so cannot be part of the kernel's precomputed block sparsity. The mask's shape is the
    padded one (the kernel checks the blocks divide it).
    """
    mask = masks.MultiHeadMask([masks.FullMask((q_len, kv_len))] * num_heads)
    sizes = splash.BlockSizes(
        block_q=q_block,
        block_kv=kv_block,
        block_kv_compute=kv_block,
        block_q_dkv=q_block,
        block_kv_dkv=kv_block,
        block_kv_dkv_compute=kv_block,
        block_q_dq=q_block,
        block_kv_dq=kv_block,
    )
    return splash.make_splash_mha(
        mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )


def _attend_local(q, k, v, query_segments, key_segments, *, interpret: bool, block: int):
    """`splash_attend` on the arrays one device holds (all of them outside a mesh)."""
    _, t, n, h = q.shape
    s = k.shape[1]
    q_block = min(block, _round_up(t, LANES))
    kv_block = min(block, _round_up(s, LANES))
    q_len, kv_len = _round_up(t, q_block), _round_up(s, kv_block)
    query_segments = query_segments.astype(jnp.int32)
    key_segments = key_segments.astype(jnp.int32)
    # Two ids below every real one (real ids may include -1: `attend`'s chunk padding), so
    # padded keys match no query and padded queries no key.
    lowest = jnp.minimum(query_segments.min(), key_segments.min())
    segments = splash.SegmentIds(
        q=_pad(query_segments, q_len, lowest - 1), kv=_pad(key_segments, kv_len, lowest - 2)
    )
    # [B, L, N, H] -> [B, N, L, H]: the kernel takes heads first, one example at a time.
    heads_first = lambda x, length: jnp.swapaxes(_pad(x, length, 0), 1, 2)
    scaled = q * jnp.asarray(1.0 / math.sqrt(h), q.dtype)
    kernel = _kernel(n, q_block, kv_block, q_len, kv_len, interpret)
    out = jax.vmap(kernel)(
        heads_first(scaled, q_len), heads_first(k, kv_len), heads_first(v, kv_len), segments
    )
    out = jnp.swapaxes(out, 1, 2)[:, :t]
    # A reduction XLA fuses with the comparison, so no [B, T, S] array is stored.
    has_key = jnp.any(query_segments[:, :, None] == key_segments[:, None, :], axis=-1)
    return jnp.where(has_key[:, :, None, None], out, jnp.zeros((), out.dtype))
