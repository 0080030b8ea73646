"""The sharded train step: same numbers on any mesh, parameters really sharded, bad layouts."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from tiny_configs import tiny_config

from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, FIRST_REGULAR_ID, PAD_ID
from maelm_jax.model import logical_axes
from maelm_jax.model.encoder import TokenEmbedding
from maelm_jax.step import programs, sharding

VOCAB = 300
# Every axis split, then fsdp with tensor (and remat). A (2, 4, 1) and a data-only (8, 1, 1)
# mesh were here too: their splits occur in these (data with fsdp in (2, 2, 2), fsdp 4 in
# (1, 4, 2)), so they had no case of their own, for a fifth and a quarter of each test's
# compiles.
MESHES = [(2, 2, 2), (1, 4, 2)]


def config_for(objective, decoder, mesh_shape=(8, 1, 1)):
    c = tiny_config(objective, decoder)
    c.model.relative_attention_buckets = 8 if objective == "mae_lm" else 0
    c.mesh.ici = dict(zip(sharding.MESH_AXES, mesh_shape, strict=True))
    c.mesh.dcn = dict(data=1, fsdp=1, tensor=1)
    return c


def batch_rows(seed=0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(FIRST_REGULAR_ID, VOCAB, (8, 32)).astype(np.int32)
    rows[:, 0] = BOS_ID
    rows[2, 20] = EOS_ID
    rows[2, 21:] = PAD_ID
    return rows


def one_step(config, devices):
    """(loss, updated params as numpy) after one train step on `devices`."""
    mesh = sharding.create_mesh(configdict.freeze(config).mesh, devices=devices)
    progs = programs.build(configdict.freeze(config), mesh, VOCAB)
    state = progs.initialize(jax.random.PRNGKey(0))
    with sharding.activate(mesh, progs.rules):
        state, metrics = progs.train_step(state, progs.global_batch(batch_rows()))
    return float(metrics["loss"]), jax.device_get(state.params)


def assert_every_mesh_matches_one_device(objective, decoder):
    """One train step on every mesh of MESHES gives the one-device loss and parameters."""
    loss_1, params_1 = one_step(config_for(objective, decoder, (1, 1, 1)), jax.devices()[:1])
    for shape in MESHES:
        config = config_for(objective, decoder, shape)
        if shape == MESHES[-1]:  # remat must also hold under sharding
            config.model.remat_policy = "dots_saveable"
        loss, params = one_step(config, jax.devices())
        np.testing.assert_allclose(loss, loss_1, rtol=1e-5, err_msg=str(shape))
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(params),
            jax.tree_util.tree_leaves(params_1),
            strict=True,
        ):
            np.testing.assert_allclose(
                a, b, atol=2e-6, rtol=1e-4, err_msg=f"{shape} {jax.tree_util.keystr(path)}"
            )


# The cross decoder's case: test_sharding_cross_decoder.py, so that --dist loadfile runs it on
# the other worker (each case is a minute of sharded compiles).
@pytest.mark.parametrize("objective,decoder", [("mlm", "self"), ("mae_lm", "self")])
def test_every_mesh_matches_one_device(objective, decoder):
    assert_every_mesh_matches_one_device(objective, decoder)


def test_parameters_are_sharded_as_the_rules_say():
    config = config_for("mae_lm", "self", (2, 2, 2))
    mesh = sharding.create_mesh(configdict.freeze(config).mesh)
    progs = programs.build(configdict.freeze(config), mesh, VOCAB)
    state = progs.initialize(jax.random.PRNGKey(0))
    params = state.params
    assert params["token_embed"]["embedding"].sharding.spec == P("tensor", "fsdp")
    attention = params["encoder"]["layers"]["attention"]
    assert attention["query_kernel"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert params["encoder"]["layers"]["mlp"]["wi"]["kernel"].sharding.spec == P(
        None, "fsdp", "tensor"
    )
    # The Adam moments follow their parameters.
    mu = state.opt_state[1][0].mu["token_embed"]["embedding"]
    assert mu.sharding.spec == P("tensor", "fsdp")
    # With fsdp > 1 nothing is held whole on every device; each device holds a fraction.
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        shard = leaf.addressable_shards[0].data
        assert shard.size < leaf.size, jax.tree_util.keystr(path)


def test_batch_rows_split_over_data_and_fsdp():
    config = config_for("mlm", "self", (2, 2, 2))
    mesh = sharding.create_mesh(configdict.freeze(config).mesh)
    progs = programs.build(configdict.freeze(config), mesh, VOCAB)
    batch = progs.global_batch(batch_rows())["input_ids"]
    assert batch.sharding.spec == P(("data", "fsdp"))
    assert {s.data.shape for s in batch.addressable_shards} == {(2, 32)}


def build(config):
    run = configdict.freeze(config)
    return programs.build(run, sharding.create_mesh(run.mesh), VOCAB)


def test_mesh_product_must_match_devices():
    config = config_for("mlm", "self", (2, 2, 1))
    with pytest.raises(ConfigError, match=r"mesh.ici=\(data=2, fsdp=2, tensor=1\) uses 4"):
        sharding.create_mesh(configdict.freeze(config).mesh)


def test_mesh_with_two_fill_axes():
    config = config_for("mlm", "self")
    config.mesh.ici = dict(data=-1, fsdp=-1, tensor=1)
    with pytest.raises(ConfigError, match="at most one -1"):
        sharding.create_mesh(configdict.freeze(config).mesh)


def test_batch_must_split_over_batch_shards():
    config = config_for("mlm", "self", (4, 2, 1))
    config.batch_size = 12
    with pytest.raises(ConfigError, match=r"batch_size=12 .* not divisible by the 8 batch"):
        build(config)


def test_heads_must_split_over_tensor():
    config = config_for("mlm", "self", (1, 1, 8))
    with pytest.raises(ConfigError, match=r"model.num_heads = 4 is not divisible by mesh tensor=8"):
        build(config)


def test_mlp_must_split_over_tensor():
    config = config_for("mlm", "self", (2, 1, 4))
    config.model.mlp_dim = 66
    with pytest.raises(ConfigError, match=r"model.mlp_dim .* = 66 is not divisible by mesh tensor"):
        build(config)


def test_vocab_must_split_over_tensor():
    config = config_for("mlm", "self", (2, 1, 3))
    config.model.hidden_size, config.model.num_heads, config.model.mlp_dim = 48, 6, 96
    mesh = sharding.create_mesh(configdict.freeze(config).mesh, devices=jax.devices()[:6])
    with pytest.raises(
        ConfigError, match=r"padded vocab size = 512 is not divisible by mesh tensor=3"
    ):
        programs.build(configdict.freeze(config), mesh, 500)


def test_logical_axis_without_rule():
    config = config_for("mlm", "self")
    config.logical_axis_rules = tuple(r for r in config.logical_axis_rules if r[0] != "mlp")
    with pytest.raises(ConfigError, match=r"no rule for logical axes \['mlp'\]"):
        build(config)


def test_conflicting_rules():
    config = config_for("mlm", "self")
    config.logical_axis_rules = (*config.logical_axis_rules, ("embed", "tensor"))
    with pytest.raises(ConfigError, match=r"maps 'embed' twice \('fsdp' and 'tensor'\)"):
        build(config)


def test_rule_to_unknown_mesh_axis():
    config = config_for("mlm", "self")
    rules = [r for r in config.logical_axis_rules if r[0] != "mlp"]
    config.logical_axis_rules = (*rules, ("mlp", "model"))
    with pytest.raises(ConfigError, match=r"unknown mesh axis 'model'"):
        build(config)


@pytest.mark.parametrize("gather_table", [False, True])
def test_token_lookup_gathers_the_table_or_every_token_as_configured(gather_table):
    """`TokenEmbedding` on an fsdp mesh, the same values either way: with
    `gather_embedding_table` the table is gathered whole and each device looks up its own
    rows; without, every device gathers every token (its slice of the embedding) and an
    all-to-all moves the vectors back to batch shards."""
    config = config_for("mlm", "self", (1, 8, 1))
    mesh = sharding.create_mesh(configdict.freeze(config).mesh)
    rules = programs.build(configdict.freeze(config), mesh, VOCAB).rules
    vocab, width = 384, 64
    embed = TokenEmbedding(vocab, width, dtype=jnp.bfloat16, gather_table=gather_table)
    rng = np.random.default_rng(0)
    table = jax.device_put(
        rng.normal(size=(vocab, width)).astype(np.float32),
        jax.sharding.NamedSharding(mesh, P("tensor", "fsdp")),
    )
    ids = jax.device_put(
        rng.integers(0, vocab, (16, 24)).astype(np.int32),
        jax.sharding.NamedSharding(mesh, P(("data", "fsdp"))),
    )
    # As in the model, the vectors then go on with their rows (batch-sharded).
    lookup = jax.jit(
        lambda t, i: logical_axes.constrain(
            embed.apply({"params": {"embedding": t}}, i), logical_axes.HIDDEN
        )
    )
    with sharding.activate(mesh, rules):
        hlo = lookup.lower(table, ids).compile().as_text()
        out = lookup(table, ids)
    expected = np.asarray(jnp.asarray(np.asarray(table), jnp.bfloat16))[np.asarray(ids)]
    np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), expected.astype(np.float32))
    table_gathered = re.search(rf"\[{vocab},{width}\][^\n]* all-gather\(", hlo) is not None
    assert table_gathered == gather_table, hlo
    assert ("all-to-all" in hlo) != gather_table, hlo
