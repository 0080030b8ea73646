"""Exact-k masking: counts, ordering, forced slots, determinism, uniformity, 80/10/10."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tiny_configs import frozen, tiny_config

from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, FIRST_REGULAR_ID, MASK_ID, PAD_ID
from maelm_jax.model import masking

SEQ = 32


def make_rows(rng, batch, lengths):
    """<s> tokens </s> then padding; `lengths` = number of regular tokens per row."""
    ids = np.full((batch, SEQ), PAD_ID, np.int32)
    for row, n in enumerate(lengths):
        ids[row, 0] = BOS_ID
        ids[row, 1 : 1 + n] = rng.integers(FIRST_REGULAR_ID, 300, n)
        ids[row, 1 + n] = EOS_ID
    return ids


def masking_cfg(objective="mae_lm", **overrides):
    c = tiny_config(objective, seq_len=SEQ)
    for key, value in overrides.items():
        c[key] = value
    return frozen(c)[1]


@pytest.mark.parametrize("padded", [False, True])
def test_exactly_k_sorted_permutation_and_no_special_when_enough(padded):
    cfg = masking_cfg()
    rng = np.random.default_rng(0)
    lengths = rng.integers(cfg.num_masked, SEQ - 1, 64) if padded else [SEQ - 2] * 64
    ids = make_rows(rng, 64, lengths)
    out = masking.mask_batch(jax.random.PRNGKey(0), jnp.asarray(ids), cfg)
    masked, visible = np.asarray(out.masked_idx), np.asarray(out.visible_idx)
    assert masked.shape == (64, cfg.num_masked) and visible.shape == (64, SEQ - cfg.num_masked)
    assert (np.diff(masked, axis=1) > 0).all() and (np.diff(visible, axis=1) > 0).all()
    both = np.sort(np.concatenate([masked, visible], axis=1), axis=1)
    np.testing.assert_array_equal(both, np.broadcast_to(np.arange(SEQ), both.shape))
    hidden_tokens = np.take_along_axis(ids, masked, axis=1)
    assert not np.isin(hidden_tokens, [PAD_ID, BOS_ID, EOS_ID]).any()
    np.testing.assert_array_equal(np.asarray(out.mask_weights), 1.0)
    np.testing.assert_array_equal(np.asarray(out.labels), hidden_tokens)


def test_short_rows_get_zero_weight_exactly_on_forced_slots():
    cfg = masking_cfg()
    rng = np.random.default_rng(1)
    lengths = [0, 1, 3, cfg.num_masked - 1, cfg.num_masked, 20]
    ids = make_rows(rng, len(lengths), lengths)
    out = masking.mask_batch(jax.random.PRNGKey(3), jnp.asarray(ids), cfg)
    hidden_tokens = np.take_along_axis(ids, np.asarray(out.masked_idx), axis=1)
    regular = hidden_tokens >= FIRST_REGULAR_ID
    np.testing.assert_array_equal(np.asarray(out.mask_weights), regular.astype(np.float32))
    for row, n in enumerate(lengths):
        assert regular[row].sum() == min(n, cfg.num_masked)
        # Forced slots go to padding before they hide <s> or </s> from the encoder.
        n_pad = SEQ - n - 2
        expected_specials = max(0, cfg.num_masked - n - n_pad)
        assert np.isin(hidden_tokens[row], [BOS_ID, EOS_ID]).sum() == expected_specials


def test_deterministic_per_rng_and_varies_with_it():
    cfg = masking_cfg()
    ids = jnp.asarray(make_rows(np.random.default_rng(2), 8, [SEQ - 2] * 8))
    a = masking.mask_batch(jax.random.PRNGKey(7), ids, cfg)
    b = masking.mask_batch(jax.random.PRNGKey(7), ids, cfg)
    c = masking.mask_batch(jax.random.PRNGKey(8), ids, cfg)
    np.testing.assert_array_equal(a.masked_idx, b.masked_idx)
    assert not np.array_equal(a.masked_idx, c.masked_idx)
    # Rows differ from each other: every example draws from its own key.
    assert len({tuple(r) for r in np.asarray(a.masked_idx)}) == 8


def test_uniform_over_maskable_positions():
    """Chi-square over positions 1..L-2; a sampler favouring early or late slots fails."""
    cfg = masking_cfg()
    rows = 4000
    ids = jnp.asarray(make_rows(np.random.default_rng(4), rows, [SEQ - 2] * rows))
    out = jax.jit(masking.mask_batch, static_argnums=2)(jax.random.PRNGKey(11), ids, cfg)
    counts = np.bincount(np.asarray(out.masked_idx).ravel(), minlength=SEQ)[1 : SEQ - 1]
    expected = rows * cfg.num_masked / (SEQ - 2)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 29 degrees of freedom: the 99.9% quantile is 58.3. A 5% tilt across positions gives ~160.
    assert chi2 < 58.3, (chi2, counts)
    # Per-row statistic: the mean masked position sits at the centre.
    assert abs(np.asarray(out.masked_idx).mean() - (SEQ - 1) / 2) < 0.1


def test_same_masks_whatever_the_batch_sharding():
    cfg = masking_cfg("mlm")
    ids = jnp.asarray(make_rows(np.random.default_rng(5), 16, [SEQ - 2] * 16))
    key = jax.random.PRNGKey(0)
    single = masking.mask_batch(key, ids, cfg)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(8), ("data",))
    row_sharded = NamedSharding(mesh, PartitionSpec("data"))
    fn = jax.jit(masking.mask_batch, static_argnums=2, out_shardings=row_sharded)
    sharded = fn(key, jax.device_put(ids, row_sharded), cfg)
    assert len(sharded.masked_idx.sharding.device_set) == 8
    for a, b in zip(single, sharded, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_mlm_corruption_frequencies_and_scope():
    cfg = masking_cfg("mlm")
    rows = 3000
    ids_np = make_rows(np.random.default_rng(6), rows, [SEQ - 2] * rows)
    out = jax.jit(masking.mask_batch, static_argnums=2)(
        jax.random.PRNGKey(5), jnp.asarray(ids_np), cfg
    )
    model_ids, masked = np.asarray(out.input_ids), np.asarray(out.masked_idx)
    at_masked = np.take_along_axis(model_ids, masked, axis=1)
    labels = np.asarray(out.labels)
    n = at_masked.size
    is_mask = at_masked == MASK_ID
    unchanged = at_masked == labels
    replaced = ~is_mask & ~unchanged
    # Random draws that happen to hit the original token count as "unchanged" (p = 1/295).
    assert abs(is_mask.sum() / n - 0.8) < 0.01
    assert abs(replaced.sum() / n - 0.1 * (1 - 1 / 295)) < 0.01
    assert abs(unchanged.sum() / n - (0.1 + 0.1 / 295)) < 0.01
    assert (at_masked[replaced] >= FIRST_REGULAR_ID).all() and (at_masked[replaced] < 300).all()
    # Nothing outside the masked slots changes.
    outside = np.ones_like(ids_np, bool)
    np.put_along_axis(outside, masked, False, axis=1)
    np.testing.assert_array_equal(model_ids[outside], ids_np[outside])


def test_mlm_never_corrupts_forced_slots_and_mae_lm_never_corrupts():
    rng = np.random.default_rng(8)
    ids_np = make_rows(rng, 16, [2] * 16)  # far fewer regular tokens than k
    for objective in ("mlm", "mae_lm"):
        cfg = masking_cfg(objective)
        out = masking.mask_batch(jax.random.PRNGKey(1), jnp.asarray(ids_np), cfg)
        model_ids = np.asarray(out.input_ids)
        np.testing.assert_array_equal(model_ids == PAD_ID, ids_np == PAD_ID)
        if objective == "mae_lm":
            np.testing.assert_array_equal(model_ids, ids_np)


@pytest.mark.parametrize("packing", ["segmented", "concatenated"])
def test_segment_ids_follow_the_documents_and_padding_is_never_a_target(packing):
    cfg = masking_cfg(packing=packing)
    ids = np.full((3, SEQ), PAD_ID, np.int32)
    ids[0, :12] = [BOS_ID, 7, 8, EOS_ID, 9, 9, 9, EOS_ID, 6, 6, 6, 6]  # 3rd doc cut at row end
    ids[1, :4] = [BOS_ID, 5, 5, EOS_ID]  # mostly padding: k exceeds its regular tokens
    ids[2, :] = FIRST_REGULAR_ID + 3
    batch = jax.jit(masking.mask_batch, static_argnums=2)(jax.random.PRNGKey(0), ids, cfg)
    seg = np.asarray(batch.segment_ids)
    if packing == "segmented":
        assert seg[0, :12].tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    else:
        assert seg[0, :12].tolist() == [1] * 12
    assert seg[1, :4].tolist() == [1] * 4 and seg[2].tolist() == [1] * SEQ
    assert (seg[ids == PAD_ID] == 0).all()
    masked = np.asarray(batch.masked_idx)
    weights = np.asarray(batch.mask_weights)
    on_pad = np.take_along_axis(ids, masked, axis=1) == PAD_ID
    assert on_pad[1].sum() == cfg.num_masked - 2  # row 1's k slots reach into its padding
    assert (weights[on_pad] == 0).all() and (weights[~on_pad & (masked > 0)] >= 0).all()
    assert weights[1].sum() == 2 and weights[2].sum() == cfg.num_masked
