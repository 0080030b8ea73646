"""Relative position buckets and mixed precision: small properties a wrong formula breaks."""

import jax
import jax.numpy as jnp
import numpy as np
from test_model import build, run

from maelm_jax.attention import relative_position_bucket


def test_buckets_exact_near_zero_log_far_and_direction_aware():
    offsets = jnp.arange(-300, 301)
    buckets = np.asarray(relative_position_bucket(offsets, 64, 128))
    assert buckets.min() == 0 and buckets.max() == 63
    before, after = buckets[offsets < 0], buckets[offsets > 0]
    assert before.max() < 32 <= after.min()  # keys before and after use separate halves
    # Offsets -15..15 each get their own bucket (0 for the token itself); beyond that, buckets
    # grow logarithmically.
    np.testing.assert_array_equal(buckets[300:316], [0, *range(33, 48)])
    np.testing.assert_array_equal(buckets[285:300], range(15, 0, -1))
    assert len(set(buckets[300 + 16 : 300 + 128])) < 112 / 4
    assert (np.diff(buckets[301:]) >= 0).all() and (np.diff(buckets[:300]) <= 0).all()
    assert buckets[300 + 128] == buckets[300 + 300] == 63  # everything past max_distance


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
