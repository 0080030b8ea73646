"""The relative-bias attention kernel (model/kernels/relative_flash.py), in the Pallas
interpreter: the same values and gradients (the table's included) as the dense XLA
attention under the kernel's own dropout mask, that mask's rate and independence, the
kernel's lowering for a GPU holding no array of the scores' size, and a MAE-LM model whose
encoder runs through it giving the dense model's loss and gradients."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_inputs import has_gpu, inputs
from test_model import PAD_ID, build, grad_fn
from test_model import assert_trees_close as trees_close
from tiny_configs import frozen, tiny_config

from maelm_jax.config import configdict
from maelm_jax.model.attention import AttentionOptions, attend
from maelm_jax.model.kernels import relative_flash
from maelm_jax.model.masked_lm import MaskedLM
from maelm_jax.model.positions.relative_bias import RelativeBias, bucket_edges

BUCKETS = 32
NAMES = ("q", "k", "v", "table")


def relative_inputs(t, s, cross, batch=2, heads=2):
    """`attention_inputs.inputs` (documents, padding 0, with `cross` a query document
    without keys) plus ascending original positions with gaps, as kept tokens have, and a
    [buckets, heads] table."""
    (q, k, v, q_seg, k_seg), cotangent = inputs(t, s, cross, batch=batch, heads=heads, dim=16)
    rng = np.random.default_rng(t + s)

    def positions(length):
        return np.stack(
            [np.sort(rng.choice(400, size=length, replace=False)) for _ in range(batch)]
        )

    q_pos = positions(t)
    k_pos = q_pos if not cross else positions(s)
    edges, zero = bucket_edges(BUCKETS, 64, 400)
    table = jnp.asarray(rng.normal(size=(BUCKETS, heads)), jnp.float32)
    bias = RelativeBias(table, jnp.asarray(q_pos), jnp.asarray(k_pos), edges, zero)
    return (q, k, v, q_seg, k_seg, bias), cotangent


def dense_with_keep(q, k, v, q_seg, k_seg, bias, keep, rate):
    """The XLA path's attention (`_attend_block`'s arithmetic in float32) under `keep`."""
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1]) + bias.dense()
    mask = (q_seg[:, :, None] == k_seg[:, None, :])[:, None]
    probs = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
    probs = probs * jnp.any(mask, axis=-1, keepdims=True) * keep / (1.0 - rate)
    return jnp.einsum("bnts,bsnh->btnh", probs, v)


@pytest.mark.parametrize("t,s,cross,rate", [(70, 70, False, 0.0), (40, 90, True, 0.25)])
def test_kernel_gives_the_dense_attention_and_its_gradients(t, s, cross, rate):
    """Lengths that are not multiples of the block (padded inside), a row without keys
    (cross), padding, and dropout under the mask the kernel draws for that key."""
    (q, k, v, q_seg, k_seg, bias), cotangent = relative_inputs(t, s, cross)
    rng = jax.random.PRNGKey(7)
    options = AttentionOptions(relative_bias_impl="triton", interpret=True)
    keep = 1.0
    if rate:
        seed = jax.random.bits(rng, (), jnp.uint32)
        pad = relative_flash.BLOCK
        queries, keys = t + -t % pad, s + -s % pad
        keep = relative_flash.dropout_keep(seed, 2, 2, queries, keys, rate)[:, :, :t, :s]

    def kernel(q, k, v, table):
        bias_ = dataclasses.replace(bias, table=table)
        return attend(q, k, v, q_seg, k_seg, bias_, rate, rng if rate else None, 0, options)

    def dense(q, k, v, table):
        return dense_with_keep(q, k, v, q_seg, k_seg, dataclasses.replace(bias, table=table),
                               keep, rate)  # fmt: skip

    args = (q, k, v, bias.table)
    got, got_vjp = jax.vjp(kernel, *args)
    want, want_vjp = jax.vjp(dense, *args)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=2e-5)
    if cross:
        assert np.abs(want).sum(axis=(2, 3)).min() == 0  # a row without keys: zeros
    for name, g, w in zip(NAMES, got_vjp(cotangent), want_vjp(cotangent), strict=True):
        scale = np.abs(w).max()
        assert scale > 0, name
        np.testing.assert_allclose(g, w, atol=2e-6 * scale, rtol=1e-4, err_msg=name)


def test_dropout_masks_have_the_rate_and_differ_by_seed_example_and_head():
    rate, n = 0.1, 256
    keep = np.asarray(relative_flash.dropout_keep(jnp.uint32(5), 2, 2, n, n, rate))
    assert abs(keep.mean() - (1 - rate)) < 0.005  # 262k draws: sd 0.0006
    neighbours = (keep[..., :-1] == keep[..., 1:]).mean()
    assert abs(neighbours - 0.82) < 0.01, neighbours  # adjacent keys independent
    other = np.asarray(relative_flash.dropout_keep(jnp.uint32(6), 2, 2, n, n, rate))
    for a, b in [(keep, other), (keep[0], keep[1]), (keep[:, 0], keep[:, 1])]:
        agree = (a == b).mean()
        assert abs(agree - 0.82) < 0.01, agree  # independent: 0.9^2 + 0.1^2


def test_the_kernel_lowered_for_a_gpu_holds_no_array_of_the_scores_size():
    """mae_lm_base's encoder shape, lowered for CUDA on this CPU: three Triton kernels
    (forward, key blocks, query blocks), no value with a head axis and both sequence axes
    in the step, only the int8 [B, T, S] bucket codes every head shares."""
    b, t, n, h = 64, 448, 12, 64
    edges, zero = bucket_edges(64, 128, 512)
    x = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16)
    ints = jax.ShapeDtypeStruct((b, t), jnp.int32)

    def loss(q, k, v, segments, positions, table, seed):
        out = relative_flash.relative_attention(
            q, k, v, (segments, segments), (positions, positions), table, seed,
            edges=edges, zero_bucket=zero, rate=0.1,
        )  # fmt: skip
        return jnp.sum(out.astype(jnp.float32))

    args = (x, x, x, ints, ints, jax.ShapeDtypeStruct((64, n), jnp.float32), jnp.uint32(0))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 5)))
    # The GPU the kernels are lowered for: from jax 0.12 Triton lowering asks the device for
    # its compute capability, and a CPU-only host has none unless the mesh names one.
    h100 = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=132, platform="gpu")
    on_gpu = jax.sharding.AbstractMesh(
        (1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=h100
    )
    with jax.sharding.use_abstract_mesh(on_gpu):
        text = grad.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 3
    assert f"{n}x{t}x{t}x" not in text and f"{t}x{t}x{n}x" not in text
    assert f"tensor<{b}x{t}x{t}xi8>" in text


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_mae_lm_through_the_kernel_gives_the_dense_loss_and_gradients(decoder):
    """The whole model, deterministic: the encoder's relative bias stays factored
    (`stack_bias_of`), every biased attention runs in the kernel, and the loss and every
    gradient, the table's included, are the dense model's."""
    bias = dict(relative_attention_buckets=8, decoder_relative_attention=decoder == "self")
    model, params, batch = build("mae_lm", decoder, lengths=[30, 21, 12, 26], **bias)
    triton = dataclasses.replace(model.config, relative_bias_impl="triton", kernel_interpret=True)
    kernel_model = MaskedLM(triton, PAD_ID)
    rng = jax.random.PRNGKey(3)
    (want, _), grads_want = jax.jit(grad_fn(model, deterministic=True))(params, batch, rng)
    (got, _), grads = jax.jit(grad_fn(kernel_model, deterministic=True))(params, batch, rng)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    trees_close(grads, grads_want, atol=1e-6, rtol=1e-4)
    assert np.abs(grads["encoder"]["relative_bias"]["embedding"]).max() > 0
    scores = f"x{model.config.num_heads}x{batch.visible_idx.shape[1]}x{batch.visible_idx.shape[1]}x"
    hlo = lambda m: jax.jit(grad_fn(m, deterministic=True)).lower(params, batch, rng).as_text()
    assert scores in hlo(model) and scores not in hlo(kernel_model)


@pytest.mark.parametrize(
    "setting,platform,impl,multiple",
    [("auto", "gpu", "dense", 8), ("triton", "gpu", "triton", 64), ("triton", "cpu", "triton", 64)],
)
def test_relative_bias_impl_is_made_concrete_for_the_devices(setting, platform, impl, multiple):
    # bfloat16: "auto" attention is cuDNN on a GPU for a 16-bit model alone
    cfg = frozen(
        tiny_config(relative_attention_buckets=8, relative_bias_impl=setting, dtype="bfloat16")
    )[0]
    made = cfg.for_platform(platform)
    assert (made.relative_bias_impl, made.encoder_length_multiple) == (impl, multiple)
    assert made.kernel_interpret == (platform == "cpu" and impl == "triton")
    if setting == "auto":
        assert cfg.for_platform("tpu").relative_bias_impl == "dense"
    else:
        with pytest.raises(configdict.ConfigError, match=r"relative_bias_impl='triton'.*tpu"):
            cfg.for_platform("tpu")
    with pytest.raises(configdict.ConfigError, match=r"relative_bias_impl.*'triton'"):
        frozen(tiny_config(relative_bias_impl="pallas"))
    odd = frozen(tiny_config(relative_attention_buckets=24, relative_bias_impl="triton"))[0]
    with pytest.raises(configdict.ConfigError, match=r"relative_attention_buckets=24"):
        odd.for_platform(platform)


@pytest.mark.skipif(not has_gpu(), reason="the compiled Triton kernel needs a GPU")
def test_on_a_gpu_the_compiled_kernel_gives_the_dense_attention_and_its_gradients():
    """Compiled by Triton, in bfloat16 with dropout 0.1, at the head size and bucket count of
    mae_lm_base: values and gradients within bfloat16's rounding of the float32 dense
    attention under the kernel's own mask."""
    b, t, n, h, rate = 4, 200, 12, 64, 0.1
    rng = np.random.default_rng(0)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, cotangent = (jax.random.normal(key, (b, t, n, h)) for key in keys)
    segments = jnp.asarray(np.where(np.arange(t) < 120, 1, 2)[None].repeat(b, 0), jnp.int32)
    segments = segments.at[:, 190:].set(0)
    positions = np.stack([np.sort(rng.choice(512, size=t, replace=False)) for _ in range(b)])
    edges, zero = bucket_edges(64, 128, 512)
    table = jnp.asarray(rng.normal(size=(64, n)), jnp.float32)
    bias = RelativeBias(table, positions, positions, edges, zero)
    dropout_rng = jax.random.PRNGKey(9)
    seed = jax.random.bits(dropout_rng, (), jnp.uint32)
    size = t + -t % relative_flash.BLOCK
    keep = relative_flash.dropout_keep(seed, b, n, size, size, rate)[:, :, :t, :t]
    options = AttentionOptions(relative_bias_impl="triton")

    def kernel(q, k, v, table):
        bias_ = dataclasses.replace(bias, table=table)
        q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
        out = attend(q, k, v, segments, segments, bias_, rate, dropout_rng, 0, options)
        return out.astype(jnp.float32)

    def dense(q, k, v, table):
        bias_ = dataclasses.replace(bias, table=table)
        return dense_with_keep(q, k, v, segments, segments, bias_, keep, rate)

    def value_and_grads(f):
        def run(*args):
            out, vjp = jax.vjp(f, *args)
            return out, vjp(cotangent)

        return jax.jit(run)

    args = (q, k, v, table)
    got, got_grads = value_and_grads(kernel)(*args)
    want, want_grads = value_and_grads(dense)(*args)
    np.testing.assert_allclose(got, want, atol=0.03 * np.abs(want).max())
    for name, g, w in zip(NAMES, got_grads, want_grads, strict=True):
        scale = np.abs(w).max()
        assert np.abs(g - w).max() < 0.03 * scale, name


def test_under_a_mesh_the_kernel_is_shard_mapped_with_the_whole_batchs_dropout():
    """Batch over "data" and heads over "model" on 8 CPU devices: each shard runs the kernel
    on its own examples and heads with their dropout masks in the whole batch, so the
    values and gradients (the table's summed over the batch's shards) are the unsharded
    call's."""
    (q, k, v, q_seg, k_seg, bias), cotangent = relative_inputs(40, 40, False, batch=4, heads=4)
    rng = jax.random.PRNGKey(5)
    options = AttentionOptions(relative_bias_impl="triton", interpret=True)

    def run(q, k, v, table):
        bias_ = dataclasses.replace(bias, table=table)
        out = attend(q, k, v, q_seg, k_seg, bias_, 0.2, rng, 0, options)
        return out, jax.vjp(lambda *a: attend(*a[:3], q_seg, k_seg, dataclasses.replace(
            bias, table=a[3]), 0.2, rng, 0, options), q, k, v, table)[1](cotangent)  # fmt: skip

    args = (q, k, v, bias.table)
    want, want_grads = jax.jit(run)(*args)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:8]).reshape(4, 2), ("data", "model"))
    rules = (
        ("activation_batch", "data"),
        ("activation_length", None),
        ("activation_heads", "model"),
        ("activation_kv", None),
    )
    fn = jax.jit(run)
    with jax.sharding.set_mesh(mesh), nn.logical_axis_rules(rules):
        text = fn.lower(*args).as_text()
        got, grads = fn(*args)
    assert "sdy.manual_computation" in text  # the kernel runs per shard
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=2e-5)
    for name, g, w in zip(NAMES, grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-6 * np.abs(w).max(), rtol=1e-4, err_msg=name)
