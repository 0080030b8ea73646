"""Multi-head attention: segment masks, the relative bias a layer stack shares, and the kernel.

Which key a query may see is given by segment ids, never by a dense mask: `attend` takes
query and key segment ids ([B, T], [B, S] int32; a query sees exactly the keys of its own
segment) and builds the mask in one place. That is the interface of fused TPU kernels with
segment ids (splash attention), which can replace the XLA path below without touching the
layers. Padding is segment 0: it sees only padding and no real token sees it, so no query
row is empty unless its segment has no key at all (a 3ML-cross query whose document is
entirely masked); such a row outputs zeros rather than a uniform average over other
documents.

Memory and time: the scores of a whole layer, [B, N, T, S] floats, are the largest
temporaries of a large config's step, and `model.attention_query_chunk` splits the queries
into blocks that each build their scores and probabilities and recompute them in the
backward pass: temporaries of [B, N, chunk, S] instead of [B, N, T, S], for a second pass
over the scores. The MAE-LM encoder's relative bias is one more array of the scores' size
per example (the kept tokens' distances differ). A layer stack makes it once
(`stack_bias`: one contraction of the buckets' one-hot with the [buckets, N] table, already
cut into the query blocks) and every layer adds it to its scores, inside the fusion that
makes them; each layer's backward pass contracts its score gradient with the one-hot into
the table's gradient (`StackBias`). Built per layer instead, the bias contraction (K
buckets against N heads, as many FLOPs as K/H of the scores' matmul and a poor fit for the
MXU) cost XLA's TPU model ~0.6 ms of a 2 ms layer of MAE-LM base (docs/results.md).
Contiguous positions (MLM, the self-attention decoder) share one [1, N, T, S] bias across
the batch. The cost of holding it (a bf16 [B, N, T, S]) is ~3% of MAE-LM large's largest
batch; `model.relative_bias_once=False` keeps the factored form per query block instead.

`model.attention_impl` puts attentions through a fused kernel (`AttentionOptions`): cuDNN
on GPU takes every attention (bias, segments and local windows as an additive mask, and
probability dropout where `model.attention_dropout_impl` is "cudnn"; model/kernels/cudnn.py),
splash on TPU those without a bias or dropout. The rest stay on the XLA path below, where
dropout drops the probabilities as fairseq does, from the step's key.
"""

import dataclasses

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model import logical_axes as ax
from maelm_jax.model.kernels.choice import XLA_PATH, AttentionOptions
from maelm_jax.model.positions.relative_bias import RelativeBias, StackBias
from maelm_jax.model.positions.rotary import Window, rotate
from maelm_jax.model.remat import saved


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
        if cfg.modern:  # bias-free, as ModernBERT
            return kernel.astype(cfg.dtype), jnp.zeros((), cfg.dtype)
        bias = self.param(
            f"{name}_bias",
            ax.param(nn.initializers.zeros, bias_axes),
            tuple(sizes[a] for a in bias_axes),
        )
        return kernel.astype(cfg.dtype), bias.astype(cfg.dtype)

    dropout_rate: float = 0.0  # on the attention probabilities

    @nn.compact
    def __call__(
        self,
        x,
        context,
        segments,
        bias=None,
        deterministic: bool = True,
        rotations=None,
        window: Window | None = None,
    ):
        """segments: (query [B, T], key [B, S]) int segment ids; bias: as `attend` takes it;
        rotations: ((cos, sin) of the queries, of the keys), [B|1, T|S, H/2] each, or None
        (positions/rotary.py); window: a local layer's `rotary.Window` or None."""
        cfg = self.config

        def project(name, inputs):  # named for the remat policies (remat.py)
            kernel, b = self._weights(name, ("heads", "kv"))
            y = jnp.einsum("bse,enh->bsnh", inputs.astype(cfg.dtype), kernel) + b
            return saved(ax.constrain(y, ax.HEADS), name)

        q, k, v = project("query", x), project("key", context), project("value", context)
        if rotations is not None:
            (q_cos, q_sin), (k_cos, k_sin) = rotations
            q, k = rotate(q, q_cos, q_sin), rotate(k, k_cos, k_sin)
        dropout_rng = None
        if self.dropout_rate > 0.0 and not deterministic:
            dropout_rng = self.make_rng("dropout")
        chunk = cfg.attention_query_chunk
        options = AttentionOptions(
            cfg.attention_impl,
            cfg.kernel_interpret,
            jnp.float32 if cfg.float32_attention_logits else None,
            cfg.attention_dropout_impl,
            cfg.relative_bias_impl,
        )
        out = attend(
            q, k, v, *segments, bias, self.dropout_rate, dropout_rng, chunk, options, window
        )
        kernel, b = self._weights("out", ("embed",))
        y = jnp.einsum("bsnh,enh->bse", ax.constrain(out, ax.HEADS), kernel) + b
        return saved(y, "attention_out")


def segment_mask(query_segments, key_segments):
    """[B, T], [B, S] int -> bool [B, 1, T, S]: True where the key is in the query's segment."""
    return (query_segments[:, :, None] == key_segments[:, None, :])[:, None]


@flax.struct.dataclass
class QueryBlocks:
    """A stack's bias already cut into `attend`'s query blocks: values [n, B|1, N, size, S],
    buckets [n, B|1, size, S], and the one table."""

    blocks: StackBias

    def block(self, values, buckets) -> StackBias:
        return StackBias(values, buckets, self.blocks.table, self.blocks.summed)


def query_blocks(t: int, query_chunk: int) -> tuple[int, int]:
    """(number, size) of `attend`'s query blocks for T queries: equal blocks of at most
    `query_chunk`, the last padded; (1, T) without chunking."""
    if not query_chunk or t <= query_chunk:
        return 1, t
    n = -(-t // query_chunk)
    return n, -(-t // n)


def split_queries(x, n: int, size: int, axis: int = 1, fill=0):
    """[..., T, ...] -> [n, ..., size, ...] along `axis`, padded with `fill`."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n * size - x.shape[axis])
    x = jnp.pad(x, pad, constant_values=fill)
    x = x.reshape((*x.shape[:axis], n, size, *x.shape[axis + 1 :]))
    return jnp.moveaxis(x, axis, 0)


def stack_bias(
    bias: RelativeBias | None, dtype, query_chunk: int, once: bool = True, summed: bool = False
):
    """The bias every layer of a stack adds, made once: [B|1, N, T, S] in `dtype`, or as
    `QueryBlocks` where `attend` splits the queries (so no layer re-cuts it). Padded query
    rows take position 0; `attend` never reads their scores. With `once` False the bias stays
    factored, and each layer's query blocks build their own (less memory, more time).
    `summed`: the layers' gradients are summed before the one contraction (`StackBias`)."""
    if bias is None or not once:
        return bias
    n, size = query_blocks(bias.query_positions.shape[1], query_chunk)
    if n == 1:
        return bias.shared(dtype, summed)
    rows = split_queries(bias.query_positions, n, size)  # [n, B|1, size]

    def parts(positions):
        made = dataclasses.replace(bias, query_positions=positions).shared(dtype, summed)
        return made.values, made.buckets

    values, buckets = jax.vmap(parts)(rows)
    return QueryBlocks(StackBias(values, buckets, bias.table, summed))


def _dense(bias, dtype):
    if isinstance(bias, RelativeBias):
        return bias.dense(dtype)
    if isinstance(bias, StackBias):
        return bias.layer().astype(dtype)
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
    options: AttentionOptions = XLA_PATH,
    window: Window | None = None,
):
    """q [B, T, N, H], k and v [B, S, N, H], segment ids [B, T] and [B, S], bias (a
    `RelativeBias`, [B|1, N, T, S], `QueryBlocks` from `stack_bias`, or None) -> [B, T, N, H];
    dropout on the probabilities iff `dropout_rng`.

    A fused kernel (`options`) takes the whole sequence. Otherwise, with `query_chunk` > 0
    and T longer, the queries go in ceil(T / query_chunk) equal blocks
    (the last padded with queries that see no key), each under `jax.checkpoint`, so no
    [B, N, T, S] array exists in either pass. Every query's result is the same as unchunked.

    `window` (positions/rotary.py) narrows a local layer's keys: a local self-attention runs
    in blocks of `window.block` queries against the keys their window can reach
    (`_attend_local`). In a scanned stack, where being global is data, a `cond` picks
    the global computation (a kernel where `options` has one) or the local one per layer.
    """
    args = (q, k, v, query_segments, key_segments, bias, dropout_rate, dropout_rng)
    if options.relative_bias_impl == "triton" and isinstance(bias, RelativeBias) and window is None:
        from maelm_jax.model.kernels.relative_attend import relative_attend

        out = relative_attend(*args, interpret=options.interpret)
        return _zero_rows_without_keys(out, segment_mask(query_segments, key_segments))
    if window is not None and options.dense_local(q.shape[1], window, dropout_rng):
        # One kernel call for global and local layers alike: the window's mask already
        # lifts itself where the layer is global, so a scanned stack needs no `cond`.
        dense = _dense(bias, q.dtype)
        return _attend_block(*args[:5], dense, dropout_rate, dropout_rng, options, window)
    if window is not None and not isinstance(window.is_global, bool):
        return jax.lax.cond(
            window.is_global,
            lambda: attend(*args, query_chunk, options),
            lambda: attend(*args, query_chunk, options, window.replace(is_global=False)),
        )
    if window is not None and window.is_global:
        window = None
    if window is not None:
        block = window.block
        if bias is None and q.shape[1] == k.shape[1] > block + 2 * window.half:
            return _attend_local(*args, window, block, options)
    t = q.shape[1]
    n, size = query_blocks(t, 0 if options.fused(bias, dropout_rng) else query_chunk)
    if isinstance(bias, QueryBlocks) and bias.blocks.values.shape[0] != n:
        given = bias.blocks.values.shape[0]
        raise ValueError(f"bias in {given} query blocks for {n} blocks of queries")
    if n == 1:
        bias = _dense(bias, q.dtype)
        return _attend_block(
            q, k, v, query_segments, key_segments, bias, dropout_rate, dropout_rng, options, window
        )

    def blocks(x, axis=1, fill=0):
        return split_queries(x, n, size, axis, fill)

    if isinstance(bias, QueryBlocks):
        bias_blocks = (bias.blocks.values, bias.blocks.buckets)
    elif isinstance(bias, RelativeBias):
        bias_blocks = blocks(bias.query_positions)
    elif bias is not None:
        bias_blocks = blocks(bias, axis=2)
    else:
        bias_blocks = None

    window_blocks = None if window is None else blocks(window.query_positions)

    @jax.checkpoint
    def block(inputs):
        index, q_block, segments, bias_block, positions = inputs
        if isinstance(bias, RelativeBias):
            block_bias = dataclasses.replace(bias, query_positions=bias_block).dense(q.dtype)
        elif isinstance(bias, QueryBlocks):
            block_bias = _dense(bias.block(*bias_block), q.dtype)
        else:  # a dense bias
            block_bias = None if bias is None else bias_block.astype(q.dtype)
        rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, index)
        block_window = None if window is None else window.replace(query_positions=positions)
        return _attend_block(
            q_block,
            k,
            v,
            segments,
            key_segments,
            block_bias,
            dropout_rate,
            rng,
            options,
            block_window,
        )

    inputs = (
        jnp.arange(n),
        blocks(q),
        blocks(query_segments, fill=-1),
        bias_blocks,
        window_blocks,
    )
    out = jax.lax.map(block, inputs)  # [n, B, size, N, H]
    out = jnp.moveaxis(out, 0, 1)
    return out.reshape((out.shape[0], n * size, *out.shape[3:]))[:, :t]


def _attend_local(
    q, k, v, query_segments, key_segments, bias, dropout_rate, dropout_rng, window, block, options
):
    """A local self-attention layer in query blocks, each against only the keys its window
    can reach: with positions ascending along the row (arange, or the kept tokens' original
    positions), |p_i - p_j| <= half implies |i - j| <= half, so the keys of queries
    [s, s + block) lie in [s - half, s + block + half), a static span. The window itself is
    still the positions' mask inside it. Scores are [B, N, block, block + 2 half] per block
    instead of [B, N, block, S]: the same result as the dense masked path (tests), for a
    fraction of its work at long context. Key spans are slices of shifted copies, no gather,
    and the blocks are a vmap, not a loop: all of them at once hold [B, N, T, block + 2 half]
    scores, linear in T, and XLA's cost analysis counts every block (it counts a loop once).
    """
    del bias  # None: the modern backbone has no additive bias
    t, half = q.shape[1], window.half
    n, span = -(-t // block), block + 2 * half
    copies = -(-span // block)
    positions = jnp.broadcast_to(window.query_positions, query_segments.shape)

    def spans(x, fill):
        """[B, T, ...] -> [n, B, span, ...]: block j's keys, rows j * block - half onwards."""
        pad = [(0, 0)] * x.ndim
        pad[1] = (half, (n + copies) * block - t - half)
        x = jnp.pad(x, pad, constant_values=fill)
        x = x.reshape(x.shape[0], n + copies, block, *x.shape[2:])
        x = jnp.concatenate([x[:, i : i + n] for i in range(copies)], axis=2)[:, :, :span]
        return jnp.moveaxis(x, 1, 0)

    def one_block(*inputs):
        index, q_block, q_seg, q_pos, k_block, v_block, k_seg, k_pos = inputs
        rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, index)
        block_window = Window(q_pos, k_pos, False, half, block)
        return _attend_block(
            q_block, k_block, v_block, q_seg, k_seg, None, dropout_rate, rng, options, block_window
        )

    inputs = (
        jnp.arange(n),
        split_queries(q, n, block),
        split_queries(query_segments, n, block, fill=-1),
        split_queries(positions, n, block),
        spans(k, 0),
        spans(v, 0),
        spans(key_segments, -2),  # matches no query, not even a padded one (-1)
        spans(positions, 0),
    )
    out = jnp.moveaxis(jax.vmap(one_block)(*inputs), 0, 1)  # [B, n, block, N, H]
    return out.reshape((out.shape[0], n * block, *out.shape[3:]))[:, :t]


def _attend_block(
    q, k, v, query_segments, key_segments, bias, dropout_rate, dropout_rng, options, window=None
):
    """`attend` on dense inputs: the only place that turns segment ids into a mask, and the
    one a fused kernel replaces where it applies (`AttentionOptions`).

    The scores are the product of `options.logits_dtype` (bf16 in a bf16 model, t5x's and
    MaxText's default): XLA's TPU model put float32 scores at a third of an attention layer's
    time, for the extra bytes of a [B, N, T, S] float32 array written and read in both
    passes, and a bias or mask added to them split the fusion (docs/results.md). The
    softmax itself runs in float32. The segment mask is additive so it fuses like the bias.
    """
    if options.impl == "cudnn" and options.fused(bias, dropout_rng):
        from maelm_jax.model.kernels.cudnn import cudnn_attend

        mask = segment_mask(query_segments, key_segments)
        if window is not None:
            mask = mask & window.mask()
        dropout = None if dropout_rng is None else (dropout_rate, dropout_rng)
        out = cudnn_attend(q, k, v, mask, bias, dropout)
        return _zero_rows_without_keys(out, mask)
    if window is None and options.fused(bias, dropout_rng):
        from maelm_jax.model.kernels.splash import splash_attend

        return splash_attend(q, k, v, query_segments, key_segments, interpret=options.interpret)
    mask = segment_mask(query_segments, key_segments)
    if window is not None:
        mask = mask & window.mask()
    dtype = options.logits_dtype or q.dtype
    scale = jnp.asarray(1.0 / np.sqrt(q.shape[-1]), q.dtype)
    logits = jnp.einsum("btnh,bsnh->bnts", q * scale, k, preferred_element_type=dtype)
    if bias is not None:
        logits = logits + bias.astype(dtype)
    logits = logits + jnp.where(mask, jnp.zeros((), dtype), jnp.finfo(dtype).min)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        # A product, not jnp.where(keep, probs / (1 - rate), 0): the same values, and libtpu
        # 0.0.42 segfaults compiling the `where` form in query blocks under remat.
        probs = probs * (keep.astype(jnp.float32) / (1.0 - dropout_rate))
    out = jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v)
    return _zero_rows_without_keys(out, mask)


def _zero_rows_without_keys(out, mask):
    has_key = jnp.any(mask, axis=-1)[:, 0, :, None, None]  # [B, T, 1, 1]
    return jnp.where(has_key, out, jnp.zeros((), out.dtype))
