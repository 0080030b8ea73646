"""The token embedding's gradient: summed in float32, equal to the plain gradient, and no
bfloat16 scatter-add of the table's size anywhere in the lowered train step."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_configs import tiny_config

from maelm_jax.config import configdict
from maelm_jax.model.encoder import take_rows
from maelm_jax.step import programs, sharding

# `"stablehlo.scatter"(...) ({ region }) : (operand, indices, updates) -> result`
SCATTER = re.compile(r'"stablehlo\.scatter".*?\}\) : \(tensor<([^>]*)>', re.DOTALL)


def bf16_scatters_of_shape(text: str, rows: int, width: int) -> list[str]:
    """The operand types of the scatters in `text` onto a [rows, width] bfloat16 array."""
    return [t for t in SCATTER.findall(text) if t == f"{rows}x{width}xbf16"]


def test_the_pattern_finds_a_plain_bfloat16_lookups_scatter():
    """The HLO check below can fail: the plain lookup's gradient is the bf16 scatter-add."""
    table = jnp.zeros((384, 32), jnp.float32)
    ids = jnp.zeros((8, 16), jnp.int32)
    plain = jax.grad(lambda t: jnp.sum(jnp.take(t.astype(jnp.bfloat16), ids, axis=0)))
    assert bf16_scatters_of_shape(jax.jit(plain).lower(table).as_text(), 384, 32)
    ours = jax.grad(lambda t: jnp.sum(take_rows(t, ids, jnp.dtype(jnp.bfloat16))))
    assert not bf16_scatters_of_shape(jax.jit(ours).lower(table).as_text(), 384, 32)


@pytest.mark.parametrize("gathered", [None, ("activation_vocab", "activation_embed")])
def test_take_rows_gradient_is_the_float32_sum_of_the_rows_cotangents(gathered):
    table = jax.random.normal(jax.random.PRNGKey(0), (300, 32))
    ids = jax.random.randint(jax.random.PRNGKey(1), (8, 16), 0, 300).at[0, :6].set(7)
    weights = jax.random.normal(jax.random.PRNGKey(2), (8, 16, 32))
    dtype = jnp.dtype(jnp.bfloat16)

    def loss(t):
        return jnp.sum(take_rows(t, ids, dtype, gathered).astype(jnp.float32) * weights)

    value, grad = jax.value_and_grad(loss)(table)
    # The forward pass is the bfloat16 table's rows; the cotangent reaching them is bf16.
    rows = jnp.take(table.astype(dtype), ids, axis=0).astype(jnp.float32)
    np.testing.assert_allclose(value, jnp.sum(rows * weights), rtol=1e-6)
    cotangent = np.asarray(weights.astype(dtype).astype(jnp.float32), np.float64)
    expected = np.zeros((300, 32))
    np.add.at(expected, np.asarray(ids), cotangent)
    assert grad.dtype == jnp.float32
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-6)
    # Row 7 takes at least six tokens: bfloat16 accumulation would not be this close.
    assert np.abs(expected[7]).max() > 1.0


@pytest.mark.parametrize(
    "objective,embedding_grad", [("mlm", "auto"), ("mae_lm", "auto"), ("mlm", "compute_dtype")]
)
def test_lowered_train_step_has_no_bfloat16_scatter_of_the_table(objective, embedding_grad):
    """mlm_base's step on an H200 spent 31% of its time in this scatter (issue #37); the
    lowered text is what every backend compiles (the CPU widens bf16 scatters later).
    "compute_dtype" (TPU's "auto") keeps it, as the plain lookup has it."""
    config = tiny_config(objective, dtype="bfloat16", embedding_grad=embedding_grad)
    run = configdict.freeze(config)
    mesh = sharding.create_mesh(run.mesh)
    progs = programs.build(run, mesh, 300)
    with sharding.activate(mesh, progs.rules):
        text = progs.train_step.lower(progs.abstract_state(), progs.abstract_batch(8, 32))
        text = text.as_text()
    vocab, width = progs.model_cfg.vocab_size, progs.model_cfg.hidden_size
    assert SCATTER.findall(text), "the step lost its embedding gradient"
    plain = embedding_grad == "compute_dtype"
    assert bool(bf16_scatters_of_shape(text, vocab, width)) == plain
