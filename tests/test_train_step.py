"""The update itself: gradient accumulation, the learning-rate schedule, weight-decay scope."""

import jax
import numpy as np
from test_sharding import batch_rows
from tiny_configs import tiny_config

from maelm_jax.config import configdict
from maelm_jax.step import optimizer, programs, sharding


def two_updates(config, devices=None):
    """(metrics of the second step, params before, params after): step 0 has learning
    rate 0 (warmup starts there), step 1 moves the weights; on `devices` (default: all)."""
    run = configdict.freeze(config)
    mesh = sharding.create_mesh(run.mesh, devices=devices)
    progs = programs.build(run, mesh, 300)
    state = progs.initialize(jax.random.PRNGKey(0))
    before = jax.device_get(state.params)
    with sharding.activate(mesh, progs.rules):
        for seed in (0, 1):
            batch = progs.global_batch(batch_rows(seed))
            state, metrics = progs.train_step(state, batch)
    return jax.device_get(metrics), before, jax.device_get(state.params)


def test_accumulating_micro_batches_gives_the_same_update():
    """Masks are drawn for the whole batch before it is split, and the loss is normalised
    by the targets of the whole batch, so 4 micro-batches of 2 rows equal one of 8."""
    config = tiny_config("mae_lm", "cross", dropout_rate=0.0, attention_dropout_rate=0.0)
    config.mesh.ici = dict(data=2, fsdp=1, tensor=4)  # micro-batches of 2 rows still split
    config.learning_rate, config.warmup_steps = 1e-2, 1
    whole_metrics, before, whole = two_updates(config)
    config.grad_accum_steps = 4
    split_metrics, _, split = two_updates(config)
    for key in ("loss", "loss_sum", "weight_sum", "correct_sum", "grad_norm"):
        np.testing.assert_allclose(split_metrics[key], whole_metrics[key], rtol=1e-5, err_msg=key)
    gap = jax.tree_util.tree_map(lambda a, b: np.abs(a - b).max(), whole, split)
    moved = jax.tree_util.tree_map(lambda a, b: np.abs(a - b).max(), whole, before)
    assert max(jax.tree_util.tree_leaves(gap)) < 1e-6
    # The comparison is not vacuous: nearly every tensor moved (attention key biases get no
    # gradient at all: softmax ignores a shift shared by all keys).
    changes = jax.tree_util.tree_leaves(moved)
    assert sum(c > 1e-4 for c in changes) >= 0.9 * len(changes)


def test_learning_rate_warms_up_then_decays_to_zero():
    config = tiny_config()
    config.learning_rate, config.warmup_steps, config.num_train_steps = 1e-3, 10, 110
    schedule = optimizer.learning_rate_schedule(configdict.freeze(config).optimizer)
    lr = [float(schedule(s)) for s in (0, 5, 10, 60, 110)]
    np.testing.assert_allclose(lr, [0.0, 5e-4, 1e-3, 5e-4, 0.0], atol=1e-9)


def test_weight_decay_skips_biases_and_layer_norms():
    config = tiny_config()
    run = configdict.freeze(config)
    progs = programs.build(run, sharding.create_mesh(run.mesh), 300)
    mask = optimizer.decay_mask(progs.abstract_state().params)
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}
    decayed = {k for k, v in flat.items() if v}
    assert "['token_embed']['embedding']" in decayed
    assert "['encoder']['layers']['mlp']['wi']['kernel']" in decayed
    assert "['encoder']['layers']['attention']['query_kernel']" in decayed
    for name, value in flat.items():
        if name.endswith(("bias']", "['scale']")):
            assert not value, name
    assert not flat["['lm_head']['output_bias']"]
