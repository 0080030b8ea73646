"""The eval loss's unigram baseline, on a batch small enough to count by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from tiny_configs import frozen, tiny_config

from maelm_jax.data import unigram
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from maelm_jax.step import train_step

A, B, C, D = 10, 11, 12, 13


def test_baseline_is_the_entropy_of_every_scorable_eval_token():
    # Padding and the specials never count; every regular token does, also the ones this
    # row's k = 4 slots do not score (the last row has 6).
    _, masking_cfg = frozen(tiny_config(seq_len=8))
    ids = jnp.array(
        [
            [BOS_ID, A, A, B, C, EOS_ID, PAD_ID, PAD_ID],
            [BOS_ID, D, EOS_ID, BOS_ID, A, EOS_ID, PAD_ID, PAD_ID],
            [BOS_ID, A, B, B, B, C, D, EOS_ID],
        ],
        jnp.int32,
    )
    counts = np.asarray(unigram.token_counts(ids, masking_cfg=masking_cfg))
    assert counts.sum() == 12
    np.testing.assert_array_equal(counts[[A, B, C, D]], [4, 4, 2, 2])
    p = np.array([4, 4, 2, 2]) / 12
    assert math.isclose(unigram.entropy(counts), -(p * np.log(p)).sum(), rel_tol=1e-12)


def test_the_eval_data_distribution_scores_its_entropy_on_the_masked_slots():
    """Why every token counts: the eval masks pick targets uniformly among them, so the eval
    data's own unigram distribution has an expected loss on the scored slots equal to the
    baseline; averaged over 200 mask draws it lands within sampling error."""
    c = tiny_config(seq_len=32)
    c.mask_rate = 0.25
    _, masking_cfg = frozen(c)
    rng = np.random.default_rng(0)
    ids = np.full((8, 32), PAD_ID, np.int32)
    ids[:, 0], ids[:, 30] = BOS_ID, EOS_ID
    ids[:, 1:30] = rng.choice([A, B, C, D, A + 20], p=[0.5, 0.2, 0.15, 0.1, 0.05], size=(8, 29))
    ids = jnp.asarray(ids)
    counts = np.asarray(unigram.token_counts(ids, masking_cfg=masking_cfg))
    log_p = np.log(np.maximum(counts, 1e-30) / counts.sum())
    masks = jax.jit(
        lambda seed: train_step.eval_masks(ids, 0, masking_cfg=masking_cfg, seed=seed),
    )
    losses = []
    for seed in range(200):
        m = masks(seed)
        weights = np.asarray(m.mask_weights)
        losses.append(-(log_p[np.asarray(m.labels)] * weights).sum() / weights.sum())
    # One draw scores 64 of the 232 tokens; the mean of 200 draws has a tiny standard error.
    assert abs(np.mean(losses) - unigram.entropy(counts)) < 3 * np.std(losses) / np.sqrt(200)
    assert np.std(losses) > 0.01  # the draws do differ


def test_entropy_of_a_uniform_and_an_empty_distribution():
    assert math.isclose(unigram.entropy(np.array([0, 2, 2, 2, 2])), math.log(4))
    assert unigram.entropy(np.zeros(5)) == 0.0
