"""Flash attention that adds MAE-LM's relative bias inside the kernel (Pallas on Triton, GPU).

Why: cuDNN takes the relative bias only as a [B, N, T, S] array, and the MAE-LM encoder's is
per example (the kept tokens' distances differ). On an H200 at mae_lm_base's encoder shape
(64 x 12 x 435 x 435, dropout 0.1), cuDNN reading that array cost 0.46 ms a layer and writing
its gradient 0.43 ms, and making it and summing its gradient cost more outside the layer
(docs/results.md, one H200, 2026-11-27 09:45). Here no array of the scores' size exists in
either pass: each score's bias is looked up in the [buckets, N] table by an int8 code per (example,
query, key) that every head and kernel shares (`bucket_codes`; it marks hidden keys too),
and the table's gradient is summed per key block inside the backward kernel.

What it measured (docs/results.md, one H200, 2026-11-27 11:06): 4.1 ms a layer against
cuDNN's 2.8 to 3.2 with the bias, and mae_lm_base's step 102.2 ms against 96.0. Of those
4.1 ms, 1.0 to 1.3 go to the per-bucket sums of the table's gradient: up to ~57 passes over
a diagonal block's tile. The forward pass is 1.0 to 1.3 ms. So `model.relative_bias_impl`
"auto" stays on the dense bias. Also, jax 0.11 deprecates Pallas's Triton backend for Mosaic
GPU, where a next version would go.

What the kernel computes is `attention._attend_block` with a `RelativeBias`: scores
q k^T / sqrt(H) + table[bucket(key position - query position)], a key visible iff its
segment is the query's, softmax in float32, and probability dropout. Dropout draws its mask
from a counter hash (murmur3's finaliser) of the step's seed and the (example, head, query,
key) index, in the forward and again in the backward pass. It is a function of the layer's
dropout key, so a resumed run draws the masks the uninterrupted one would have
(`dropout_keep` gives them to the tests). Lengths must be multiples of the blocks
(relative_attend.py pads); the head size and bucket count must be powers of two. Runs on CPU
in the Pallas interpreter (`interpret=True`) for the tests.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from maelm_jax.config.run_config import TRITON_BLOCK
from maelm_jax.model.positions.relative_bias import offset_buckets

# Query and key block; lengths pad to a multiple of it.
BLOCK = TRITON_BLOCK
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: a row without keys stays NaN-free
_LOG2E = math.log2(math.e)
# False: the table's gradient left at zero, so benchmarks/relative_kernel_speed.py can time
# what summing it costs (1.0 to 1.3 of 4.1 ms a layer on an H200). Never False in a model.
_TABLE_GRADIENT = True


def _fmix32(x):
    """murmur3's 32-bit finaliser: every input bit reaches every output bit."""
    x = x ^ jax.lax.shift_right_logical(x, jnp.uint32(16))
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ jax.lax.shift_right_logical(x, jnp.uint32(13))
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ jax.lax.shift_right_logical(x, jnp.uint32(16))


def _stream(seed, example, head, heads):
    """The scalar that makes (example, head)'s dropout stream distinct from every other's;
    `example` and `head` count in the whole batch and head axis, not a shard's."""
    index = example.astype(jnp.uint32) * heads + head.astype(jnp.uint32)
    return _fmix32(seed ^ _fmix32(index * jnp.uint32(0x9E3779B1) + jnp.uint32(1)))


def _program_stream(key_ref, b, n):
    """`_stream` of this program's (example, head); `key_ref` holds (seed, the shard's first
    example, its first head, the heads of the whole layer)."""
    return _stream(
        key_ref[0], b.astype(jnp.uint32) + key_ref[1], n.astype(jnp.uint32) + key_ref[2], key_ref[3]
    )


def _keep(stream, rows, cols, keys: int, rate: float):
    """bool [rows, cols]: which probabilities survive dropout, P = 1 - rate each."""
    counter = (rows[:, None] * keys + cols[None, :]).astype(jnp.uint32)
    threshold = jnp.uint32(min(round(rate * 2.0**32), 2**32 - 1))
    return _fmix32(counter ^ stream) >= threshold


def dropout_keep(seed, batch: int, heads: int, queries: int, keys: int, rate: float):
    """bool [B, N, T, S]: the kernel's dropout mask for `seed`, for tests and references."""
    example = jnp.arange(batch)[:, None]
    head = jnp.arange(heads)[None, :]
    streams = _stream(jnp.asarray(seed, jnp.uint32), example, head, jnp.uint32(heads))  # [B, N]
    keep = jax.vmap(jax.vmap(lambda s: _keep(s, jnp.arange(queries), jnp.arange(keys), keys, rate)))
    return keep(streams)


class _Spec:
    """The static half of a call: shapes, blocks, the table's size, the dropout rate."""

    def __init__(self, q, k, table, rate, interpret, blocks, warps):
        self.batch, self.queries, self.heads, self.head_dim = q.shape
        self.keys = k.shape[1]
        self.buckets = table.shape[0]
        self.rate, self.interpret = float(rate), bool(interpret)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.block_q, self.block_k = blocks
        self.warps = warps

    def scores(self, q, k, codes, table_ref):
        """(scores in base-2 units, visible) of one [block_q, block_k] block; `codes` int
        [block_q, block_k]: each score's bucket, or `buckets - 1` where the key is hidden."""
        codes = codes.astype(jnp.int32)
        bias = table_ref[codes] if self.interpret else plgpu.load(table_ref.at[codes])
        visible = codes != self.buckets - 1
        s = plgpu.dot(q, k.T) * self.scale + bias
        return jnp.where(visible, s * _LOG2E, _MASKED), visible

    def dropped(self, p, stream, rows, cols):
        """p with dropout applied and rescaled, as the forward pass applied it."""
        if not self.rate:
            return p
        keep = _keep(stream, rows, cols, self.keys, self.rate)
        return jnp.where(keep, p * (1.0 / (1.0 - self.rate)), 0.0)

    def call(self, kernel, grid, in_specs, out_specs, out_shape, name):
        return pl.pallas_call(
            kernel,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            out_shape=out_shape,
            compiler_params=plgpu.CompilerParams(num_warps=self.warps, num_stages=2),
            interpret=self.interpret,
            name=name,
        )


def _rows(ref, start, size):
    return ref[pl.ds(start * size, size)]


def _tile(codes_ref, iq, ik, spec: _Spec):
    return codes_ref[pl.ds(iq * spec.block_q, spec.block_q), pl.ds(ik * spec.block_k, spec.block_k)]


def _forward_kernel(seed_ref, q_ref, k_ref, v_ref, codes_ref, table_ref, o_ref, lse_ref, *,
                    spec: _Spec):  # fmt: skip
    iq, b, n = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    stream = _program_stream(seed_ref, b, n)
    q = q_ref[...]
    rows = iq * spec.block_q + jnp.arange(spec.block_q)

    def body(ik, carry):
        o, m, total = carry
        k, v = _rows(k_ref, ik, spec.block_k), _rows(v_ref, ik, spec.block_k)
        s, _ = spec.scores(q, k, _tile(codes_ref, iq, ik, spec), table_ref)
        m_next = jnp.maximum(m, jnp.max(s, axis=1))
        correction = jnp.exp2(m - m_next)
        p = jnp.exp2(s - m_next[:, None])
        total = total * correction + jnp.sum(p, axis=1)
        p = spec.dropped(p, stream, rows, ik * spec.block_k + jnp.arange(spec.block_k))
        o = o * correction[:, None] + plgpu.dot(p.astype(v.dtype), v)
        return o, m_next, total

    o = jnp.zeros((spec.block_q, spec.head_dim), jnp.float32)
    m = jnp.full((spec.block_q,), _MASKED, jnp.float32)
    total = jnp.zeros((spec.block_q,), jnp.float32)
    o, m, total = jax.lax.fori_loop(0, spec.keys // spec.block_k, body, (o, m, total))
    o_ref[...] = (o / total[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(total)


def _key_block_kernel(seed_ref, q_ref, k_ref, v_ref, codes_ref, table_ref, do_ref, lse_ref,
                      delta_ref, dk_ref, dv_ref, dtable_ref, *, spec: _Spec):  # fmt: skip
    """dk, dv and the table's gradient for one key block, over every query block."""
    ik, b, n = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    stream = _program_stream(seed_ref, b, n)
    k, v = k_ref[...], v_ref[...]
    cols = ik * spec.block_k + jnp.arange(spec.block_k)
    bucket_ids = jnp.arange(spec.buckets)

    def body(iq, carry):
        dk, dv, dtable = carry
        q, do = _rows(q_ref, iq, spec.block_q), _rows(do_ref, iq, spec.block_q)
        codes = _tile(codes_ref, iq, ik, spec).astype(jnp.int32)
        s, visible = spec.scores(q, k, codes, table_ref)
        p = jnp.exp2(s - _rows(lse_ref, iq, spec.block_q)[:, None])
        rows = iq * spec.block_q + jnp.arange(spec.block_q)
        dv += plgpu.dot(spec.dropped(p, stream, rows, cols).astype(do.dtype).T, do)
        dp = spec.dropped(plgpu.dot(do, v.T), stream, rows, cols)
        ds = p * (dp - _rows(delta_ref, iq, spec.block_q)[:, None])  # d loss / d score
        dk += plgpu.dot((ds * spec.scale).astype(q.dtype).T, q)
        # The table's gradient: ds summed per bucket, over the buckets this block's visible
        # scores reach (a hidden score's ds is 0, its code the unused last bucket).
        low = jnp.min(jnp.where(visible, codes, spec.buckets))
        high = jnp.max(jnp.where(visible, codes, -1))

        def per_bucket(bucket, dtable):
            total = jnp.sum(jnp.where(codes == bucket, ds, 0.0))
            return dtable + jnp.where(bucket_ids == bucket, total, 0.0)

        if _TABLE_GRADIENT:
            dtable = jax.lax.fori_loop(low, high + 1, per_bucket, dtable)
        return dk, dv, dtable

    zeros = jnp.zeros((spec.block_k, spec.head_dim), jnp.float32)
    init = (zeros, zeros, jnp.zeros((spec.buckets,), jnp.float32))
    dk, dv, dtable = jax.lax.fori_loop(0, spec.queries // spec.block_q, body, init)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
    dtable_ref[...] = dtable


def _query_block_kernel(seed_ref, q_ref, k_ref, v_ref, codes_ref, table_ref, do_ref, lse_ref,
                        delta_ref, dq_ref, *, spec: _Spec):  # fmt: skip
    """dq for one query block, over every key block."""
    iq, b, n = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    stream = _program_stream(seed_ref, b, n)
    q, do = q_ref[...], do_ref[...]
    lse, delta = _rows(lse_ref, iq, spec.block_q), _rows(delta_ref, iq, spec.block_q)
    rows = iq * spec.block_q + jnp.arange(spec.block_q)

    def body(ik, dq):
        k, v = _rows(k_ref, ik, spec.block_k), _rows(v_ref, ik, spec.block_k)
        s, _ = spec.scores(q, k, _tile(codes_ref, iq, ik, spec), table_ref)
        p = jnp.exp2(s - lse[:, None])
        cols = ik * spec.block_k + jnp.arange(spec.block_k)
        dp = spec.dropped(plgpu.dot(do, v.T), stream, rows, cols)
        ds = p * (dp - delta[:, None])
        return dq + plgpu.dot((ds * spec.scale).astype(k.dtype), k)

    dq = jax.lax.fori_loop(0, spec.keys // spec.block_k, body, jnp.zeros_like(q, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def bucket_codes(segments, positions, edges, zero_bucket, buckets: int):
    """int8 [B, T, S]: each score's bucket (`relative_bias.offset_buckets`), or `buckets - 1`,
    a row fairseq's layout never uses (its buckets run 0 .. buckets - 2), where the key is
    in another segment. Made by XLA in one elementwise pass and read by every kernel: the
    bucket count and the segment test would otherwise be ~50 integer operations per score
    in each of the three kernels, heads included, where here they are done once per
    example."""
    (q_seg, k_seg), (q_pos, k_pos) = segments, positions
    codes = offset_buckets(k_pos[:, None, :] - q_pos[:, :, None], edges, zero_bucket)
    visible = q_seg[:, :, None] == k_seg[:, None, :]
    return jnp.where(visible, codes, buckets - 1).astype(jnp.int8)


def relative_attention(q, k, v, segments, positions, table, seed, *, edges, zero_bucket,
                       rate=0.0, interpret=False, blocks=(BLOCK, BLOCK), warps=4,
                       offsets=(0, 0), heads=None):  # fmt: skip
    """q [B, T, N, H], k and v [B, S, N, H] (T, S multiples of the blocks), segments and
    positions ((query [B, T], key [B, S]) int each, positions broadcastable from [1, ...]),
    table [K, N] float32, seed uint32 [] (dropout's; unused at rate 0) -> [B, T, N, H]. The
    rows of a query whose segment has no key are not zeroed: the caller does that. In a
    shard, `offsets` (its first example and head) and `heads` (the layer's) keep its dropout
    masks those of the whole batch's."""
    spec = _Spec(q, k, table, rate, interpret, blocks, warps)
    for name, length, block in (
        ("queries", spec.queries, spec.block_q),
        ("keys", spec.keys, spec.block_k),
    ):
        if length % block:
            raise ValueError(f"relative_attention: {length} {name}, not a multiple of {block}")
    if spec.buckets & (spec.buckets - 1) or spec.head_dim & (spec.head_dim - 1):
        raise ValueError(
            f"relative_attention: {spec.buckets} buckets and head size {spec.head_dim}; "
            "both must be powers of two"
        )
    if zero_bucket + len(edges) >= spec.buckets - 1 or spec.buckets > 128:
        raise ValueError(
            f"relative_attention: buckets up to {zero_bucket + len(edges)} in a table of "
            f"{spec.buckets}; the last row must be unused (it marks hidden keys), at most 128"
        )
    batch = q.shape[:1]
    positions = [jnp.broadcast_to(p, batch + p.shape[1:]).astype(jnp.int32) for p in positions]
    codes = bucket_codes(segments, positions, edges, zero_bucket, spec.buckets)
    first = [jnp.asarray(o, jnp.uint32) for o in offsets]
    total = jnp.uint32(spec.heads if heads is None else heads)
    seed = jnp.stack([jnp.asarray(seed, jnp.uint32), *first, total])
    return _attention(spec, seed, q, k, v, codes, table.T.astype(jnp.float32))


def _in_specs(spec: _Spec, blocked: str):
    """BlockSpecs of (seed, q, k, v, codes, table) for a grid over `blocked`'s blocks ("q"
    or "k"), examples and heads."""
    h = spec.head_dim

    def rows(length, block, own):
        if own:
            return pl.BlockSpec((None, block, None, h), lambda i, b, n: (b, i, n, 0))
        return pl.BlockSpec((None, length, None, h), lambda i, b, n: (b, 0, n, 0))

    keys = rows(spec.keys, spec.block_k, blocked == "k")
    return [
        pl.BlockSpec((4,), lambda i, b, n: (0,)),
        rows(spec.queries, spec.block_q, blocked == "q"),
        keys,
        keys,
        pl.BlockSpec((None, spec.queries, spec.keys), lambda i, b, n: (b, 0, 0)),
        pl.BlockSpec((None, spec.buckets), lambda i, b, n: (n, 0)),
    ]


def _per_query(spec: _Spec):
    return pl.BlockSpec((None, None, spec.queries), lambda i, b, n: (b, n, 0))


def _own(spec: _Spec, block: int):
    return pl.BlockSpec((None, block, None, spec.head_dim), lambda i, b, n: (b, i, n, 0))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(spec, seed, q, k, v, codes, table_t):
    return _forward(spec, seed, q, k, v, codes, table_t)[0]


def _forward(spec: _Spec, *args):
    q = args[1]
    return spec.call(
        functools.partial(_forward_kernel, spec=spec),
        (spec.queries // spec.block_q, spec.batch, spec.heads),
        _in_specs(spec, "q"),
        [
            _own(spec, spec.block_q),
            pl.BlockSpec((None, None, spec.block_q), lambda i, b, n: (b, n, i)),
        ],
        [
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((spec.batch, spec.heads, spec.queries), jnp.float32),
        ],
        "relative_attention_forward",
    )(*args)


def _attention_fwd(spec, *args):
    out, lse = _forward(spec, *args)
    return out, (args, out, lse)


def _attention_bwd(spec, residuals, d_out):
    args, out, lse = residuals
    q, k, v = args[1:4]
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    d_out = d_out.astype(q.dtype)
    whole = pl.BlockSpec((None, spec.queries, None, spec.head_dim), lambda i, b, n: (b, 0, n, 0))
    extra = [whole, _per_query(spec), _per_query(spec)]
    blocks = spec.keys // spec.block_k
    dk, dv, dtable = spec.call(
        functools.partial(_key_block_kernel, spec=spec),
        (blocks, spec.batch, spec.heads),
        _in_specs(spec, "k") + extra,
        [
            _own(spec, spec.block_k),
            _own(spec, spec.block_k),
            pl.BlockSpec((None, None, None, spec.buckets), lambda i, b, n: (i, b, n, 0)),
        ],
        [
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct((blocks, spec.batch, spec.heads, spec.buckets), jnp.float32),
        ],
        "relative_attention_key_blocks",
    )(*args, d_out, lse, delta)
    extra[0] = _own(spec, spec.block_q)
    (dq,) = spec.call(
        functools.partial(_query_block_kernel, spec=spec),
        (spec.queries // spec.block_q, spec.batch, spec.heads),
        _in_specs(spec, "q") + extra,
        [_own(spec, spec.block_q)],
        [jax.ShapeDtypeStruct(q.shape, q.dtype)],
        "relative_attention_query_blocks",
    )(*args, d_out, lse, delta)
    return (None, dq, dk, dv, None, jnp.sum(dtable, axis=(0, 1)))


_attention.defvjp(_attention_fwd, _attention_bwd)
