"""The masked language models: RoBERTa MLM, MAE-LM / 3ML-self, and 3ML-cross.

One encoder serves all three. It embeds each token at its *original* position, so the
MAE-LM encoder can run on the visible subsequence alone (`visible_idx`, a static-shape
gather) and still know where every token sits. The decoders, used only in pretraining, put
a [MASK] vector at the masked slots (`mask_token_source`: "embedding_row", the token
embedding's `<mask>` row as official MAE-LM does, so its gradient reaches that row; or
"learned", a separate vector as 3ML does); the LM head only ever sees the k masked slots, so
logits are [B, k, V], never [B, L, V].

Attention is confined to documents by segment ids ([B, L] int32, 0 = padding; see
segments.py and attention.py). They travel with every static-shape gather: the MAE-LM
encoder reads them at `visible_idx`, the 3ML-cross queries at `masked_idx`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from maelm_jax.model import logical_axes as ax
from maelm_jax.model.attention import stack_bias
from maelm_jax.model.relative_bias import RelativePositionBias
from maelm_jax.model.transformer import CrossDecoderBlock, EncoderBlock, apply_layers, layer_norm
from maelm_jax.run_config import ModelConfig


def gather_positions(x, idx):
    """x: [B, L, ...], idx: [B, n] -> [B, n, ...] (rows gather independently)."""
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def stack_bias_of(config: ModelConfig, bias):
    """`attention.stack_bias` as `config` asks: in its dtype, query blocks and `once`."""
    return stack_bias(bias, config.dtype, config.attention_query_chunk, config.relative_bias_once)


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
        x = token_vectors + PositionEmbedding(cfg, name="position_embed")(positions)
        x = layer_norm(cfg, "embed_norm")(x)
        x = nn.Dropout(cfg.dropout_rate, deterministic=deterministic)(x)
        x = ax.constrain(x, ax.HIDDEN)
        bias = None
        if cfg.relative_attention_buckets:
            bias = RelativePositionBias(cfg, name="relative_bias")(positions, positions)
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
        positions = jnp.broadcast_to(jnp.arange(segment_ids.shape[1]), segment_ids.shape)
        x = ax.constrain(gather_positions(slots, restore), ax.HIDDEN)
        x = x + PositionEmbedding(cfg, name="position_embed")(positions)
        self.sow("intermediates", "decoder_input", x)
        x = layer_norm(cfg, "embed_norm")(x)
        x = nn.Dropout(cfg.decoder_dropout_rate, deterministic=deterministic)(x)
        bias = None
        if cfg.decoder_relative_attention:  # every row has the same positions: [1, N, L, L]
            bias = RelativePositionBias(cfg, name="relative_bias")(positions[:1], positions[:1])
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
            relative_bias = RelativePositionBias(cfg, name="relative_bias")
            self_bias = stack_bias_of(cfg, relative_bias(masked_idx, masked_idx))
            cross_bias = stack_bias_of(cfg, relative_bias(masked_idx, visible_idx))
        batch, k = masked_idx.shape
        mask = mask_embedding(self, cfg, mask_vector)
        masks = jnp.broadcast_to(mask, (batch, k, cfg.hidden_size))
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


class LMHead(nn.Module):
    """dense -> GELU -> LayerNorm -> tied token embedding + bias; float32 logits."""

    config: ModelConfig

    @nn.compact
    def __call__(self, hidden, token_embed: nn.Embed):
        """hidden [B, k, E] -> logits [B, k, V]."""
        cfg = self.config
        hidden = ax.constrain(hidden, ax.HIDDEN)
        h = nn.Dense(
            cfg.hidden_size,
            kernel_init=ax.param(nn.initializers.normal(cfg.init_std), ("embed", "mlp")),
            bias_init=ax.param(nn.initializers.zeros, ("mlp",)),
            dtype=cfg.dtype,
            param_dtype=jnp.float32,
            name="dense",
        )(hidden)
        h = layer_norm(cfg, "norm")(nn.gelu(h, approximate=False))
        bias = self.param(
            "output_bias", ax.param(nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,)
        )
        logits = token_embed.attend(h).astype(jnp.float32) + bias
        return ax.constrain(logits, ax.LOGITS)


class MaskedLM(nn.Module):
    """The pretraining model; `config.objective` picks MLM or MAE-LM, `config.decoder` the
    MAE-LM decoder kind. `encode` is the part that survives pretraining."""

    config: ModelConfig
    pad_id: int
    mask_id: int = 4  # the `<mask>` row for mask_token_source="embedding_row" (tokenizer.MASK_ID)

    def setup(self):
        cfg = self.config
        self.token_embed = nn.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            embedding_init=ax.param(nn.initializers.normal(cfg.init_std), ("vocab", "embed")),
            dtype=cfg.dtype,
            param_dtype=jnp.float32,
        )
        self.encoder = Encoder(cfg)
        if cfg.objective == "mae_lm":
            self.decoder = (SelfDecoder if cfg.decoder == "self" else CrossDecoder)(cfg)
        self.lm_head = LMHead(cfg)

    def _segments(self, input_ids, segment_ids):
        """The given segment ids, or one segment of all non-pad tokens (padding 0)."""
        if segment_ids is None:
            return (input_ids != self.pad_id).astype(jnp.int32)
        return segment_ids

    def encode(self, input_ids, positions, deterministic: bool = True, segment_ids=None):
        """input_ids [B, T], positions [B, T] or [1, T] (the same for every row) -> [B, T, E];
        segment_ids [B, T] (default: every non-pad token in one segment) confine attention to
        a document; padding is never attended to."""
        segment_ids = self._segments(input_ids, segment_ids)
        return self.encoder(self.token_embed(input_ids), positions, segment_ids, deterministic)

    def _mask_vector(self):
        """The `<mask>` embedding row [E], or None where the decoder learns its own vector."""
        if self.config.mask_token_source == "embedding_row":
            return self.token_embed.embedding[self.mask_id]
        return None

    def __call__(
        self, input_ids, masked_idx, visible_idx, deterministic: bool = True, segment_ids=None
    ):
        """input_ids [B, L], masked_idx [B, k], visible_idx [B, L-k], segment_ids [B, L] or
        None (one segment of all non-pad tokens) -> logits [B, k, V].

        For "mae_lm" the ids at masked_idx are never read: the encoder gathers visible_idx.
        """
        hidden = self.masked_hidden(input_ids, masked_idx, visible_idx, deterministic, segment_ids)
        return self.logits(hidden)

    def logits(self, hidden):
        """The LM head: [B, k, E] -> float32 [B, k, V]; apart so the loss can run it in blocks
        of slots (`loss.chunked_masked_lm_sums`)."""
        return self.lm_head(hidden, self.token_embed)

    def masked_hidden(
        self, input_ids, masked_idx, visible_idx, deterministic: bool = True, segment_ids=None
    ):
        """`__call__` up to the LM head: the last hidden state at the k masked slots [B, k, E]."""
        cfg = self.config
        segment_ids = self._segments(input_ids, segment_ids)
        if cfg.objective == "mlm":  # every row at 0..L-1: one [1, L] for the batch
            positions = jnp.arange(input_ids.shape[1])[None]
            encoded = self.encode(input_ids, positions, deterministic, segment_ids)
            return gather_positions(encoded, masked_idx)
        visible_ids = gather_positions(input_ids, visible_idx)
        visible_segments = gather_positions(segment_ids, visible_idx)
        encoded = self.encode(visible_ids, visible_idx, deterministic, visible_segments)
        self.sow("intermediates", "encoder_output", encoded)
        if cfg.decoder == "self":
            hidden = self.decoder(
                encoded, visible_idx, masked_idx, segment_ids, deterministic, self._mask_vector()
            )
        else:
            masked_segments = gather_positions(segment_ids, masked_idx)
            hidden = self.decoder(
                encoded,
                visible_segments,
                visible_idx,
                masked_idx,
                masked_segments,
                deterministic,
                self._mask_vector(),
            )
        return hidden


def init_inputs(seq_len: int, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(input_ids, masked_idx, visible_idx) of one placeholder row for `MaskedLM.init`:
    parameter shapes depend only on seq_len and k, never on the values."""
    ids = jnp.zeros((1, seq_len), jnp.int32)
    masked_idx = jnp.arange(k, dtype=jnp.int32)[None]
    visible_idx = jnp.arange(k, seq_len, dtype=jnp.int32)[None]
    return ids, masked_idx, visible_idx


def count_params(params) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(params))
