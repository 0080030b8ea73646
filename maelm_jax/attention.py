"""Multi-head attention and the optional T5-style relative position bias.

Attention goes through `jax.nn.dot_product_attention` so XLA (or cuDNN on GPUs) can choose a
fused kernel. That API has no attention-probability dropout; we keep the fused path and
regularise with the hidden dropout after each sub-layer instead.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from maelm_jax import logical_axes as ax
from maelm_jax.configuration import ModelConfig


class MultiHeadAttention(nn.Module):
    """Queries from `x` [B, T, E], keys/values from `context` [B, S, E] -> [B, T, E]."""

    config: ModelConfig

    def _weights(self, name: str, bias_axes: tuple[str, ...]):
        """(kernel [E, N, H], bias) in the compute dtype; `bias_axes` picks the bias's shape.

        Kernels are created at their full shape (flax's DenseGeneral creates them flat and
        reshapes, which breaks logical constraints under a mesh).
        """
        cfg = self.config
        sizes = {"embed": cfg.hidden_size, "heads": cfg.num_heads, "kv": cfg.head_dim}
        kernel = self.param(
            f"{name}_kernel",
            ax.param(nn.initializers.normal(cfg.init_std), ("embed", "heads", "kv")),
            (cfg.hidden_size, cfg.num_heads, cfg.head_dim),
        )
        bias = self.param(
            f"{name}_bias",
            ax.param(nn.initializers.zeros, bias_axes),
            tuple(sizes[a] for a in bias_axes),
        )
        return kernel.astype(cfg.dtype), bias.astype(cfg.dtype)

    @nn.compact
    def __call__(self, x, context, mask, bias=None):
        """mask: bool, broadcastable to [B, N, T, S], True = may attend; bias: [B|1, N, T, S]."""
        cfg = self.config

        def project(name, inputs):
            kernel, b = self._weights(name, ("heads", "kv"))
            y = jnp.einsum("bse,enh->bsnh", inputs.astype(cfg.dtype), kernel) + b
            return ax.constrain(y, ax.HEADS)

        q, k, v = project("query", x), project("key", context), project("value", context)
        if bias is not None:
            bias = bias.astype(q.dtype)
        out = ax.constrain(jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask), ax.HEADS)
        kernel, b = self._weights("out", ("embed",))
        return jnp.einsum("bsnh,enh->bse", out, kernel) + b


def relative_position_bucket(relative_position, num_buckets: int, max_distance: int):
    """T5's bidirectional bucketing: exact buckets near 0, log-spaced out to max_distance.

    Half the buckets are for keys after the query, half for keys before; within each half,
    the first half of the buckets are exact offsets and the rest are logarithmic.
    """
    half = num_buckets // 2
    bucket = jnp.where(relative_position > 0, half, 0)
    distance = jnp.abs(relative_position)
    max_exact = half // 2
    log_ratio = jnp.log(jnp.maximum(distance, 1) / max_exact) / math.log(max_distance / max_exact)
    far = max_exact + (log_ratio * (half - max_exact)).astype(jnp.int32)
    far = jnp.minimum(far, half - 1)
    return bucket + jnp.where(distance < max_exact, distance, far)


class RelativePositionBias(nn.Module):
    """Per-head bias from the tokens' *original* positions, shared by all encoder layers.

    Positions are passed in (not implied by array order) because the MAE-LM encoder's
    sequence is the visible subset: neighbours in the array may be far apart in the text.
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, query_positions, key_positions):
        """[B, T], [B, S] int -> bias [B, N, T, S] float32."""
        cfg = self.config
        table = self.param(
            "embedding",
            ax.param(
                nn.initializers.normal(cfg.init_std),
                ("relpos_buckets", "heads"),
            ),
            (cfg.relative_attention_buckets, cfg.num_heads),
            jnp.float32,
        )
        relative = key_positions[:, None, :] - query_positions[:, :, None]
        buckets = relative_position_bucket(
            relative, cfg.relative_attention_buckets, cfg.relative_attention_max_distance
        )
        return jnp.transpose(table[buckets], (0, 3, 1, 2))
