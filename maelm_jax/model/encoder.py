"""The encoder every objective shares, and what travels with tokens through the gathers.

It embeds each token at its *original* position, so the MAE-LM and 3ML encoders run on the
kept subsequence alone (`visible_idx`, a static-shape gather) and still know where every
token sits: the roberta backbone through learned absolute positions (and the relative bias
where configured), the modern one through rotations at those positions
(model/positions/rotary.py). This encoder is what survives pretraining and is exported.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model import logical_axes as ax
from maelm_jax.model.attention import stack_bias
from maelm_jax.model.modern_blocks import ModernBlock
from maelm_jax.model.positions.relative_bias import RelativePositionBias
from maelm_jax.model.positions.rotary import rotations
from maelm_jax.model.transformer import EncoderBlock, apply_layers, layer_norm


def gather_positions(x, idx):
    """x: [B, L, ...], idx: [B, n] -> [B, n, ...] (rows gather independently)."""
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def stack_bias_of(config: ModelConfig, bias):
    """`attention.stack_bias` as `config` asks: in its dtype, query blocks, `once` and
    where the table's gradient is contracted; factored still where a kernel takes it so."""
    if config.relative_bias_impl == "triton":
        return bias
    return stack_bias(
        bias,
        config.dtype,
        config.attention_query_chunk,
        config.relative_bias_once,
        summed=config.relative_bias_grad == "summed",
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def take_rows(table, ids, dtype, gathered_names=None):
    """`table[ids]` in `dtype`, read from `table` cast to `dtype` (constrained to
    `gathered_names` first where given), with the table's gradient summed in float32.

    Why not plain `jnp.take`: differentiated, it scatter-adds one row per token into a
    table-shaped array of the dtype it read, bfloat16 in a bfloat16 model. On an H200 that
    scatter ran at 10% occupancy and took 61 of 195 ms of mlm_base's step
    (docs/results.md). Here the forward pass is the same lookup, and the backward pass is
    a float32 scatter-add that returns the float32 gradient as is, without the bfloat16
    rounding the plain form applies to every row's sum.
    """
    return _take_forward(table, ids, dtype, gathered_names)


def _take_forward(table, ids, dtype, gathered_names):
    cast = jnp.asarray(table, dtype)
    if gathered_names is not None:
        cast = ax.constrain(cast, gathered_names)
    return jnp.take(cast, ids, axis=0)


def _take_rows_fwd(table, ids, dtype, gathered_names):
    # A zero-width array of the table's rows and dtype: the backward pass's shape, for free.
    return _take_forward(table, ids, dtype, gathered_names), (
        ids,
        jnp.zeros((table.shape[0], 0), table.dtype),
    )


def _take_rows_bwd(dtype, gathered_names, residuals, g):
    del dtype, gathered_names
    ids, like = residuals
    grad = jnp.zeros((like.shape[0], g.shape[-1]), jnp.float32)
    grad = grad.at[ids].add(g.astype(jnp.float32), mode="promise_in_bounds")
    return grad.astype(like.dtype), None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


class TokenEmbedding(nn.Embed):
    """`nn.Embed` whose lookup can sum the table's gradient in float32 (`take_rows`) and
    read a copy of the table gathered whole over its (fsdp-sharded) embedding axis
    (`model.gather_embedding_table`); `attend`, the tied LM head, reads the sharded table
    either way. The same values.

    Why gather: looking up in the sharded table, XLA's partitioner has every chip gather every
    token of the global batch, one slice of the embedding each, and transpose the vectors
    back to batch shards. Where a chip's slice is narrow (32 of 1024 for the large configs
    on v5p-64) that relayout pads to 128 lanes and libtpu compiles it to a program larger
    than one overlay: gathering the table first cut a one-layer mae_lm_large program on
    v5p-64 from 13.11 to 12.68 ms (XLA's cost model) and its compile from about 70 to 51
    CPU seconds. Where the slice is wide (base on v5p-8: 192 of 768) the table's all-gather
    costs more than it saves (three_ml_self_base 14.56 -> 14.69 ms); "auto" decides by the
    width (`ModelConfig.for_embedding_shards`).
    """

    gather_table: bool = False
    float32_grad: bool = True  # model.embedding_grad: `take_rows`, or the plain lookup's

    def __call__(self, inputs):
        names = ("activation_vocab", "activation_embed") if self.gather_table else None
        if self.float32_grad:
            return take_rows(self.embedding, inputs, jnp.dtype(self.dtype), names)
        return _take_forward(self.embedding, inputs, jnp.dtype(self.dtype), names)


class PositionEmbedding(nn.Module):
    """Learned absolute positions, looked up at the given (original) positions."""

    config: ModelConfig

    @nn.compact
    def __call__(self, positions):
        """positions: [B, T] int -> [B, T, E] in the compute dtype."""
        cfg = self.config
        table = self.param(
            "embedding",
            ax.param(nn.initializers.normal(cfg.init_std), ("position", "embed")),
            (cfg.max_positions, cfg.hidden_size),
            jnp.float32,
        )
        return jnp.take(table, positions, axis=0).astype(cfg.dtype)


class Encoder(nn.Module):
    """Token vectors + original positions -> contextual vectors; RoBERTa-compatible."""

    config: ModelConfig

    @nn.compact
    def __call__(self, token_vectors, positions, segment_ids, deterministic: bool):
        """token_vectors [B, T, E], positions [B|1, T], segment_ids int [B, T] -> [B, T, E]."""
        cfg = self.config
        if cfg.modern:
            return self._modern(token_vectors, positions, segment_ids, deterministic)
        x = token_vectors + PositionEmbedding(cfg, name="position_embed")(positions)
        x = layer_norm(cfg, "embed_norm")(x)
        x = nn.Dropout(cfg.dropout_rate, deterministic=deterministic)(x)
        x = ax.constrain(x, ax.HIDDEN)
        bias = None
        if cfg.relative_attention_buckets:
            bias = RelativePositionBias(
                cfg,
                cfg.relative_attention_init_slope,
                cfg.relative_attention_init_cap,
                name="relative_bias",
            )(positions, positions)
        bias = stack_bias_of(cfg, bias)
        return apply_layers(
            EncoderBlock,
            cfg,
            cfg.num_layers,
            "layers",
            cfg.remat_policy,
            x,
            segment_ids,
            bias,
            dropout_rate=cfg.dropout_rate,
            attention_dropout_rate=cfg.attention_dropout_rate,
            deterministic=deterministic,
        )

    def _modern(self, token_vectors, positions, segment_ids, deterministic):
        """ModernBERT's encoder: embedding norm, pre-LN layers rotated at `positions`, final
        norm."""
        cfg = self.config
        x = layer_norm(cfg, "embed_norm")(token_vectors)
        x = nn.Dropout(cfg.dropout_rate, deterministic=deterministic)(x)
        x = apply_layers(
            ModernBlock,
            cfg,
            cfg.num_layers,
            "layers",
            cfg.remat_policy,
            ax.constrain(x, ax.HIDDEN),
            segment_ids,
            positions,
            rotations_of(cfg, positions),
            dropout_rate=cfg.dropout_rate,
            attention_dropout_rate=cfg.attention_dropout_rate,
            deterministic=deterministic,
            first_unnormed=True,
        )
        return layer_norm(cfg, "final_norm")(x)


def rotations_of(config: ModelConfig, positions):
    return rotations(positions, config.head_dim, config.rope_theta_global, config.rope_theta_local)
