"""The edge: a ConfigDict frozen once into a RunConfig, and variants made by freezing again."""

import dataclasses
import json

import jax.numpy as jnp
import pytest
from tiny_configs import frozen, tiny_config

from configs import base, default
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError


def test_freeze_copies_shared_keys_into_every_part_that_needs_them():
    c = tiny_config()
    c.batch_size, c.seed, c.num_train_steps, c.model.dtype = 16, 7, 99, "bfloat16"
    run = configdict.freeze(c)
    assert (run.batch_size, run.data.batch_size) == (16, 16)
    assert (run.seed, run.data.seed, run.loop.seed) == (7, 7, 7)
    assert (run.optimizer.num_train_steps, run.loop.num_train_steps) == (99, 99)
    assert run.masking.num_masked == round(c.mask_rate * c.seq_len)
    assert run.model.dtype == jnp.bfloat16 and run.model.vocab_size % 128 == 0
    assert dict(run.mesh.ici) == dict(c.mesh.ici)


def test_override_changes_a_key_in_every_copy_and_nothing_else():
    run = configdict.freeze(tiny_config())
    changed = configdict.override(run, {"batch_size": 32, "model.scan_layers": False})
    assert (changed.batch_size, changed.data.batch_size) == (32, 32)
    assert changed.model.scan_layers is False
    assert dataclasses.replace(changed.model, scan_layers=True) == run.model
    assert changed.optimizer == run.optimizer and changed.mesh == run.mesh
    # Nothing changed: the same run back, through its JSON.
    assert configdict.override(run, {}) == run


def test_override_validates_and_names_the_key():
    run = configdict.freeze(tiny_config())
    with pytest.raises(ConfigError, match=r"mask_rate=1\.5 is not allowed"):
        configdict.override(run, {"mask_rate": 1.5})
    with pytest.raises(ConfigError, match=r"has no key 'model\.num_layer'"):
        configdict.override(run, {"model.num_layer": 2})


def test_a_checkpoints_config_gets_what_older_runs_did_for_keys_added_since():
    stored = json.loads(default.get_config().to_json_best_effort())
    del stored["model"]["mask_token_source"], stored["eval_batches"]
    run = configdict.from_checkpoint(stored)
    assert run.model.mask_token_source == "learned"  # the model before the key existed
    assert run.loop.eval_batches == base.get_config().eval_batches  # configs/base.py's
    del stored["model"]["num_heads"]
    with pytest.raises(ConfigError, match=r"lacks model keys \['num_heads'\]"):
        configdict.from_checkpoint(stored)


@pytest.mark.parametrize(
    "impl,platform,dtype,want",
    [
        ("auto", "tpu", jnp.bfloat16, ("xla", False)),  # until splash is timed on a TPU
        ("auto", "gpu", jnp.bfloat16, ("cudnn", False)),
        ("auto", "gpu", jnp.float32, ("xla", False)),  # cuDNN's attention is 16-bit only
        ("auto", "rocm", jnp.bfloat16, ("xla", False)),  # an AMD GPU has no cuDNN
        ("auto", "cpu", jnp.bfloat16, ("xla", False)),
        ("splash", "cpu", jnp.float32, ("splash", True)),  # the Pallas interpreter: tests
        ("xla", "tpu", jnp.float32, ("xla", False)),
        ("cudnn", "cpu", jnp.bfloat16, "cannot run on cpu"),
        ("cudnn", "rocm", jnp.bfloat16, "cannot run on rocm"),
        ("cudnn", "gpu", jnp.float32, "takes a 16-bit model"),
        ("splash", "gpu", jnp.bfloat16, "cannot run on gpu"),
    ],
)
def test_attention_impl_is_made_concrete_for_the_devices(impl, platform, dtype, want):
    model = dataclasses.replace(
        frozen(tiny_config("mlm", "self", 16))[0], attention_impl=impl, dtype=dtype
    )
    if isinstance(want, str):
        with pytest.raises(ConfigError, match=want):
            model.for_platform(platform)
        return
    got = model.for_platform(platform)
    assert (got.attention_impl, got.kernel_interpret) == want


def test_a_checkpoint_from_before_the_attention_keys_keeps_float32_scores_on_xla():
    from configs import base

    saved = json.loads(json.dumps(base.get_config().to_dict()))
    del saved["model"]["attention_impl"], saved["model"]["float32_attention_logits"]
    model = configdict.from_checkpoint(saved).model
    assert (model.attention_impl, model.float32_attention_logits) == ("xla", True)


@pytest.mark.parametrize(
    "setting,hidden,shards,want",
    [
        ("auto", 1024, 32, "always"),  # the large configs on v5p-64: 32 of 1024 per chip
        ("auto", 768, 32, "always"),  # base on v5p-64: 24
        ("auto", 768, 4, "never"),  # base on v5p-8: 192
        ("auto", 256, 2, "never"),  # exactly the 128 lanes
        ("auto", 64, 1, "never"),  # not sharded: nothing to gather
        ("always", 768, 4, "always"),
        ("never", 1024, 32, "never"),
    ],
)
def test_auto_gathers_the_table_where_a_chips_slice_is_narrower_than_the_lanes(
    setting, hidden, shards, want
):
    model = dataclasses.replace(
        frozen(tiny_config())[0], gather_embedding_table=setting, hidden_size=hidden
    )
    assert model.for_embedding_shards(shards).gather_embedding_table == want


def test_the_programs_resolve_auto_for_their_mesh():
    """Hidden 64 split 8 ways (fsdp) is narrow; kept whole on each device (data) it is not."""
    import jax

    from maelm_jax.step import programs, sharding

    c = tiny_config(hidden_size=64)
    assert c.model.gather_embedding_table == "auto"  # configs/base.py's
    got = {}
    for name, ici in {"fsdp": (1, 8, 1), "data": (8, 1, 1)}.items():
        c.mesh.ici.data, c.mesh.ici.fsdp, c.mesh.ici.tensor = ici
        run = configdict.freeze(c)
        mesh = sharding.create_mesh(run.mesh, jax.devices()[:8])
        got[name] = programs.build(run, mesh, run.data.vocab_size).model_cfg
    assert got["fsdp"].gather_embedding_table == "always"
    assert got["data"].gather_embedding_table == "never"


def test_a_checkpoint_from_when_the_table_setting_was_a_boolean_keeps_its_lookup():
    saved = json.loads(json.dumps(base.get_config().to_dict()))
    for old, now in [(True, "always"), (False, "never")]:
        saved["model"]["gather_embedding_table"] = old
        assert configdict.from_checkpoint(saved).model.gather_embedding_table == now
    saved["model"]["gather_embedding_table"] = "sometimes"
    with pytest.raises(ConfigError, match="gather_embedding_table='sometimes' is not allowed"):
        configdict.from_checkpoint(saved)
