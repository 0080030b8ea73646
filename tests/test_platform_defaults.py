"""The GPU defaults of issue #37 on the CPU: what "auto" resolves to per platform, a partly
unrolled scan (same parameters, same values), the RngBitGenerator dropout keys (pure in
(seed, step)), which attentions cuDNN serves, and the modern backbone's step in memory."""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_step import two_updates
from tiny_configs import frozen, tiny_config

from maelm_jax.config import configdict
from maelm_jax.config.run_config import GPU_UNROLL, dropout_rng_impl_for
from maelm_jax.model.attention import AttentionOptions
from maelm_jax.model.positions.rotary import Window
from maelm_jax.step import programs, sharding, train_step


@pytest.mark.parametrize(
    "unroll,platform,want", [(0, "gpu", GPU_UNROLL), (0, "tpu", 1), (0, "cpu", 1), (3, "gpu", 3)]
)
def test_scan_unroll_is_made_concrete_for_the_devices(unroll, platform, want):
    model = dataclasses.replace(frozen(tiny_config())[0], scan_unroll=unroll)
    got = model.for_platform(platform)
    assert got.scan_unroll == want
    assert got.layers_per_iteration(12) == min(want, 12)


@pytest.mark.parametrize(
    "impl,platform,want",
    [
        ("auto", "gpu", "unsafe_rbg"),
        ("auto", "tpu", "threefry"),
        ("auto", "cpu", "threefry"),
        ("rbg", "cpu", "rbg"),
        ("threefry", "gpu", "threefry"),
    ],
)
def test_dropout_rng_impl_is_made_concrete_for_the_devices(impl, platform, want):
    assert dropout_rng_impl_for(impl, platform) == want


@pytest.mark.parametrize(
    "grad,platform,want",
    [
        ("auto", "gpu", "float32"),
        ("auto", "cpu", "float32"),
        ("auto", "tpu", "compute_dtype"),  # XLA's TPU estimate prefers it (configs/base.py)
        ("float32", "tpu", "float32"),
    ],
)
def test_embedding_grad_is_made_concrete_for_the_devices(grad, platform, want):
    model = dataclasses.replace(frozen(tiny_config())[0], embedding_grad=grad)
    assert model.for_platform(platform).embedding_grad == want


@pytest.mark.parametrize(
    "grad,platform,want",
    [
        ("auto", "gpu", "summed"),  # one contraction, not one per layer (configs/base.py)
        ("auto", "tpu", "per_layer"),  # XLA's TPU estimate prefers it
        ("auto", "cpu", "per_layer"),
        ("per_layer", "gpu", "per_layer"),
    ],
)
def test_relative_bias_grad_is_made_concrete_for_the_devices(grad, platform, want):
    model = dataclasses.replace(frozen(tiny_config())[0], relative_bias_grad=grad)
    assert model.for_platform(platform).relative_bias_grad == want
    c = tiny_config(relative_bias_grad="sum")
    with pytest.raises(configdict.ConfigError, match=r"relative_bias_grad.*'summed'"):
        configdict.freeze(c)


@pytest.mark.parametrize(
    "attention,dropout,platform,want",
    [
        ("auto", "auto", "gpu", "cudnn"),
        ("auto", "xla", "gpu", "xla"),
        ("xla", "auto", "gpu", "xla"),  # no kernel, so no kernel's dropout
        ("auto", "auto", "tpu", "xla"),
        ("auto", "auto", "cpu", "xla"),
    ],
)
def test_attention_dropout_impl_is_made_concrete_for_the_devices(
    attention, dropout, platform, want
):
    model = dataclasses.replace(
        frozen(tiny_config())[0],
        attention_impl=attention,
        attention_dropout_impl=dropout,
        dtype=jnp.bfloat16,  # cuDNN's attention takes 16-bit inputs only
    )
    got = model.for_platform(platform)
    assert got.attention_dropout_impl == want
    options = AttentionOptions(got.attention_impl, dropout_impl=got.attention_dropout_impl)
    assert options.fused(None, jax.random.PRNGKey(0)) == (want == "cudnn")


def test_cudnn_dropout_without_cudnn_attention_is_one_error():
    model = dataclasses.replace(
        frozen(tiny_config())[0], attention_impl="xla", attention_dropout_impl="cudnn"
    )
    with pytest.raises(configdict.ConfigError, match=r"attention_dropout_impl='cudnn'.*'xla'"):
        model.for_platform("gpu")
    c = tiny_config(attention_dropout_impl="philox")
    with pytest.raises(configdict.ConfigError, match=r"attention_dropout_impl.*'cudnn'"):
        configdict.freeze(c)


def test_a_bad_dropout_rng_impl_is_one_error_naming_the_choices():
    c = tiny_config()
    c.dropout_rng_impl = "philox"
    with pytest.raises(configdict.ConfigError, match=r"dropout_rng_impl.*'unsafe_rbg'"):
        configdict.freeze(c)


def test_a_partly_unrolled_scan_keeps_the_parameters_and_the_values():
    """Checkpoints move between `scan_unroll` settings: the same stacked tree, the same
    update. On one device: the layers' loop is the subject, not its sharding (test_sharding's
    steps run the scan on every mesh), and unsharded steps compile faster (this test: 30 ->
    23 s on a loaded 2-core machine)."""
    runs = {}
    for unroll in (1, 3):
        c = tiny_config("mae_lm", "self", num_layers=3, scan_unroll=unroll)
        runs[unroll] = two_updates(c, jax.devices()[:1])
    (m1, _, p1), (m3, _, p3) = runs[1], runs[3]
    assert jax.tree_util.tree_structure(p1) == jax.tree_util.tree_structure(p3)
    np.testing.assert_allclose(m1["loss"], m3["loss"], rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p3), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_dropout_keys_depend_on_seed_and_step_alone(impl):
    def bits(seed, step):
        mask_rng, dropout_rng = train_step.step_rngs(seed, np.int32(step), impl)
        assert jax.random.key_impl(dropout_rng) == jax.random.key_impl(jax.random.key(0, impl=impl))
        keep = jax.random.bernoulli(dropout_rng, 0.9, (4096,))
        return np.asarray(jax.random.key_data(mask_rng)), np.asarray(keep)

    mask_a, keep_a = bits(0, 5)
    _, keep_b = bits(0, 5)
    np.testing.assert_array_equal(keep_a, keep_b)
    assert 0.85 < keep_a.mean() < 0.95
    assert not np.array_equal(keep_a, bits(0, 6)[1])  # each step its own masks
    assert not np.array_equal(keep_a, bits(1, 5)[1])  # each seed its own
    # The masking keys are threefry's whatever the dropout generator: the same masked slots.
    np.testing.assert_array_equal(mask_a, bits(0, 5)[0])
    threefry_mask, _ = train_step.step_rngs(0, np.int32(5))
    np.testing.assert_array_equal(mask_a, jax.random.key_data(threefry_mask))


def test_an_rbg_run_repeats_itself_and_differs_from_threefry():
    results = {}
    for impl in ("unsafe_rbg", "unsafe_rbg", "threefry"):
        c = tiny_config("mlm")
        c.dropout_rng_impl = impl
        results.setdefault(impl, []).append(two_updates(c)[0]["loss"])
    assert results["unsafe_rbg"][0] == results["unsafe_rbg"][1]
    assert results["unsafe_rbg"][0] != results["threefry"][0]


def test_cudnn_serves_every_attention_without_dropout():
    """cuDNN takes the bias, segment and window masks; attention dropout stays on XLA
    (model/kernels/cudnn.py says why)."""
    cudnn, splash = AttentionOptions("cudnn"), AttentionOptions("splash")
    rng, bias = jax.random.PRNGKey(0), np.zeros((1, 2, 4, 4))
    assert cudnn.fused(None, None) and cudnn.fused(bias, None)
    assert not cudnn.fused(None, rng)
    assert splash.fused(None, None) and not splash.fused(bias, None)
    window = Window(np.arange(4)[None], np.arange(4)[None], False, half=64, block=128)
    assert cudnn.dense_local(1024, window)  # 4 spans of 256: one masked kernel call
    assert not cudnn.dense_local(8192, window)  # long context: blocks
    assert not cudnn.dense_local(1024, window, rng) and not AttentionOptions().dense_local(
        1024, window
    )


def test_modern_base_at_32_by_1024_fits_in_40_gib_on_one_device():
    """XLA's CPU compiler laid modern_mlm_base's step at 32 x 1024 out in 150.7 GiB before
    (an H200 ran out of memory asking for 104.6); the memory settings of configs/modern.py
    bring it to ~25 GiB."""
    c = importlib.import_module("configs.modern_mlm_base").get_config()
    c.batch_size, c.seq_len = 32, 1024
    run = configdict.freeze(c)
    mesh = sharding.create_mesh(run.mesh, jax.devices()[:1])
    progs = programs.build(run, mesh, run.data.vocab_size)
    with sharding.activate(mesh, progs.rules):
        lowered = progs.train_step.lower(progs.abstract_state(), progs.abstract_batch(32, 1024))
    m = lowered.compile().memory_analysis()
    total = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )
    assert m.argument_size_in_bytes > 1.5 * 2**30  # the real model: 150M params + Adam
    assert total <= 40 * 2**30, total / 2**30
