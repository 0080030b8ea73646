"""The pretraining decoders of MAE-LM and 3ML; dropped after pretraining.

Each puts a [MASK] vector at the masked slots (`mask_token_source`: "embedding_row", the
token embedding's `<mask>` row as official MAE-LM does, so its gradient reaches that row; or
"learned", a separate vector as 3ML does) and returns the last hidden state at the k masked
slots only, so the LM head's logits are [B, k, V], never [B, L, V].
"""

import flax.linen as nn
import jax.numpy as jnp

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model import logical_axes as ax
from maelm_jax.model.encoder import PositionEmbedding, gather_positions, rotations_of, stack_bias_of
from maelm_jax.model.modern_blocks import ModernBlock, ModernCrossBlock
from maelm_jax.model.positions.relative_bias import RelativePositionBias
from maelm_jax.model.transformer import CrossDecoderBlock, EncoderBlock, apply_layers, layer_norm


def mask_embedding(module: nn.Module, config: ModelConfig, mask_vector):
    """The [MASK] vector the decoders put at masked slots: [E], compute dtype; `mask_vector`
    (the `<mask>` embedding row) if given, else the decoder's learned `mask_embedding`."""
    if mask_vector is not None:
        return mask_vector.astype(config.dtype)
    vector = module.param(
        "mask_embedding",
        ax.param(nn.initializers.normal(config.init_std), ("embed",)),
        (config.hidden_size,),
        jnp.float32,
    )
    return vector.astype(config.dtype)


class SelfDecoder(nn.Module):
    """MAE-LM / 3ML-self: full-length self-attention over encoder outputs and [MASK] slots."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self, encoded, visible_idx, masked_idx, segment_ids, deterministic: bool, mask_vector
    ):
        """encoded [B, L-k, E] at visible_idx; masked_idx [B, k]; segment_ids [B, L]; mask_vector
        [E] or None (learned) -> [B, k, E].

        Concatenating [encoded; MASK x k] and gathering with the inverse of the permutation
        (visible_idx, masked_idx) puts every vector back at its original position: an
        "unshuffle" gather rather than a scatter.
        """
        cfg = self.config
        batch, k = masked_idx.shape
        mask = mask_embedding(self, cfg, mask_vector)
        masks = jnp.broadcast_to(mask, (batch, k, cfg.hidden_size))
        slots = jnp.concatenate([encoded.astype(cfg.dtype), masks], axis=1)
        restore = jnp.argsort(jnp.concatenate([visible_idx, masked_idx], axis=1), axis=1)
        x = ax.constrain(gather_positions(slots, restore), ax.HIDDEN)
        if cfg.modern:  # positions enter through the rotations; pre-LN layers, final norm
            self.sow("intermediates", "decoder_input", x)
            positions = jnp.arange(segment_ids.shape[1])[None]  # every row alike: [1, L]
            x = apply_layers(
                ModernBlock,
                cfg,
                cfg.num_decoder_layers,
                "layers",
                cfg.decoder_remat_policy,
                x,
                segment_ids,
                positions,
                rotations_of(cfg, positions),
                dropout_rate=cfg.decoder_dropout_rate,
                attention_dropout_rate=cfg.decoder_attention_dropout_rate,
                deterministic=deterministic,
                alternate=False,
            )
            x = layer_norm(cfg, "final_norm")(x)
            return gather_positions(x, masked_idx)
        # Every row sits at 0..L-1: one [1, L] lookup broadcast over the batch, not B of them
        # (and a sum over the batch for its gradient instead of a scatter-add).
        positions = jnp.arange(segment_ids.shape[1])[None]
        x = x + PositionEmbedding(cfg, name="position_embed")(positions)
        self.sow("intermediates", "decoder_input", x)
        x = layer_norm(cfg, "embed_norm")(x)
        x = nn.Dropout(cfg.decoder_dropout_rate, deterministic=deterministic)(x)
        bias = None
        if cfg.decoder_relative_attention:  # every row has the same positions: [1, N, L, L]
            bias = RelativePositionBias(
                cfg, cfg.decoder_relative_attention_init_slope, name="relative_bias"
            )(positions, positions)
        bias = stack_bias_of(cfg, bias)
        x = apply_layers(
            EncoderBlock,
            cfg,
            cfg.num_decoder_layers,
            "layers",
            cfg.decoder_remat_policy,
            x,
            segment_ids,
            bias,
            dropout_rate=cfg.decoder_dropout_rate,
            attention_dropout_rate=cfg.decoder_attention_dropout_rate,
            deterministic=deterministic,
        )
        return gather_positions(x, masked_idx)


class CrossDecoder(nn.Module):
    """3ML-cross: only the k [MASK] slots are queries; they cross-attend to the encoder."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        encoded,
        encoded_segments,
        visible_idx,
        masked_idx,
        masked_segments,
        deterministic: bool,
        mask_vector,
    ):
        """encoded [B, L-k, E] with its segment ids encoded_segments and positions visible_idx
        [B, L-k]; masked_idx, masked_segments [B, k]; mask_vector [E] or None (learned)
        -> [B, k, E]."""
        cfg = self.config
        self_bias = cross_bias = None
        if cfg.decoder_relative_attention:  # one table for both attentions
            relative_bias = RelativePositionBias(
                cfg, cfg.decoder_relative_attention_init_slope, name="relative_bias"
            )
            self_bias = stack_bias_of(cfg, relative_bias(masked_idx, masked_idx))
            cross_bias = stack_bias_of(cfg, relative_bias(masked_idx, visible_idx))
        batch, k = masked_idx.shape
        mask = mask_embedding(self, cfg, mask_vector)
        masks = jnp.broadcast_to(mask, (batch, k, cfg.hidden_size))
        if cfg.modern:
            return self._modern(
                masks,
                encoded,
                encoded_segments,
                visible_idx,
                masked_idx,
                masked_segments,
                deterministic,
            )
        x = masks + PositionEmbedding(cfg, name="position_embed")(masked_idx)
        x = ax.constrain(x, ax.HIDDEN)
        self.sow("intermediates", "decoder_input", x)
        x = layer_norm(cfg, "embed_norm")(x)
        x = nn.Dropout(cfg.decoder_dropout_rate, deterministic=deterministic)(x)
        return apply_layers(
            CrossDecoderBlock,
            cfg,
            cfg.num_decoder_layers,
            "layers",
            cfg.decoder_remat_policy,
            x,
            masked_segments,
            encoded.astype(cfg.dtype),
            encoded_segments,
            self_bias,
            cross_bias,
            dropout_rate=cfg.decoder_dropout_rate,
            attention_dropout_rate=cfg.decoder_attention_dropout_rate,
            deterministic=deterministic,
        )

    def _modern(
        self, masks, encoded, encoded_segments, visible_idx, masked_idx, masked_segments, det
    ):
        """The [MASK] queries carry no position of their own: the rotations give each its
        masked position, and the encoder outputs their kept ones."""
        cfg = self.config
        self.sow("intermediates", "decoder_input", masks)
        x = apply_layers(
            ModernCrossBlock,
            cfg,
            cfg.num_decoder_layers,
            "layers",
            cfg.decoder_remat_policy,
            ax.constrain(masks, ax.HIDDEN),
            masked_segments,
            encoded.astype(cfg.dtype),
            encoded_segments,
            rotations_of(cfg, masked_idx),
            rotations_of(cfg, visible_idx),
            dropout_rate=cfg.decoder_dropout_rate,
            attention_dropout_rate=cfg.decoder_attention_dropout_rate,
            deterministic=det,
        )
        return layer_norm(cfg, "final_norm")(x)
