"""Relative position buckets and mixed precision: small properties a wrong formula breaks."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_model import build, run
from tiny_configs import frozen, tiny_config

from maelm_jax.model.positions.relative_bias import (
    RelativeBias,
    RelativePositionBias,
    bucket_distances,
    bucket_edges,
    offset_buckets,
    relative_position_buckets,
)

# The official MAE-LM implementation's buckets (fairseq `relative_position_bucket` with its
# `rp_bucket -= rp_bucket.min()` shift, max_seq_len 512), for offsets key - query = -300..300,
# as run lengths: bucket b covers the next RUNS[b] offsets. Taken by running the reference.
OFFICIAL_RUNS = {
    (64, 128): [190, 14, 13, 10, 10, 8, 7, 6, 6, 5, 4, 3, 3, 3, 2]
    + [1] * 33
    + [2, 3, 3, 3, 4, 5, 6, 6, 7, 8, 10, 10, 13, 14, 190],
    # ae_large's defaults: 128 buckets, max distance 256.
    (128, 256): [62, 15, 15, 13, 13, 12, 11, 10, 10, 9, 8, 8, 8, 7, 6, 6, 6, 5, 5, 5, 4, 4, 4]
    + [3, 4, 3, 3, 2, 3, 2, 2]
    + [1] * 65
    + [2, 2, 3, 2, 3, 3, 4, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6, 7, 8, 8, 8, 9, 10, 10, 11, 12]
    + [13, 13, 15, 15, 62],
}


@pytest.mark.parametrize("buckets,max_distance", sorted(OFFICIAL_RUNS))
def test_buckets_equal_the_official_mae_lm_table(buckets, max_distance):
    expected = np.repeat(
        np.arange(len(OFFICIAL_RUNS[buckets, max_distance])), OFFICIAL_RUNS[buckets, max_distance]
    )
    table = relative_position_buckets(buckets, max_distance, max_positions=512)
    offsets = np.arange(-300, 301)
    np.testing.assert_array_equal(table[offsets + 511], expected)
    # Signed around a shared 0: one of the buckets is never used.
    assert table.min() == 0 and table.max() == buckets - 2


def test_buckets_are_exact_near_zero_and_monotone():
    table = relative_position_buckets(64, 128, max_positions=512)
    near = table[511 - 15 : 511 + 16]
    np.testing.assert_array_equal(np.diff(near), 1)  # one bucket per offset in -15..15
    assert (np.diff(table) >= 0).all()


def test_bfloat16_compute_keeps_float32_params_and_logits():
    model32, params, batch = build("mae_lm", "self")
    model16, _, _ = build("mae_lm", "self", dtype="bfloat16")
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    logits32, inter32 = run(model32, params, batch)
    logits16, inter16 = run(model16, params, batch)
    assert inter16["encoder_output"][0].dtype == jnp.bfloat16
    assert inter32["encoder_output"][0].dtype == jnp.float32
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, logits32, atol=0.05)


def test_explicit_attention_path_matches_the_fused_one_with_segments_and_bias():
    """The path dropout takes, at rate 0, equals jax.nn.dot_product_attention's; a query
    whose segment has no key gets zeros on both paths, not an average over other segments."""
    from maelm_jax.model.attention import attend

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (2, 5, 3, 4))
    k, v = (jax.random.normal(key, (2, 6, 3, 4)) for key in keys[1:3])
    bias = jax.random.normal(keys[3], (1, 3, 5, 6))
    q_seg = jnp.array([[1, 1, 2, 0, 3], [1, 2, 2, 2, 0]])
    k_seg = jnp.array([[1, 2, 2, 1, 0, 0], [2, 2, 1, 1, 1, 0]])
    fused = attend(q, k, v, q_seg, k_seg, bias)
    explicit = attend(q, k, v, q_seg, k_seg, bias, 0.0, jax.random.PRNGKey(1))
    np.testing.assert_allclose(explicit, fused, atol=1e-5)
    np.testing.assert_array_equal(fused[0, 4], 0.0)  # segment 3 has no key
    # Query 0 of row 0 (segment 1) sees keys 0 and 3 only: the output is their mix.
    logits = (
        jnp.einsum("nh,snh->ns", q[0, 0], k[0, jnp.array([0, 3])]) / 2.0
        + bias[0, :, 0][:, jnp.array([0, 3])]
    )
    want = jnp.einsum("ns,snh->nh", jax.nn.softmax(logits), v[0, jnp.array([0, 3])])
    np.testing.assert_allclose(fused[0, 0], want, atol=1e-5)


def test_local_init_starts_every_bucket_at_minus_slope_times_its_nearest_distance():
    """relative_attention_init_slope: bias(offset) = -slope * (nearest |offset| of its bucket)
    in every head, so it is exact (-slope * |d|) where buckets are exact and never favours a
    farther key over a nearer one."""

    slope, buckets, max_distance, length = 0.5, 16, 24, 32
    c = tiny_config(
        relative_attention_buckets=buckets,
        relative_attention_max_distance=max_distance,
        relative_attention_init_slope=slope,
    )
    cfg = frozen(c)[0]
    positions = jnp.arange(length)[None]
    module = RelativePositionBias(cfg, cfg.relative_attention_init_slope)
    params = nn.unbox(module.init(jax.random.PRNGKey(0), positions, positions))
    bias = np.asarray(module.apply(params, positions, positions).dense())[0]  # [N, T, S]
    np.testing.assert_array_equal(bias, np.broadcast_to(bias[:1], bias.shape))  # all heads
    offsets = np.arange(length)[None, :] - np.arange(length)[:, None]
    table = relative_position_buckets(buckets, max_distance, length)
    nearest = bucket_distances(buckets, max_distance, length)[table[offsets + length - 1]]
    np.testing.assert_allclose(bias[0], -slope * nearest)
    exact = np.abs(offsets) < buckets // 4
    np.testing.assert_allclose(bias[0][exact], -slope * np.abs(offsets[exact]))
    assert (nearest <= np.abs(offsets)).all() and nearest.max() > buckets // 4
    by_distance = [bias[0][np.abs(offsets) == d].min() for d in range(length)]
    assert (np.diff(by_distance) <= 0).all()
    # A cap stops the fall: every bucket at least `cap` away starts at -slope * cap.
    capped = RelativePositionBias(cfg, slope, 3.0)
    bias = capped.apply(nn.unbox(capped.init(jax.random.PRNGKey(0), positions, positions)),
                        positions, positions).dense()  # fmt: skip
    np.testing.assert_allclose(np.asarray(bias)[0, 0], -slope * np.minimum(nearest, 3.0))
    # slope 0 is the official normal(init_std) table: small, random, not local.
    official = RelativePositionBias(cfg, 0.0).init(jax.random.PRNGKey(0), positions, positions)
    values = np.asarray(nn.unbox(official)["params"]["embedding"])
    assert 0 < np.abs(values).max() < 0.2 and np.unique(values).size == values.size


def random_attention_inputs(keys: int):
    """q [2, 7, 3, 4], k and v [2, keys, 3, 4] and a 16-bucket table for 3 heads."""
    rngs = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(rngs[0], (2, 7, 3, 4))
    k, v = (jax.random.normal(rng, (2, keys, 3, 4)) for rng in rngs[1:3])
    return q, k, v, jax.random.normal(rngs[3], (16, 3))


@pytest.mark.parametrize("with_dropout_path", [False, True])
def test_query_blocks_give_the_unchunked_values_and_gradients(with_dropout_path):
    """attention_query_chunk: 7 queries in blocks of 3 (the last padded) against one block,
    with segments, a query that sees no key, and the factored relative bias at the kept
    tokens' original positions; equal outputs and equal gradients for q, k, v and the bias."""
    from maelm_jax.model.attention import attend

    q, k, v, by_bucket = random_attention_inputs(keys=6)
    edges, zero = bucket_edges(16, 12, 16)
    q_pos = jnp.array([[0, 2, 3, 5, 8, 9, 15], [1, 2, 4, 6, 7, 11, 12]])
    k_pos = jnp.array([[0, 1, 4, 6, 7, 10], [0, 3, 5, 8, 9, 10]])
    q_seg = jnp.array([[1, 1, 2, 0, 3, 2, 1], [1, 2, 2, 2, 0, 1, 1]])
    k_seg = jnp.array([[1, 2, 2, 1, 0, 0], [2, 2, 1, 1, 1, 0]])
    rng = jax.random.PRNGKey(1) if with_dropout_path else None  # rate 0: no draw differs

    def loss(q, k, v, by_bucket, chunk):
        bias = RelativeBias(by_bucket, q_pos, k_pos, edges, zero)
        out = attend(q, k, v, q_seg, k_seg, bias, 0.0, rng, query_chunk=chunk)
        return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape))), out

    grad = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
    (whole, out_whole), (blocked, out_blocked) = (grad(q, k, v, by_bucket, c) for c in (0, 3))
    np.testing.assert_allclose(out_blocked, out_whole, atol=1e-5)
    np.testing.assert_array_equal(out_blocked[0, 4], 0.0)  # segment 3 has no key
    for a, b in zip(blocked, whole, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.abs(whole[3]).max() > 0  # the bias's gradient is not trivially zero
    # The blocked program holds no [B, N, T, S] array; the whole one does.
    shapes = {
        c: str(jax.make_jaxpr(lambda *a, c=c: grad(*a, c))(q, k, v, by_bucket)) for c in (0, 3)
    }
    assert "f32[2,3,7,6]" in shapes[0] and "f32[2,3,7,6]" not in shapes[3]


@pytest.mark.parametrize(
    "buckets,max_distance,positions",
    [(64, 128, 512), (128, 256, 512), (32, 128, 128), (16, 12, 16)],
)
def test_bucket_edges_give_every_offsets_official_bucket(buckets, max_distance, positions):
    """The in-graph buckets (counts of edges reached) are the host table's, for every offset
    a model of `positions` can meet."""
    edges, zero = bucket_edges(buckets, max_distance, positions)
    offsets = np.arange(-(positions - 1), positions)
    np.testing.assert_array_equal(
        offset_buckets(jnp.asarray(offsets), edges, zero),
        relative_position_buckets(buckets, max_distance, positions),
    )


def test_one_hot_bias_equals_the_table_lookup_in_values_and_gradients():
    """The bias as a one-hot contraction against the [buckets, N] table: the same values as
    indexing the table by each score's bucket, and the same table gradient as that gather's
    scatter-add (colliding buckets summed)."""
    positions, buckets, heads = 64, 32, 3
    rngs = jax.random.split(jax.random.PRNGKey(0), 4)
    table = jax.random.normal(rngs[0], (buckets, heads))
    q_pos = jnp.sort(jax.random.choice(rngs[1], positions, (2, 9), replace=False), axis=-1)
    k_pos = jnp.sort(jax.random.randint(rngs[2], (2, 11), 0, positions), axis=-1)
    weights = jax.random.normal(rngs[3], (2, heads, 9, 11))
    edges, zero = bucket_edges(buckets, 40, positions)
    lookup = jnp.asarray(relative_position_buckets(buckets, 40, positions))

    def contracted(t):
        return RelativeBias(t, q_pos, k_pos, edges, zero).dense()

    def indexed(t):  # [B, T, S, N] -> [B, N, T, S]
        return jnp.moveaxis(t[lookup[k_pos[:, None, :] - q_pos[:, :, None] + positions - 1]], -1, 1)

    np.testing.assert_array_equal(contracted(table), indexed(table))
    grads = [jax.grad(lambda t, f=f: jnp.sum(f(t) * weights))(table) for f in (contracted, indexed)]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-5)
    assert np.count_nonzero(np.asarray(grads[1])) > buckets // 3
    hlo = jax.jit(jax.grad(lambda t: jnp.sum(contracted(t) * weights))).lower(table).as_text()
    assert "gather" not in hlo and "scatter" not in hlo  # matmuls, on a TPU's MXU


def test_a_stacks_bias_made_once_gives_the_factored_values_and_gradients():
    """`stack_bias`: the bias a layer stack makes once (dense, or cut into the query blocks
    where `attend` splits the queries) gives every layer the outputs, and the table the
    gradient, of building the bias from the factored form in each layer, whether each layer
    contracts its own gradient or their sum is contracted once; shared positions ([1, T])
    give one bias for the whole batch."""
    from maelm_jax.model.attention import QueryBlocks, attend, stack_bias

    q, k, v, table = random_attention_inputs(keys=7)
    edges, zero = bucket_edges(16, 12, 16)
    seg = jnp.array([[1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 2, 2, 2]])
    cases = {"per row": jnp.array([[0, 2, 3, 5, 8, 9, 15], [1, 2, 4, 6, 7, 11, 12]])}
    cases["shared"] = jnp.arange(7)[None]

    def loss(table, positions, chunk, once, summed=False):
        bias = RelativeBias(table, positions, positions, edges, zero)
        if once:
            bias = stack_bias(bias, jnp.float32, chunk, summed=summed)
        outs = [attend(q * i, k, v, seg, seg, bias, query_chunk=chunk) for i in (1, 2)]
        return sum(jnp.sum(o * jnp.sin(jnp.arange(o.size).reshape(o.shape))) for o in outs)

    for name, positions in cases.items():
        for chunk in (0, 3):
            factored = RelativeBias(table, positions, positions, edges, zero)
            made = stack_bias(factored, jnp.float32, chunk)
            rows = positions.shape[0]
            if chunk:  # 3 blocks of 3 queries, the last padded: no layer cuts it again
                assert isinstance(made, QueryBlocks)
                assert made.blocks.values.shape == (3, rows, 3, 3, 7)
                assert made.blocks.buckets.shape == (3, rows, 3, 7)
            else:
                assert made.values.shape == (rows, 3, 7, 7)
            per_layer, once = (
                jax.value_and_grad(loss)(table, positions, chunk, o) for o in (False, True)
            )
            # The layers' gradients summed first and contracted once (the GPU's default).
            summed = jax.value_and_grad(loss)(table, positions, chunk, True, True)
            for got in (once, summed):
                np.testing.assert_allclose(got[0], per_layer[0], rtol=1e-5, err_msg=name)
                np.testing.assert_allclose(got[1], per_layer[1], rtol=1e-4, atol=1e-5, err_msg=name)
            assert np.abs(once[1]).max() > 0


def test_a_bf16_bias_is_the_rounded_table_rows_with_a_float32_table_gradient():
    """In a bf16 model the bias is made in bf16 by the contraction itself (its layout is then
    the scores', `_contract`), and each score's value is its bucket's table row rounded to
    bf16, as a lookup gives. The table's gradient stays float32: the bf16 score gradients
    summed exactly, once per stack use (`StackBias.layer`) or through `dense`."""
    edges, zero = bucket_edges(16, 12, 16)
    positions = jnp.array([[0, 2, 3, 5, 8, 9, 15], [1, 2, 4, 6, 7, 11, 12]])
    table = jax.random.normal(jax.random.PRNGKey(1), (16, 3)) * 3.0
    weights = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 7, 7)).astype(jnp.bfloat16)
    factored = RelativeBias(table, positions, positions, edges, zero)
    buckets = np.asarray(factored.buckets())
    rows = np.asarray(table.astype(jnp.bfloat16).astype(jnp.float32))[buckets]  # [B, T, S, N]
    expected_bias = np.moveaxis(rows, -1, 1)
    w = np.asarray(weights.astype(jnp.float32), np.float64)
    expected_gradient = np.zeros((16, 3))
    np.add.at(expected_gradient, buckets, np.moveaxis(w, 1, -1))

    def through(make):
        def loss(table):
            bias = make(RelativeBias(table, positions, positions, edges, zero))
            return jnp.sum((bias * weights).astype(jnp.float32))

        return jax.grad(loss)(table)

    made = factored.dense(jnp.bfloat16)
    assert made.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(made.astype(jnp.float32)), expected_bias)
    np.testing.assert_array_equal(factored.shared(jnp.bfloat16).layer(), made)
    summed = factored.shared(jnp.bfloat16, summed=True).layer()  # float32, for the layers' sum
    assert summed.dtype == jnp.float32
    np.testing.assert_array_equal(summed, made.astype(jnp.float32))
    for make in (
        lambda b: b.dense(jnp.bfloat16),
        lambda b: b.shared(jnp.bfloat16).layer(),
        lambda b: b.shared(jnp.bfloat16, summed=True).layer(),
    ):
        gradient = through(make)
        assert gradient.dtype == jnp.float32
        np.testing.assert_allclose(gradient, expected_gradient, rtol=1e-6, atol=1e-6)
    # A bf16 gradient would be off by up to 2^-9 of its size; this one is not rounded.
    rounded = np.asarray(jnp.asarray(expected_gradient).astype(jnp.bfloat16), np.float64)
    assert np.abs(rounded - expected_gradient).max() > 1e-3
