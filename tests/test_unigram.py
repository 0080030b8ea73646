"""The eval loss's unigram baseline, on a batch small enough to count by hand."""

import math

import jax.numpy as jnp
import numpy as np
from tiny_configs import frozen, tiny_config

from maelm_jax import unigram
from maelm_jax.tokenizer import BOS_ID, EOS_ID, PAD_ID

A, B, C, D = 10, 11, 12, 13


def test_baseline_is_the_entropy_of_the_weighted_eval_targets():
    # seq_len 8, mask_rate 0.5: k = 4 slots per row. Rows with exactly 4 regular tokens have
    # them all as targets, whatever the random draw; the last row has one regular token, so
    # its other 3 slots are forced onto padding/specials, which weigh 0 and must not count.
    c = tiny_config(seq_len=8)
    c.mask_rate = 0.5
    _, masking_cfg = frozen(c)
    ids = jnp.array(
        [
            [BOS_ID, A, A, B, C, EOS_ID, PAD_ID, PAD_ID],
            [BOS_ID, D, D, D, D, EOS_ID, PAD_ID, PAD_ID],
            [BOS_ID, A, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
        ],
        jnp.int32,
    )
    counts = np.asarray(unigram.target_counts(ids, 0, masking_cfg=masking_cfg, seed=0))
    assert counts.sum() == 9
    np.testing.assert_array_equal(counts[[A, B, C, D]], [3, 1, 1, 4])
    # p = (3, 1, 1, 4) / 9
    expected = -(3 / 9 * math.log(3 / 9) + 2 * (1 / 9) * math.log(1 / 9) + 4 / 9 * math.log(4 / 9))
    assert math.isclose(unigram.entropy(counts), expected, rel_tol=1e-12)


def test_entropy_of_a_uniform_and_an_empty_distribution():
    assert math.isclose(unigram.entropy(np.array([0, 2, 2, 2, 2])), math.log(4))
    assert unigram.entropy(np.zeros(5)) == 0.0
