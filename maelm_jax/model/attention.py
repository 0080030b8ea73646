"""Multi-head attention and the optional relative position bias (MAE-LM's bucketing).

Which key a query may see is given by segment ids, never by a dense mask: `attend` takes
query and key segment ids ([B, T], [B, S] int32; a query sees exactly the keys of its own
segment) and builds the mask in one place. That is the interface of fused TPU kernels with
segment ids (splash attention), which can replace the XLA path below without touching the
layers. Padding is segment 0: it sees only padding and no real token sees it, so no query
row is empty unless its segment has no key at all (a 3ML-cross query whose document is
entirely masked); such a row outputs zeros rather than a uniform average over other
documents.

Memory: the scores of a whole layer, [B, N, T, S] floats, are the largest temporaries of a
large config's step (several live at once in the backward pass), and the MAE-LM encoder's
relative bias is one more of that size per example, plus its gradient, held across all
layers when it is materialised once per stack. So the bias travels factored
(`RelativeBias`: the [buckets, N] table and the tokens' positions),
and `model.attention_query_chunk` splits the queries into blocks that each build their
bias, scores and probabilities, and recompute them in the backward pass: temporaries of
[B, N, chunk, S] instead of [B, N, T, S], for a second pass over the scores.

Without dropout, attention goes through `jax.nn.dot_product_attention` so XLA (or cuDNN on
GPUs) can choose a fused kernel. That API has no attention-probability dropout, so when
dropout is active (training with a rate > 0, the official MAE-LM encoder's 0.1) the
probabilities are computed explicitly and dropped, as fairseq does.
"""

import dataclasses
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from maelm_jax.model import logical_axes as ax
from maelm_jax.model.remat import saved
from maelm_jax.run_config import ModelConfig


class MultiHeadAttention(nn.Module):
    """Queries from `x` [B, T, E], keys/values from `context` [B, S, E] -> [B, T, E]."""

    config: ModelConfig

    def _weights(self, name: str, bias_axes: tuple[str, ...]):
        """(kernel [E, N, H], bias) in the compute dtype; `bias_axes` picks the bias's shape.

        Kernels are created at their full shape (flax's DenseGeneral creates them flat and
        reshapes, which breaks logical constraints under a mesh).
        """
        cfg = self.config
        sizes = {"embed": cfg.hidden_size, "heads": cfg.num_heads, "kv": cfg.head_dim}
        kernel = self.param(
            f"{name}_kernel",
            ax.param(nn.initializers.normal(cfg.init_std), ("embed", "heads", "kv")),
            (cfg.hidden_size, cfg.num_heads, cfg.head_dim),
        )
        bias = self.param(
            f"{name}_bias",
            ax.param(nn.initializers.zeros, bias_axes),
            tuple(sizes[a] for a in bias_axes),
        )
        return kernel.astype(cfg.dtype), bias.astype(cfg.dtype)

    dropout_rate: float = 0.0  # on the attention probabilities

    @nn.compact
    def __call__(self, x, context, segments, bias=None, deterministic: bool = True):
        """segments: (query [B, T], key [B, S]) int segment ids; bias: a `RelativeBias`, a
        dense [B|1, N, T, S] array, or None."""
        cfg = self.config

        def project(name, inputs):  # named for the remat policies (remat.py)
            kernel, b = self._weights(name, ("heads", "kv"))
            y = jnp.einsum("bse,enh->bsnh", inputs.astype(cfg.dtype), kernel) + b
            return saved(ax.constrain(y, ax.HEADS), name)

        q, k, v = project("query", x), project("key", context), project("value", context)
        dropout_rng = None
        if self.dropout_rate > 0.0 and not deterministic:
            dropout_rng = self.make_rng("dropout")
        chunk = cfg.attention_query_chunk
        out = attend(q, k, v, *segments, bias, self.dropout_rate, dropout_rng, chunk)
        kernel, b = self._weights("out", ("embed",))
        y = jnp.einsum("bsnh,enh->bse", ax.constrain(out, ax.HEADS), kernel) + b
        return saved(y, "attention_out")


def segment_mask(query_segments, key_segments):
    """[B, T], [B, S] int -> bool [B, 1, T, S]: True where the key is in the query's segment."""
    return (query_segments[:, :, None] == key_segments[:, None, :])[:, None]


@flax.struct.dataclass
class RelativeBias:
    """A relative position bias in factored form; `dense` expands it.

    Passed as is through a layer stack, it costs the [buckets, N] table and the positions,
    and its gradient accumulates in the same small table. Materialised once per stack
    instead, the MAE-LM encoder's bias is [B, N, T, S] per example (the kept tokens'
    distances differ), and so is its gradient accumulator, both live across every layer.
    """

    table: jax.Array  # [buckets, N] float32: each bucket's bias, per head
    query_positions: jax.Array  # [B|1, T] int: original positions
    key_positions: jax.Array  # [B|1, S] int
    edges: tuple[int, ...] = flax.struct.field(pytree_node=False)  # `bucket_edges`
    zero_bucket: int = flax.struct.field(pytree_node=False)  # the bucket of offset 0

    def dense(self, dtype=jnp.float32) -> jax.Array:
        """[B|1, N, T, S] in `dtype`, computed in float32 so its gradient sums in float32.

        Written for the TPU: each offset's bucket is a count of the bucket edges it reaches
        (elementwise, fused), and the bias a contraction of that bucket's one-hot with the
        table, so the forward pass is a matmul and the table's gradient another. A lookup
        in the table is a gather per score and its gradient a scatter-add with colliding
        indices, which a TPU serialises: XLA's cost model put the MAE-LM base step at 2.8x
        MLM's time for 1.12x its FLOPs that way (README, "Three clocks").
        """
        offsets = self.key_positions[:, None, :] - self.query_positions[:, :, None]
        buckets = offset_buckets(offsets, self.edges, self.zero_bucket)  # [B|1, T, S]
        one_hot = buckets[..., None] == jnp.arange(self.table.shape[0])
        # A selection, exact as a lookup is: in float32 at full precision (a TPU or GPU
        # would otherwise round the table to bf16 or TF32); for a bf16 bias, rounding the
        # table to bf16 gives the bias the lookup did, at the MXU's bf16 rate.
        full = jnp.dtype(dtype) == jnp.float32
        bias = jnp.einsum(
            "btsk,kn->bnts",
            one_hot.astype(jnp.float32),
            self.table,
            precision=jax.lax.Precision.HIGHEST if full else jax.lax.Precision.DEFAULT,
        )
        return bias.astype(dtype)


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


def _dense(bias, dtype):
    if isinstance(bias, RelativeBias):
        return bias.dense(dtype)
    return None if bias is None else bias.astype(dtype)


def attend(
    q,
    k,
    v,
    query_segments,
    key_segments,
    bias,
    dropout_rate=0.0,
    dropout_rng=None,
    query_chunk: int = 0,
):
    """q [B, T, N, H], k and v [B, S, N, H], segment ids [B, T] and [B, S], bias (a
    `RelativeBias`, [B|1, N, T, S], or None) -> [B, T, N, H]; dropout on the probabilities
    iff `dropout_rng`.

    With `query_chunk` > 0 and T longer, the queries go in ceil(T / query_chunk) equal blocks
    (the last padded with queries that see no key), each under `jax.checkpoint`, so no
    [B, N, T, S] array exists in either pass. Every query's result is the same as unchunked.
    """
    t = q.shape[1]
    if not query_chunk or t <= query_chunk:
        bias = _dense(bias, q.dtype)
        return _attend_block(q, k, v, query_segments, key_segments, bias, dropout_rate, dropout_rng)
    n = -(-t // query_chunk)
    size = -(-t // n)

    def blocks(x, axis=1, fill=0):  # split the query axis: [..., T, ...] -> [n, ..., size, ...]
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, n * size - t)
        x = jnp.pad(x, pad, constant_values=fill)
        x = x.reshape((*x.shape[:axis], n, size, *x.shape[axis + 1 :]))
        return jnp.moveaxis(x, axis, 0)

    if isinstance(bias, RelativeBias):
        bias_blocks = blocks(bias.query_positions)
    elif bias is not None:
        bias_blocks = blocks(bias, axis=2)
    else:
        bias_blocks = None

    @jax.checkpoint
    def block(inputs):
        index, q_block, segments, bias_block = inputs
        if isinstance(bias, RelativeBias):
            block_bias = dataclasses.replace(bias, query_positions=bias_block).dense(q.dtype)
        else:
            block_bias = None if bias is None else bias_block.astype(q.dtype)
        rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, index)
        return _attend_block(q_block, k, v, segments, key_segments, block_bias, dropout_rate, rng)

    inputs = (jnp.arange(n), blocks(q), blocks(query_segments, fill=-1), bias_blocks)
    out = jax.lax.map(block, inputs)  # [n, B, size, N, H]
    out = jnp.moveaxis(out, 0, 1)
    return out.reshape((out.shape[0], n * size, *out.shape[3:]))[:, :t]


def _attend_block(q, k, v, query_segments, key_segments, bias, dropout_rate, dropout_rng):
    """`attend` on dense inputs: the only place that turns segment ids into a mask, so a
    fused segment-id kernel (splash attention on TPU) replaces this function's body."""
    mask = segment_mask(query_segments, key_segments)
    if dropout_rng is None:
        out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask)
    else:
        logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32)
        logits = logits / np.sqrt(q.shape[-1]).astype(np.float32)
        if bias is not None:
            logits = logits + bias.astype(jnp.float32)
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1)
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        # A product, not jnp.where(keep, probs / (1 - rate), 0): the same values, and libtpu
        # 0.0.42 segfaults compiling the `where` form in query blocks under remat.
        probs = (probs * (keep.astype(jnp.float32) / (1.0 - dropout_rate))).astype(v.dtype)
        out = jnp.einsum("bnts,bsnh->btnh", probs, v)
    has_key = jnp.any(mask, axis=-1)[:, 0, :, None, None]  # [B, T, 1, 1]
    return jnp.where(has_key, out, jnp.zeros((), out.dtype))


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


def bucket_distances(num_buckets: int, max_distance: int, max_positions: int):
    """float32 [num_buckets]: the smallest |offset| that falls in each bucket (0 for the one
    row no offset reaches)."""
    buckets = relative_position_buckets(num_buckets, max_distance, max_positions)
    distance = np.abs(np.arange(-(max_positions - 1), max_positions))
    nearest = np.full(num_buckets, np.inf)
    np.minimum.at(nearest, buckets, distance)
    return np.where(np.isfinite(nearest), nearest, 0.0).astype(np.float32)


def relative_bias_init(config: ModelConfig):
    """normal(init_std), as official MAE-LM, or with `relative_attention_init_slope` > 0 a
    table that starts at -slope * distance in every head (ALiBi's prior, then learned).

    Why the prior exists: with a table near zero, attention starts uniform, and a position-
    selective pattern has to emerge from learned absolute positions before any neighbour's
    identity reaches a [MASK] slot. An all-[MASK] objective has no other signal, so a short
    run sits on the unigram loss (README, "What the default run shows"); starting local removes
    that plateau. Far buckets start near exp(-slope * distance), so long-range use must be
    learned.
    """
    if not config.relative_attention_init_slope:
        return nn.initializers.normal(config.init_std)
    distances = bucket_distances(
        config.relative_attention_buckets,
        config.relative_attention_max_distance,
        config.max_positions,
    )
    start = -config.relative_attention_init_slope * distances[:, None]

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

    @nn.compact
    def __call__(self, query_positions, key_positions) -> RelativeBias:
        """[B, T], [B, S] int -> the bias, [B, N, T, S] when made dense."""
        cfg = self.config
        table = self.param(
            "embedding",
            ax.param(relative_bias_init(cfg), ("relpos_buckets", "heads")),
            (cfg.relative_attention_buckets, cfg.num_heads),
            jnp.float32,
        )
        edges, zero = bucket_edges(
            cfg.relative_attention_buckets,
            cfg.relative_attention_max_distance,
            cfg.max_positions,
        )
        return RelativeBias(table, query_positions, key_positions, edges, zero)
