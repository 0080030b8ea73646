"""Splash attention against the XLA path: same values and gradients on packed documents,
padding and a query segment with no key; under a CPU mesh through shard_map; and compiled
ahead of time for TPU, where the kernel is a Mosaic custom call.

On CPU the kernel runs in the Pallas interpreter, so shapes stay tiny (a few 128-blocks).
"""

import importlib.util

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_inputs import inputs

from maelm_jax.model.attention import AttentionOptions, _attend_block
from maelm_jax.model.kernels.splash import splash_attend

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu is not installed (pip install "jax[tpu]==0.10.2"); TPU compiles need it',
)
RULES = (
    ("activation_batch", "data"),
    ("activation_length", None),
    ("activation_heads", "model"),
    ("activation_kv", None),
)


def values_and_grads(fn, args, cotangent):
    out, pull = jax.vjp(lambda q, k, v: fn(q, k, v, *args[3:]), *args[:3])
    return out, pull(cotangent)


@pytest.mark.parametrize(
    "t, s, cross",
    [
        (12, 12, False),  # self-attention, one block, 116 padded positions
        (12, 20, True),  # 3ML-cross-like: T != S, a query document with no key
        (200, 300, True),  # several blocks each way; the last key block mostly padding
    ],
)
def test_splash_equals_the_xla_path_in_values_and_gradients(t, s, cross):
    args, cotangent = inputs(t, s, cross)
    reference = lambda q, k, v, qs, ks: _attend_block(
        q, k, v, qs, ks, None, 0.0, None, AttentionOptions()
    )
    fused = lambda q, k, v, qs, ks: splash_attend(q, k, v, qs, ks, interpret=True, block=128)
    want, want_grads = values_and_grads(reference, args, cotangent)
    got, got_grads = jax.jit(lambda *a: values_and_grads(fused, a, cotangent))(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for name, g, w in zip("qkv", got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"d{name}")
    # The case has what it claims: padding queries, and (cross) rows with no key, which
    # are exactly zero rather than the kernel's uniform average.
    q_seg, k_seg = np.asarray(args[3]), np.asarray(args[4])
    assert (q_seg == 0).any(axis=1).all()
    no_key = ~(q_seg[:, :, None] == k_seg[:, None, :]).any(-1)
    assert no_key.any() == cross
    assert np.all(np.asarray(got)[no_key] == 0) and np.all(np.asarray(got)[~no_key] != 0)


def test_block_must_be_a_multiple_of_128():
    args, _ = inputs(12, 12, False)
    with pytest.raises(ValueError, match="multiple of 128"):
        splash_attend(*args, block=96)


def cpu_mesh():
    devices = np.asarray(jax.devices("cpu")[:8]).reshape(4, 2)
    return jax.sharding.Mesh(devices, ("data", "model"))


def test_under_a_mesh_splash_is_shard_mapped_over_batch_and_heads():
    args, _ = inputs(12, 20, True, batch=4)
    want = splash_attend(*args, interpret=True, block=128)
    mesh = cpu_mesh()
    fn = jax.jit(lambda *a: splash_attend(*a, interpret=True, block=128))
    with jax.sharding.set_mesh(mesh), nn.logical_axis_rules(RULES):
        lowered = fn.lower(*args)
        got = fn(*args)
    assert "sdy.manual_computation" in lowered.as_text()  # the kernel runs per shard
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    expected = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None, "model"))
    assert got.sharding.is_equivalent_to(expected, got.ndim)


def test_a_sharded_sequence_is_a_clear_error():
    args, _ = inputs(12, 12, False)
    rules = tuple((a, "model" if a == "activation_length" else m) for a, m in RULES)
    mesh = cpu_mesh()
    with (
        jax.sharding.set_mesh(mesh),
        nn.logical_axis_rules(rules),
        pytest.raises(ValueError, match="unsharded sequence"),
    ):
        jax.eval_shape(lambda *a: splash_attend(*a, interpret=True), *args)


@needs_libtpu
def test_compiles_for_tpu_as_a_mosaic_kernel_with_its_gradient():
    """MAE-LM base's encoder attention (435 visible of 512 tokens, 12 heads of 64) on a
    v5p-8: forward and backward compile to Mosaic calls, sharded over batch and heads."""
    from maelm_jax.aot import topology
    from maelm_jax.hardware import tpu_chips

    devices = topology.topology_devices(tpu_chips.parse("v5p-8"))
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(2, 2), ("data", "model"))
    b, t, n, h = 8, 435, 12, 64
    spec = lambda *axes: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))
    heads = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16, sharding=spec("data", None, "model"))
    segments = jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=spec("data"))

    def loss(q, k, v, qs, ks):
        return jnp.sum(splash_attend(q, k, v, qs, ks).astype(jnp.float32) ** 2)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    with jax.sharding.set_mesh(mesh), nn.logical_axis_rules(RULES):
        compiled = step.lower(heads, heads, heads, segments, segments).compile()
    hlo = compiled.as_text()
    # The forward, dq and dkv kernels as Mosaic calls ...
    for kernel in ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"):
        assert kernel in hlo, kernel
    assert hlo.count("tpu_custom_call") >= 3
    # ... each on one device's shard (4 examples, 6 heads, 435 padded to 512), with no
    # all-gather of the inputs and no [B, T, S] array outside a fusion.
    assert "bf16[4,6,512,64]" in hlo and "all-gather" not in hlo
    entry = hlo[hlo.index("\nENTRY") :]
    assert ",435,435]" not in entry
    memory = compiled.memory_analysis()
    assert memory is not None and memory.argument_size_in_bytes > 0
