"""The unigram baseline of the eval loss: what a model that ignores context would score.

`eval/unigram_loss` is the entropy (nats) of the eval targets' own token distribution: over
exactly the slots the eval loss scores (the fixed eval masks, `train_step.eval_masks`), each
weighted as the eval loss weighs it (forced slots on padding or specials weigh 0),

    c[t] = sum of the weights of the eval targets whose label is t,
    p[t] = c[t] / sum(c),
    unigram_loss = -sum_t c[t] * log p[t] / sum(c) = -sum_t p[t] log p[t].

That is the cross-entropy of those targets under their own unigram distribution, the lowest
eval loss any predictor that outputs one fixed distribution could reach on them (it even
knows the eval counts). An eval loss below it means the model reads the context.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from maelm_jax import train_step
from maelm_jax.configuration import MaskingConfig


def target_counts(input_ids, index, *, masking_cfg: MaskingConfig, seed: int) -> jax.Array:
    """c above for one eval batch: input_ids [B, L] -> float32 [vocab_size] weight sums."""
    masked = train_step.eval_masks(input_ids, index, masking_cfg=masking_cfg, seed=seed)
    counts = jnp.zeros((masking_cfg.vocab_size,), jnp.float32)
    return counts.at[masked.labels.reshape(-1)].add(masked.mask_weights.reshape(-1))


def entropy(counts: np.ndarray) -> float:
    """-sum p log p (nats) of the distribution proportional to `counts`; 0 without counts."""
    counts = np.asarray(counts, np.float64)
    counts = counts[counts > 0]
    if not len(counts):
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def eval_unigram_loss(progs, eval_batches, global_batch, seed: int) -> float:
    """The baseline over all eval batches; collective (every process calls it), like eval.

    `global_batch(progs, local_rows)` assembles a process's rows as `evaluate` does, so the
    masks here are the eval step's, row for row.
    """
    count = jax.jit(
        functools.partial(target_counts, masking_cfg=progs.masking_cfg, seed=seed),
        in_shardings=(progs.batch_sharding, None),
        out_shardings=NamedSharding(progs.mesh, PartitionSpec()),
    )
    total = np.zeros(progs.masking_cfg.vocab_size, np.float64)
    for index, local_rows in enumerate(eval_batches):
        batch = global_batch(progs, local_rows)
        total += np.asarray(jax.device_get(count(batch["input_ids"], np.int32(index))))
    return entropy(total)
