"""Transformer blocks (RoBERTa's post-LN layout) and the layer stack that scans or loops them.

Post-LN, exact GELU and biases everywhere keep the encoder block numerically identical to
HuggingFace's `RobertaLayer`, so a trained encoder exports without approximation.
"""

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model import logical_axes as ax
from maelm_jax.model.attention import MultiHeadAttention
from maelm_jax.model.remat import POLICIES, saved, token_major


def layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
    """RoBERTa's LayerNorm, or the modern backbone's, which has no bias."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_epsilon,
        use_bias=not config.modern,
        dtype=config.dtype,
        param_dtype=jnp.float32,
        scale_init=ax.param(nn.initializers.ones, ("embed",)),
        bias_init=ax.param(nn.initializers.zeros, ("embed",)),
        name=name,
    )


class Mlp(nn.Module):
    """[B, T, E] -> [B, T, E] through a GELU layer of width mlp_dim."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        init = nn.initializers.normal(cfg.init_std)
        dense = dict(dtype=cfg.dtype, param_dtype=jnp.float32)
        h = nn.Dense(
            cfg.mlp_dim,
            kernel_init=ax.param(init, ("embed", "mlp")),
            bias_init=ax.param(nn.initializers.zeros, ("mlp",)),
            name="wi",
            **dense,
        )(x)
        # [B, T, M] even where the other saved values are token-major (remat.py).
        h = ax.constrain(nn.gelu(checkpoint_name(h, "mlp_hidden"), approximate=False), ax.MLP)
        out = nn.Dense(
            cfg.hidden_size,
            kernel_init=ax.param(init, ("mlp", "embed")),
            bias_init=ax.param(nn.initializers.zeros, ("embed",)),
            name="wo",
            **dense,
        )(h)
        return saved(out, "mlp_out")


class EncoderBlock(nn.Module):
    """Self-attention + MLP, each followed by dropout, residual and LayerNorm (post-LN).

    Also the MAE-LM / 3ML-self decoder block (with the decoder's dropout rates).
    Returns the carry in the shape it came in ([B, T, E] or tokens [B * T, E], see
    `apply_layers`) and None, so the same block serves `nn.scan` and a plain loop.
    """

    config: ModelConfig
    dropout_rate: float
    attention_dropout_rate: float
    deterministic: bool

    @nn.compact
    def __call__(self, x, segment_ids, bias):
        """x: [B, T, E] or tokens [B * T, E]; segment_ids: int [B, T] (see attention.py); bias:
        [B, N, T, T] or None."""
        drop = nn.Dropout(self.dropout_rate, deterministic=self.deterministic)
        flat = x.ndim == 2
        x = ax.constrain(x.reshape(*segment_ids.shape, -1), ax.HIDDEN)
        h = MultiHeadAttention(self.config, self.attention_dropout_rate, name="attention")(
            x, x, (segment_ids, segment_ids), bias, self.deterministic
        )
        x = layer_norm(self.config, "attention_norm")(x + drop(h))
        h = Mlp(self.config, name="mlp")(x)
        x = layer_norm(self.config, "mlp_norm")(x + drop(h))
        return to_carry(x, flat), None


class CrossDecoderBlock(nn.Module):
    """3ML-cross: self-attention among the [MASK] queries, cross-attention to the encoder
    outputs, then the MLP; post-LN like the encoder."""

    config: ModelConfig
    dropout_rate: float
    attention_dropout_rate: float
    deterministic: bool

    @nn.compact
    def __call__(self, x, query_segments, context, context_segments, self_bias, cross_bias):
        """x [B, k, E] or [B * k, E] (as in `EncoderBlock`), query_segments [B, k], context
        [B, S, E], context_segments [B, S]: a query sees the other queries and the encoder
        outputs of its own segment only; self_bias [B, N, k, k] and cross_bias [B, N, k, S]
        are relative biases or None."""
        drop = nn.Dropout(self.dropout_rate, deterministic=self.deterministic)
        flat = x.ndim == 2
        x = ax.constrain(x.reshape(*query_segments.shape, -1), ax.HIDDEN)
        rate, det = self.attention_dropout_rate, self.deterministic
        h = MultiHeadAttention(self.config, rate, name="self_attention")(
            x, x, (query_segments, query_segments), self_bias, det
        )
        x = layer_norm(self.config, "self_attention_norm")(x + drop(h))
        h = MultiHeadAttention(self.config, rate, name="cross_attention")(
            x, context, (query_segments, context_segments), cross_bias, det
        )
        x = layer_norm(self.config, "cross_attention_norm")(x + drop(h))
        h = Mlp(self.config, name="mlp")(x)
        x = layer_norm(self.config, "mlp_norm")(x + drop(h))
        return to_carry(x, flat), None


def to_carry(x, flat: bool):
    """[B, T, E] -> the carry between blocks: [B * T, E] if `flat`, else as is."""
    x = ax.constrain(x, ax.HIDDEN)
    return x.reshape(-1, x.shape[-1]) if flat else x


def apply_layers(
    block_cls,
    config: ModelConfig,
    num_layers: int,
    name: str,
    remat_policy: str,
    x,
    *shared,
    **attrs,
):
    """Runs `num_layers` blocks on the carry `x`; `shared` inputs go unchanged to every layer.

    Must be called from a compact method: the blocks become children of the caller. With
    `scan_layers` the parameters are stacked on a leading "layers" axis (one compiled layer,
    compile time independent of depth); otherwise they are `name_0`, `name_1`, ...
    `remat_policy` is the stack's (the encoder's or the decoder's, see configs/base.py).

    The stack keeps every block's input for the backward pass; where T would pad on a TPU
    the carry between blocks is tokens [B * T, E] (remat.py).
    """
    shape = x.shape
    x = to_carry(x, token_major(x))
    # A block with `indexed` takes its layer's index first (the modern backbone's layer
    # kinds): a Python int in a loop, so the kind is static there; scanned, an int32.
    indexed = getattr(block_cls, "indexed", False)
    if remat_policy != "none":
        block_cls = nn.remat(
            block_cls,
            policy=POLICIES[remat_policy],
            prevent_cse=not config.scan_layers,
            # self is 0 and the carry 1: a loop's layer index stays a Python int
            static_argnums=(2,) if indexed and not config.scan_layers else (),
        )
    if config.scan_layers:
        stack = nn.scan(
            block_cls,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=(0,) * indexed + (nn.broadcast,) * len(shared),
            length=num_layers,
            unroll=config.layers_per_iteration(num_layers),
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        index = (jnp.arange(num_layers, dtype=jnp.int32),) * indexed
        x, _ = stack(config, name=name, **attrs)(x, *index, *shared)
        return x.reshape(shape)
    for i in range(num_layers):
        x, _ = block_cls(config, name=f"{name}_{i}", **attrs)(x, *(i,) * indexed, *shared)
    return x.reshape(shape)
