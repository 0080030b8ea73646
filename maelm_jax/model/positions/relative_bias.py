"""The relative position bias of MAE-LM's encoder: fairseq's bucketing of offsets, the
learned [buckets, N] table, the bias in factored form (`RelativeBias`), and the form a
layer stack expands once and every layer adds (`StackBias`, via `attention.stack_bias`).

Positions are the tokens' original ones, so the MAE-LM encoder's visible subsequence keeps
its true distances.
"""

import functools
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model import logical_axes as ax


def relative_position_buckets(num_buckets: int, max_distance: int, max_positions: int):
    """The official MAE-LM (fairseq) bucket of every offset `key - query` a model can meet.

    Returns int32 [2 * max_positions - 1]; entry `d + max_positions - 1` is offset d's bucket.
    The layout differs from T5's (and HF MPNet's): offsets below `max_exact = num_buckets // 4`
    in size keep their own bucket; larger ones get `max_exact + ceil(log(|d| / max_exact) /
    log((max_distance - 1) / max_exact) * (num_buckets // 2 - 1 - max_exact))`, capped at
    `num_buckets // 2 - 1`, with the offset's sign; the table is then shifted so its smallest
    entry (the farthest key before the query) is 0. Offsets are signed around a shared 0,
    so only `num_buckets - 1` of the `num_buckets` rows are ever used.

    Computed once on the host in float32, as the reference computes it, so bucket edges are
    bit-for-bit the reference's; the model only gathers from the table.
    """
    offsets = np.arange(-(max_positions - 1), max_positions)
    half = num_buckets // 2
    max_exact = half // 2
    distance = np.abs(offsets)
    far = np.maximum(distance, max_exact).astype(np.float32)
    log_ratio = np.log(far / np.float32(max_exact)) / np.float32(
        math.log((max_distance - 1) / max_exact)
    )
    large = max_exact + np.ceil(log_ratio * np.float32(half - 1 - max_exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    signed = np.where(distance < max_exact, distance, large) * np.sign(offsets)
    return (signed - signed.min()).astype(np.int32)


def bucket_edges(num_buckets: int, max_distance: int, max_positions: int):
    """(edges, zero bucket): offset d's bucket is `zero + sign(d) * #{e in edges: |d| >= e}`,
    exactly `relative_position_buckets`'s entry for d (tests hold every offset to it)."""
    table = relative_position_buckets(num_buckets, max_distance, max_positions)
    zero = int(table[max_positions - 1])
    magnitude = table[max_positions - 1 :] - zero  # offsets 0, 1, ..., P - 1
    edges = tuple(int(np.argmax(magnitude >= m)) for m in range(1, int(magnitude.max()) + 1))
    return edges, zero


def offset_buckets(offsets, edges: tuple[int, ...], zero_bucket: int):
    """int offsets (key - query), any shape -> their buckets (`bucket_edges`); elementwise."""
    distance = jnp.abs(offsets)
    magnitude = sum((distance >= e).astype(jnp.int32) for e in edges)
    return zero_bucket + jnp.sign(offsets) * magnitude


@flax.struct.dataclass
class RelativeBias:
    """A relative position bias in factored form: the [buckets, N] table and the positions.

    `dense` expands it to [B|1, N, T, S]; a layer stack expands it once (`shared`).
    """

    table: jax.Array  # [buckets, N] float32: each bucket's bias, per head
    query_positions: jax.Array  # [B|1, T] int: original positions
    key_positions: jax.Array  # [B|1, S] int
    edges: tuple[int, ...] = flax.struct.field(pytree_node=False)  # `bucket_edges`
    zero_bucket: int = flax.struct.field(pytree_node=False)  # the bucket of offset 0

    def buckets(self) -> jax.Array:
        """[B|1, T, S] int: each score's bucket, a count of the bucket edges its offset
        reaches (elementwise; XLA fuses it into whatever reads it)."""
        offsets = self.key_positions[:, None, :] - self.query_positions[:, :, None]
        return offset_buckets(offsets, self.edges, self.zero_bucket)

    def dense(self, dtype=jnp.float32) -> jax.Array:
        """[B|1, N, T, S] in `dtype`; the table's gradient is float32 (`StackBias.layer`)."""
        return self.shared(dtype).layer()

    def shared(self, dtype, summed: bool = False) -> "StackBias":
        """The bias made once for every layer of a stack (`StackBias`); `summed`: the layers'
        gradients are added first and contracted once (`model.relative_bias_grad`)."""
        buckets = self.buckets()
        if summed:
            values = _summed(buckets, self.table, jnp.dtype(dtype))
        else:
            values = jax.lax.stop_gradient(_contract(buckets, self.table, jnp.dtype(dtype)))
        return StackBias(values, buckets, self.table, summed)


@flax.struct.dataclass
class StackBias:
    """One bias that every layer of a stack adds, each layer contracting its own gradient.

    The values are made once per step (`RelativeBias.shared`); `layer()` hands them to one
    layer with a backward pass that turns that layer's score gradient into the table's
    gradient at once (`table_gradient`). Summed over the layers first, as autodiff of a
    shared array does, the score gradients were one more [B, N, T, S] array read and written
    by every layer; contracted in each layer, mae_lm_base's encoder layer went from 1.549
    to 1.519 ms on v5p-8 at batch 64 x 512 (XLA's cost model, fast effort).
    """

    values: jax.Array  # [B|1, N, T, S] in the compute dtype; float32 where `summed`
    buckets: jax.Array  # [B|1, T, S] int
    table: jax.Array  # [K, N] float32
    # The gradient of `values` itself, summed over the layers by autodiff in float32 and
    # contracted once (`_summed`); else each layer contracts its own.
    summed: bool = flax.struct.field(pytree_node=False, default=False)

    def layer(self) -> jax.Array:
        if self.summed:
            return self.values
        return _with_table_gradient(self.values, self.buckets, self.table)


def _one_hot(buckets, num_buckets: int, dtype):
    return (buckets[..., None] == jnp.arange(num_buckets)).astype(dtype)


def _precision(dtype):
    """Full precision in float32: a TPU or GPU would otherwise round a float32 operand to
    bf16 or TF32, and a selection must be exact as a lookup is."""
    full = jnp.dtype(dtype) == jnp.float32
    return jax.lax.Precision.HIGHEST if full else jax.lax.Precision.DEFAULT


def _contract(buckets, table, dtype):
    """[B|1, T, S] buckets, [K, N] table -> [B|1, N, T, S] in `dtype`: each score's bucket row,
    a contraction of the buckets' one-hot with the table.

    Why a contraction: a lookup in the table is a gather per score, and its gradient a
    scatter-add with colliding indices, which a TPU serialises; XLA's cost model put the
    MAE-LM base step at 2.8x MLM's time for 1.12x its FLOPs that way (docs/results.md,
    "The methods at base size"). Why in `dtype`, with the key axis ahead of the query axis:
    XLA's TPU layout
    then matches the scores', and each layer adds the bias inside the fusion that makes
    its scores. Made in float32 and cast, the bias was held in float32 in the one-hot
    contraction's layout, and every layer transposed its scores to add it: 0.18 ms of
    mae_lm_base's 1.73 ms encoder layer (v5p-8, batch 64 x 512).
    """
    one_hot = _one_hot(jnp.swapaxes(buckets, 1, 2), table.shape[0], dtype)  # [B|1, S, T, K]
    return jnp.einsum(
        "bstk,kn->bnts",
        one_hot,
        table.astype(dtype),
        preferred_element_type=dtype,
        precision=_precision(dtype),
    )


def table_gradient(cotangent, buckets, num_buckets: int):
    """[B|1, N, T, S] score gradient -> the [K, N] table's, float32. The products are exact
    (one factor is 0 or 1), so a bf16 gradient sums in float32 as XLA would sum it after a
    cast, without the float32 copy."""
    one_hot = _one_hot(buckets, num_buckets, cotangent.dtype)  # [B|1, T, S, K]
    return jnp.einsum(
        "bnts,btsk->kn",
        cotangent,
        one_hot,
        preferred_element_type=jnp.float32,
        precision=_precision(cotangent.dtype),
    )


@jax.custom_vjp
def _with_table_gradient(values, buckets, table):
    """`values`, whose gradient is sent to `table` (`StackBias`)."""
    del buckets, table
    return values


def _with_table_gradient_fwd(values, buckets, table):
    return values, (buckets, table.shape[0])


def _with_table_gradient_bwd(residuals, cotangent):
    buckets, num_buckets = residuals
    return None, None, table_gradient(cotangent, buckets, num_buckets)


_with_table_gradient.defvjp(_with_table_gradient_fwd, _with_table_gradient_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _summed(buckets, table, dtype):
    """The stack's bias in float32 (its values those of `_contract` in `dtype`), whose
    gradient, the layers' score gradients summed in float32, is contracted once.

    Why on a GPU: contracted in each layer, the score gradient [B, N, T, S] is transposed
    for the one-hot product every time; at mae_lm_base's encoder shape (64 x 12 x 435 x
    435) that took 2.06 ms a layer on an H200, 11.5 ms for twelve, against 2.0 ms for one
    contraction of their bf16 sum (benchmarks/bias_speed.py, 2026-11-26; the float32 form
    here is not timed yet). The sum costs a float32 array of the bias's size and its
    gradient; XLA's TPU model prefers the layers' own contractions (`StackBias`), so "auto"
    picks this on GPU only."""
    return _contract(buckets, table, dtype).astype(jnp.float32)


def _summed_fwd(buckets, table, dtype):
    return _summed(buckets, table, dtype), (buckets, table.shape[0])


def _summed_bwd(dtype, residuals, cotangent):
    del dtype
    buckets, num_buckets = residuals
    return None, table_gradient(cotangent, buckets, num_buckets)


_summed.defvjp(_summed_fwd, _summed_bwd)


def bucket_distances(num_buckets: int, max_distance: int, max_positions: int):
    """float32 [num_buckets]: the smallest |offset| that falls in each bucket (0 for the one
    row no offset reaches)."""
    buckets = relative_position_buckets(num_buckets, max_distance, max_positions)
    distance = np.abs(np.arange(-(max_positions - 1), max_positions))
    nearest = np.full(num_buckets, np.inf)
    np.minimum.at(nearest, buckets, distance)
    return np.where(np.isfinite(nearest), nearest, 0.0).astype(np.float32)


def relative_bias_init(config: ModelConfig, slope: float, cap: float = 0.0):
    """normal(init_std), as official MAE-LM, or with `slope` > 0 a table that starts at
    -slope * distance in every head (ALiBi's prior, then learned).

    Why the prior exists: with a table near zero, attention starts uniform, and a position-
    selective pattern has to emerge from learned absolute positions before any neighbour's
    identity reaches a [MASK] slot. An all-[MASK] objective has no other signal, so a short
    run sits on the unigram loss (docs/results.md, "Why the default's relative biases start
    local"); starting local removes
    that plateau. Far buckets start near exp(-slope * distance), so long-range use must be
    learned, and under Adam, whose steps are about the learning rate in size, a table that
    starts at -86 barely moves: an encoder that starts local stays local through pretraining
    and fine-tuning (docs/results.md, "GLUE: the default run's export"). `cap` > 0 stops
    the prior at that distance, so every far token keeps exp(-slope * cap) of a weight.
    """
    if not slope:
        return nn.initializers.normal(config.init_std)
    distances = bucket_distances(
        config.relative_attention_buckets,
        config.relative_attention_max_distance,
        config.max_positions,
    )
    if cap:
        distances = np.minimum(distances, cap)
    start = -slope * distances[:, None]

    def init(key, shape, dtype=jnp.float32):
        del key
        return jnp.broadcast_to(jnp.asarray(start, dtype), shape)

    return init


class RelativePositionBias(nn.Module):
    """Per-head bias from the tokens' *original* positions, shared by all layers of a stack
    (the encoder's; the decoder's own with `decoder_relative_attention`).

    Positions are passed in (not implied by array order) because the MAE-LM encoder's
    sequence is the visible subset: neighbours in the array may be far apart in the text.
    """

    config: ModelConfig
    init_slope: float  # the encoder's or the decoder's `*relative_attention_init_slope`
    init_cap: float = 0.0  # the encoder's `relative_attention_init_cap`

    @nn.compact
    def __call__(self, query_positions, key_positions) -> RelativeBias:
        """[B, T], [B, S] int -> the bias, [B, N, T, S] when made dense."""
        cfg = self.config
        table = self.param(
            "embedding",
            ax.param(
                relative_bias_init(cfg, self.init_slope, self.init_cap), ("relpos_buckets", "heads")
            ),
            (cfg.relative_attention_buckets, cfg.num_heads),
            jnp.float32,
        )
        edges, zero = bucket_edges(
            cfg.relative_attention_buckets,
            cfg.relative_attention_max_distance,
            cfg.max_positions,
        )
        return RelativeBias(table, query_positions, key_positions, edges, zero)
