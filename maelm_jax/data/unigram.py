"""The unigram baseline of the eval loss: what a model that ignores context would score.

`eval/unigram_loss` is the entropy (nats) of the eval data's own token distribution, over
every token the eval masks could score (every token of the eval rows but padding and the
specials, the population `masking.py` draws targets from uniformly):

    c[t] = how often t occurs in the eval rows,   p[t] = c[t] / sum(c),
    unigram_loss = -sum_t p[t] log p[t].

The eval targets are a uniform sample of those tokens, so p's expected loss on them is that
entropy: the loss of the best fixed distribution for the eval data, one that even knows the
eval counts. An eval loss below it means the model reads the context.

Why all tokens and not only the scored slots: a plug-in entropy from N samples is biased low
by about (distinct tokens - 1) / 2N. The default run scores 1,229 slots with a 1,024-piece
vocabulary: their own entropy is 5.17 nats, while all 8,112 eval tokens give 5.42, and the
eval tokens' cross-entropy under the training data's unigram (what a context-free model
trained here actually scores) is 5.54. The slots-only baseline measured the eval size more
than the context; this one keeps a smaller bias, still in the baseline's favour.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from maelm_jax.config.run_config import MaskingConfig


def token_counts(input_ids, *, masking_cfg: MaskingConfig) -> jax.Array:
    """c above for one eval batch: input_ids [B, L] -> float32 [vocab_size] token counts."""
    ids = input_ids.reshape(-1)
    scorable = ~jnp.isin(ids, jnp.asarray((masking_cfg.pad_id, *masking_cfg.special_ids)))
    counts = jnp.zeros((masking_cfg.vocab_size,), jnp.float32)
    return counts.at[ids].add(scorable.astype(jnp.float32))


def entropy(counts: np.ndarray) -> float:
    """-sum p log p (nats) of the distribution proportional to `counts`; 0 without counts."""
    counts = np.asarray(counts, np.float64)
    counts = counts[counts > 0]
    if not len(counts):
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def eval_unigram_loss(progs, eval_batches) -> float:
    """The baseline over all eval batches; collective (every process calls it), like eval.

    `progs.global_batch` assembles a process's rows as `evaluate` does, so the rows counted
    here are the rows the eval step scores.
    """
    count = jax.jit(
        functools.partial(token_counts, masking_cfg=progs.masking_cfg),
        in_shardings=(progs.batch_sharding,),
        out_shardings=NamedSharding(progs.mesh, PartitionSpec()),
    )
    total = np.zeros(progs.masking_cfg.vocab_size, np.float64)
    for local_rows in eval_batches:
        batch = progs.global_batch(local_rows)
        total += np.asarray(jax.device_get(count(batch["input_ids"])))
    return entropy(total)
