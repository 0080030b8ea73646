"""The modern backbone's blocks (`model.backbone="modern"`): HuggingFace ModernBERT's layer.

Pre-LN, no bias in any linear layer or norm, a GeGLU MLP (`mlp_dim` is the GLU's width,
ModernBERT's `intermediate_size`) and rotary positions with alternating global and local
attention (positions/rotary.py). The parameter layout maps one to one onto `ModernBertModel`'s
(hf/modern_convert.py): the fused `Wqkv` and `Wi` are split into their parts here so that
each part shards on its own logical axes. ModernBERT's first layer has no attention norm
(the embeddings were just normalised); `ModernBlock(first_unnormed=True)` skips it at layer
0, which keeps one scanned layer for all.
"""

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model import logical_axes as ax
from maelm_jax.model.attention import MultiHeadAttention
from maelm_jax.model.positions.rotary import Window, is_global_layer
from maelm_jax.model.remat import saved
from maelm_jax.model.transformer import layer_norm, to_carry


class GatedMlp(nn.Module):
    """GeGLU: [B, T, E] -> wo(gelu(wi_input x) * wi_gate x), exact GELU, no biases."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dense = lambda name, features, axes: nn.Dense(
            features,
            use_bias=False,
            kernel_init=ax.param(nn.initializers.normal(cfg.init_std), axes),
            dtype=cfg.dtype,
            param_dtype=jnp.float32,
            name=name,
        )
        hidden = lambda name: ax.constrain(
            checkpoint_name(dense(name, cfg.mlp_dim, ("embed", "mlp"))(x), "mlp_hidden"), ax.MLP
        )
        h = nn.gelu(hidden("wi_input"), approximate=False) * hidden("wi_gate")
        return saved(dense("wo", cfg.hidden_size, ("mlp", "embed"))(h), "mlp_out")


def _select_first(layer_index, first, rest):
    """`first` at layer 0, else `rest`; static where the index is a Python int."""
    if isinstance(layer_index, int):
        return first if layer_index == 0 else rest
    return jnp.where(layer_index == 0, first, rest)


class ModernBlock(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): the encoder's layer and the MAE-LM /
    3ML-self decoder's. With `alternate`, layer i is local unless i % n == 0
    (`global_attention_every_n_layers`); without, every layer is global (the decoders)."""

    config: ModelConfig
    dropout_rate: float
    attention_dropout_rate: float
    deterministic: bool
    first_unnormed: bool = False
    alternate: bool = True
    indexed = True  # apply_layers passes the layer index

    @nn.compact
    def __call__(self, x, layer_index, segment_ids, positions, rotations):
        """x [B, T, E] or [B * T, E] (transformer.apply_layers); segment_ids [B, T];
        positions [B|1, T] original positions; rotations: their `rotary.Rotations`."""
        cfg = self.config
        drop = nn.Dropout(self.dropout_rate, deterministic=self.deterministic)
        flat = x.ndim == 2
        x = ax.constrain(x.reshape(*segment_ids.shape, -1), ax.HIDDEN)
        is_global = True
        if self.alternate:
            is_global = is_global_layer(layer_index, cfg.global_attention_every_n_layers)
        rotation = rotations.for_layer(is_global)
        window = Window(
            positions, positions, is_global, cfg.local_attention // 2, cfg.local_attention_block
        )
        h = layer_norm(cfg, "attention_norm")(x)
        if self.first_unnormed:
            h = _select_first(layer_index, x, h)
        h = MultiHeadAttention(cfg, self.attention_dropout_rate, name="attention")(
            h, h, (segment_ids, segment_ids), None, self.deterministic, (rotation, rotation), window
        )
        x = x + drop(h)
        x = x + drop(GatedMlp(cfg, name="mlp")(layer_norm(cfg, "mlp_norm")(x)))
        return to_carry(x, flat), None


class ModernCrossBlock(nn.Module):
    """3ML-cross on the modern backbone: pre-LN self-attention among the [MASK] queries,
    cross-attention to the encoder outputs, GeGLU; global, rotary at original positions."""

    config: ModelConfig
    dropout_rate: float
    attention_dropout_rate: float
    deterministic: bool
    indexed = True

    @nn.compact
    def __call__(
        self, x, layer_index, query_segments, context, context_segments, query_rot, context_rot
    ):
        """x [B, k, E] or [B * k, E]; query_segments [B, k]; context [B, S, E] (the encoder's
        output) with context_segments [B, S]; query_rot, context_rot: `rotary.Rotations` at
        the masked and the kept positions."""
        del layer_index  # every decoder layer is global
        cfg = self.config
        drop = nn.Dropout(self.dropout_rate, deterministic=self.deterministic)
        flat = x.ndim == 2
        x = ax.constrain(x.reshape(*query_segments.shape, -1), ax.HIDDEN)
        rate, det = self.attention_dropout_rate, self.deterministic
        q_rot, c_rot = query_rot.for_layer(True), context_rot.for_layer(True)
        h = layer_norm(cfg, "self_attention_norm")(x)
        h = MultiHeadAttention(cfg, rate, name="self_attention")(
            h, h, (query_segments, query_segments), None, det, (q_rot, q_rot)
        )
        x = x + drop(h)
        h = layer_norm(cfg, "cross_attention_norm")(x)
        h = MultiHeadAttention(cfg, rate, name="cross_attention")(
            h, context, (query_segments, context_segments), None, det, (q_rot, c_rot)
        )
        x = x + drop(h)
        x = x + drop(GatedMlp(cfg, name="mlp")(layer_norm(cfg, "mlp_norm")(x)))
        return to_carry(x, flat), None
