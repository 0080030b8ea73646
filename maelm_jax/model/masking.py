"""Exact-k masking with static shapes: every row gets the same number k of masked slots.

A fixed k keeps `masked_idx [B, k]` and `visible_idx [B, L - k]` static, so the MAE-LM
encoder's shrunken sequence is a plain gather and the train step compiles once whatever the
batch holds. Each example draws from its own key (`split(rng, B)[i]`), so its mask depends
only on (rng, its row in the global batch), never on how the batch is later sharded; with
`jax_threefry_partitionable` (on in the train step) those keys are also generated shard-local.

k and padding: k is the same for every row whatever it holds, so a row with padding (the
last block of a split, eval top-up rows) still gets k slots: they go to regular tokens while
there are at least k of them, then to padding, then to `<s>`/`</s>`. Slots on padding or
specials are "forced": weight 0, never a target, and padding is never corrupted, so the
loss's denominator counts real targets only. A full block's real targets are exactly k; a
padded row's are min(k, its regular tokens). Masking ignores document boundaries: slots are
drawn uniformly over the row, so a document gets its share of the k in expectation
(fairseq's per-block masking of complete_doc blocks draws per document instead).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from maelm_jax.config.run_config import MaskingConfig
from maelm_jax.model.positions import segments

# Which slots fill the k first: regular tokens, then padding, then <s>/</s>. A row with
# fewer than k regular tokens takes its extra slots from padding (weight 0) before it hides
# a sentence boundary from the encoder.
_REGULAR, _PADDING, _SPECIAL = 2.0, 1.0, 0.0


class MaskedBatch(NamedTuple):
    """One batch after masking; L = seq_len, k = num_masked."""

    input_ids: jax.Array  # [B, L] what the model reads: corrupted for "mlm", else unchanged
    labels: jax.Array  # [B, k] original ids at masked_idx
    masked_idx: jax.Array  # [B, k] ascending positions
    visible_idx: jax.Array  # [B, L - k] ascending; with masked_idx a permutation of 0..L-1
    mask_weights: jax.Array  # [B, k] float32: 1 for real targets, 0 for forced slots
    # [B, L] int32 document of each position, 0 = padding (model/positions/segments.py)
    segment_ids: jax.Array


def choose_slots(key: jax.Array, ids: jax.Array, cfg: MaskingConfig):
    """One row: k slots uniformly among regular tokens -> (masked_idx, visible_idx, weights).

    ids: [L] int. Top-k of (tier + uniform) picks a uniformly random k-subset of the highest
    non-empty tier first; a stable argsort of the 0/1 "is masked" flags then lists visible
    and masked positions, each ascending.
    """
    seq_len, k = ids.shape[0], cfg.num_masked
    is_pad = ids == cfg.pad_id
    is_special = jnp.isin(ids, jnp.asarray(cfg.special_ids)) & ~is_pad
    tier = jnp.where(is_pad, _PADDING, jnp.where(is_special, _SPECIAL, _REGULAR))
    _, chosen = jax.lax.top_k(tier + jax.random.uniform(key, (seq_len,)), k)
    is_masked = jnp.zeros((seq_len,), jnp.int32).at[chosen].set(1)
    order = jnp.argsort(is_masked, stable=True)
    visible_idx, masked_idx = order[: seq_len - k], order[seq_len - k :]
    weights = (~is_pad & ~is_special)[masked_idx].astype(jnp.float32)
    return masked_idx, visible_idx, weights


def corrupt_for_mlm(key, ids, masked_idx, weights, cfg: MaskingConfig) -> jax.Array:
    """One row of RoBERTa corruption: <mask> / random regular token / unchanged.

    Only real targets (weight 1) change; forced slots on padding or specials stay intact.
    """
    choice_key, token_key = jax.random.split(key)
    u = jax.random.uniform(choice_key, masked_idx.shape)
    random_ids = jax.random.randint(
        token_key, masked_idx.shape, cfg.first_regular_id, cfg.vocab_size, dtype=ids.dtype
    )
    original = ids[masked_idx]
    replaced = jnp.where(
        u < cfg.mlm_mask_prob,
        jnp.asarray(cfg.mask_id, ids.dtype),
        jnp.where(u < cfg.mlm_mask_prob + cfg.mlm_random_prob, random_ids, original),
    )
    return ids.at[masked_idx].set(jnp.where(weights > 0, replaced, original))


def mask_batch(rng: jax.Array, input_ids: jax.Array, cfg: MaskingConfig) -> MaskedBatch:
    """input_ids [B, L] -> MaskedBatch; randomness per example, see the module docstring."""
    if input_ids.shape[1] != cfg.seq_len:
        raise ValueError(f"batch has seq_len {input_ids.shape[1]}, config says {cfg.seq_len}")

    def one_row(key, ids):
        slot_key, corrupt_key = jax.random.split(key)
        masked_idx, visible_idx, weights = choose_slots(slot_key, ids, cfg)
        model_ids = ids
        if cfg.objective == "mlm":
            model_ids = corrupt_for_mlm(corrupt_key, ids, masked_idx, weights, cfg)
        segment_ids = segments.segment_ids(ids, cfg.eos_id, cfg.pad_id, cfg.packing)
        return MaskedBatch(
            model_ids, ids[masked_idx], masked_idx, visible_idx, weights, segment_ids
        )

    keys = jax.random.split(rng, input_ids.shape[0])
    return jax.vmap(one_row)(keys, input_ids)
