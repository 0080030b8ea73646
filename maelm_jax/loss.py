"""Masked-token cross-entropy as sums plus a denominator.

Returning sums (not means) lets gradient accumulation, evaluation over many batches and any
cross-device reduction add numbers up exactly, then divide once.
"""

import jax
import jax.numpy as jnp
import optax


def masked_lm_sums(logits, labels, weights) -> dict[str, jax.Array]:
    """logits [B, k, V] float32, labels [B, k], weights [B, k] -> scalar sums.

    `loss_sum` and `correct_sum` are weighted by `weights`; `weight_sum` is the number of
    real targets (forced slots weigh 0).
    """
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return {
        "loss_sum": jnp.sum(ce * weights),
        "correct_sum": jnp.sum(correct * weights),
        "weight_sum": jnp.sum(weights),
    }


def mean_loss(sums: dict[str, jax.Array]) -> jax.Array:
    """The per-target loss; 0 (not NaN) for a batch with no targets."""
    return sums["loss_sum"] / jnp.maximum(sums["weight_sum"], 1.0)
