"""Attention dropout inside cuDNN's kernel (model/kernels/cudnn.py).

On the CPU: `rolled`, which moves each layer onto other entries of cuDNN's mask, computes
the same attention (values and gradients) as the kernel it wraps, here the XLA one.
On a GPU (skipped elsewhere; `bash launch/gpu/bench.sh OUT - tests` runs them): the mask
cuDNN draws is read back through values that are the identity over keys, and checked for
its rate, for the values and gradients of the XLA attention under that same mask, for a new
mask each step, and for different masks in layers with different keys.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_inputs import has_gpu, inputs

from maelm_jax.model.attention import AttentionOptions, _attend_block, segment_mask
from maelm_jax.model.kernels.cudnn import COMPILER_OPTIONS, roll, rolled

needs_gpu = pytest.mark.skipif(not has_gpu(), reason="cuDNN's fused attention needs a GPU")


def reference(q, k, v, mask, bias, keep=None, rate=0.0):
    """Attention in plain jax on a boolean mask; `keep` [B, N, T, S] drops probabilities."""
    logits = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32) / np.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    logits = jnp.where(mask, logits, -1e30)
    probs = jax.nn.softmax(logits, axis=-1) * jnp.any(mask, axis=-1, keepdims=True)
    if keep is not None:
        probs = probs * keep / (1.0 - rate)
    return jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v)


@pytest.mark.parametrize("t,s,cross,bias_batch", [(45, 45, False, 1), (24, 40, True, 2)])
def test_rolled_attention_is_the_same_attention(t, s, cross, bias_batch):
    (q, k, v, q_seg, k_seg), cotangent = inputs(t, s, cross, batch=2, heads=3, dim=8)
    mask = segment_mask(q_seg, k_seg)
    bias = jax.random.normal(jax.random.PRNGKey(3), (bias_batch, 3, t, s))
    rng = jax.random.PRNGKey(12)
    keys = jax.random.split(rng)
    shifts = [
        int(jax.random.randint(keys[0], (), 0, t)),
        int(jax.random.randint(keys[1], (), 0, s)),
    ]
    assert all(shifts), shifts  # a zero roll would test nothing

    def run(fn):
        out, pull = jax.vjp(fn, q, k, v, bias)
        return [out, *pull(cotangent)]

    got = run(lambda q, k, v, b: rolled(reference, rng, q, k, v, mask, b))
    want = run(lambda q, k, v, b: reference(q, k, v, mask, b))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=name)


def _doubled(text, prefix, length):
    """The tensor types in lowered `text` that begin with `prefix` and have an axis of twice
    `length`: the copies `jnp.roll` concatenates."""
    pattern = rf"tensor<{prefix}(?:x\d+)*x{2 * length}(?:x\d+)*x\w+>"
    return sorted(set(re.findall(pattern, text)))


def test_the_rolls_gradient_is_one_roll_back():
    """`roll`'s backward pass is a roll the other way, not autodiff of `jnp.roll` (the
    cotangent written into a zero array of twice the length, cut in halves and added), which
    made most of mae_lm_base's large adds and pads on an H200 (its [B, N, T, S] bias rolls in
    every layer). The bias's roll makes no doubled copy in either pass (a gather, which XLA
    fuses); the queries' does (`jnp.roll`'s form, which kept mlm_base faster on an H200).
    Read from the lowered gradients with respect to the bias and the queries."""
    (q, k, v, q_seg, k_seg), _ = inputs(24, 24, False, batch=2, heads=3, dim=8)
    mask = segment_mask(q_seg, k_seg)
    bias = jax.random.normal(jax.random.PRNGKey(3), (2, 3, 24, 24))
    rng = jax.random.PRNGKey(12)
    shifts = jax.random.randint(rng, (2,), 0, 24)  # traced in the step: jit arguments here

    def lowered(fn, x=bias):
        loss = lambda x, s: jnp.sum(fn(x, tuple(s)) ** 2)
        return jax.jit(jax.grad(loss)).lower(x, shifts).as_text()

    plain = lowered(lambda b, s: jnp.roll(b, s, (2, 3)))
    assert "dynamic_update_slice" in plain  # the forms the checks look for
    assert _doubled(plain, "2x3", 24)
    for gather in False, True:
        text = lowered(lambda b, s, g=gather: roll(b, s, (2, 3), g))
        assert "dynamic_update_slice" not in text
        assert bool(_doubled(text, "2x3", 24)) is not gather

    layer = lowered(lambda b, s: rolled(reference, rng, q, k, v, mask, b))
    assert "dynamic_update_slice" not in layer
    assert _doubled(layer, "2x3", 24) == []  # the bias [2, 3, 24, 24]
    queries = lowered(lambda q, s: rolled(reference, rng, q, k, v, mask, bias), q)
    assert "dynamic_update_slice" not in queries
    assert "tensor<2x48x3x8xf32>" in _doubled(queries, "2", 24)  # q [2, 24, 3, 8]

    def value_and_grad(fn):
        out, pull = jax.jit(lambda b, s: jax.vjp(lambda b: fn(b, tuple(s), (2, 3)), b))(
            bias, shifts
        )
        return out, pull(bias**2)[0]

    want = value_and_grad(jnp.roll)
    for gather in False, True:
        got = value_and_grad(functools.partial(roll, gather=gather))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


RATE = 0.1
CUDNN_DROPOUT = AttentionOptions("cudnn", dropout_impl="cudnn")


def _identity_values(batch, heads, t, seed=0):
    """q, k random and v the identity over keys (S = H = 64): the output row of query t is
    its dropped probability row, so the mask cuDNN drew can be read back from it."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(keys[0], (batch, t, heads, 64), jnp.bfloat16)
    k = jax.random.normal(keys[1], (batch, 64, heads, 64), jnp.bfloat16)
    v = jnp.broadcast_to(jnp.eye(64, dtype=jnp.bfloat16)[None, :, None], (batch, 64, heads, 64))
    segments = jnp.ones((batch, t), jnp.int32), jnp.ones((batch, 64), jnp.int32)
    cotangent = jax.random.normal(keys[2], (batch, t, heads, 64), jnp.bfloat16)
    return q, k, v, segments, cotangent


def _dropped(q, k, v, segments, rng, bias=None):
    return _attend_block(q, k, v, *segments, bias, RATE, rng, CUDNN_DROPOUT)


def _kept(out):
    """[B, T, N, S] output rows -> the kept mask [B, N, T, S]."""
    return jnp.transpose(out != 0, (0, 2, 1, 3))


@needs_gpu
def test_cudnn_mask_has_the_rate_and_values_and_gradients_follow_it():
    q, k, v, segments, cotangent = _identity_values(4, 4, 64)
    bias = jax.random.normal(jax.random.PRNGKey(5), (1, 4, 64, 64), jnp.bfloat16)
    rng = jax.random.PRNGKey(1)

    @functools.partial(jax.jit, compiler_options=COMPILER_OPTIONS)
    def step(q, k, bias):  # one program: the forward and backward calls share a counter
        out, pull = jax.vjp(lambda q, k, b: _dropped(q, k, v, segments, rng, b), q, k, bias)
        return out, pull(cotangent)

    out, grads = step(q, k, bias)
    keep = _kept(out)
    assert abs(1.0 - float(keep.mean()) - RATE) < 0.02
    mask = segment_mask(*segments)

    def want_fn(q, k, b):
        return reference(q, k, v, mask, b, keep.astype(jnp.float32), RATE)

    want, pull = jax.vjp(want_fn, q, k, bias)
    names = ("out", "dq", "dk", "dbias")
    for name, a, b in zip(names, (out, *grads), (want, *pull(cotangent)), strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 0.03 * (np.abs(b).max() + 1e-6), name


@needs_gpu
def test_cudnn_masks_are_new_each_step_and_differ_between_layers():
    q, k, v, segments, _ = _identity_values(4, 4, 64)
    first, second = jax.random.split(jax.random.PRNGKey(2))

    @functools.partial(jax.jit, compiler_options=COMPILER_OPTIONS)
    def layers(q):  # two call sites, as an unrolled stack has: the same seed and counter
        same = _dropped(q, k, v, segments, first), _dropped(q, k, v, segments, first)
        return same, _dropped(q, k, v, segments, second)

    (a, a_again), b = layers(q)
    # cuDNN alone would give both call sites one mask; with the same key, so do the rolls
    np.testing.assert_array_equal(_kept(a), _kept(a_again))
    # another layer's key rolls it elsewhere: agreement near 0.9^2 + 0.1^2, not 1
    assert float(jnp.mean(_kept(a) == _kept(b))) < 0.9
    (next_a, _), _ = layers(q)
    assert float(jnp.mean(_kept(a) == _kept(next_a))) < 0.9


@needs_gpu
def test_cudnn_dropout_runs_in_a_loop_of_layers_under_grad():
    """The case XLA aborted on (a cuDNN dropout call recorded into a command buffer inside a
    loop), compiled as the train step is: with COMPILER_OPTIONS."""
    (q, k, v, q_seg, k_seg), _ = inputs(64, 64, False, batch=2, heads=4, dim=64)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))

    def loss(q):
        def layer(x, rng):
            return _attend_block(x, k, v, q_seg, k_seg, None, RATE, rng, CUDNN_DROPOUT), None

        x, _ = jax.lax.scan(layer, q, jax.random.split(jax.random.PRNGKey(0), 3))
        return jnp.sum(x.astype(jnp.float32) ** 2)

    grad = jax.jit(jax.grad(loss), compiler_options=COMPILER_OPTIONS)
    first, second = grad(q), grad(q)
    assert np.isfinite(np.asarray(first, np.float32)).all()
    assert not np.array_equal(np.asarray(first), np.asarray(second))  # new masks each call
