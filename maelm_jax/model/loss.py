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


def chunked_masked_lm_sums(head, hidden, labels, weights, chunk: int) -> dict[str, jax.Array]:
    """`masked_lm_sums(head(hidden), labels, weights)` with the k slots in blocks of `chunk`.

    hidden [B, k, E] -> `head` -> logits [B, k, V] float32 is the largest array of a
    high-mask-rate step (3ML at 50%: [B, 256, 32768] floats, and its gradient). In blocks,
    each under `jax.checkpoint`, only one block's logits exist at a time and the backward
    pass recomputes them from `hidden`. The last block is padded with weight-0 slots.
    """
    k = hidden.shape[1]
    n = -(-k // chunk)
    size = -(-k // n)

    def blocks(x):  # [B, k, ...] -> [n, B, size, ...]
        x = jnp.pad(x, [(0, 0), (0, n * size - k)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape((x.shape[0], n, size, *x.shape[2:])), 1, 0)

    @jax.checkpoint
    def block(inputs):
        h, y, w = inputs
        return masked_lm_sums(head(h), y, w)

    sums = jax.lax.map(block, (blocks(hidden), blocks(labels), blocks(weights)))
    return jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), sums)


def mean_loss(sums: dict[str, jax.Array]) -> jax.Array:
    """The per-target loss; 0 (not NaN) for a batch with no targets."""
    return sums["loss_sum"] / jnp.maximum(sums["weight_sum"], 1.0)
