"""The masked language models: RoBERTa MLM, MAE-LM / 3ML-self, and 3ML-cross.

One encoder (encoder.py) serves all three; MAE-LM and 3ML add a decoder (decoders.py), used
only in pretraining; the LM head only ever sees the k masked slots, so logits are
[B, k, V], never [B, L, V].

Attention is confined to documents by segment ids ([B, L] int32, 0 = padding; see
positions/segments.py and attention.py). They travel with every static-shape gather: the
MAE-LM encoder reads them at `visible_idx`, the 3ML-cross queries at `masked_idx`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model import logical_axes as ax
from maelm_jax.model.decoders import CrossDecoder, SelfDecoder
from maelm_jax.model.encoder import Encoder, TokenEmbedding, gather_positions
from maelm_jax.model.transformer import layer_norm


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
            use_bias=not cfg.modern,  # ModernBERT's head: bias-free dense and norm
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
        self.token_embed = TokenEmbedding(
            cfg.vocab_size,
            cfg.hidden_size,
            embedding_init=ax.param(nn.initializers.normal(cfg.init_std), ("vocab", "embed")),
            dtype=cfg.dtype,
            param_dtype=jnp.float32,
            gather_table=cfg.gather_embedding_table == "always",
            float32_grad=cfg.embedding_grad != "compute_dtype",
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
        encoded = self._encode_kept(visible_ids, visible_idx, visible_segments, deterministic)
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

    def _encode_kept(self, ids, positions, segments, deterministic):
        """`encode` over the kept tokens, padded to a multiple of `encoder_length_multiple`
        slots first and cut back after.

        Why: cuDNN's attention with a bias (a mask is one) takes lengths that are a multiple
        of 8 (model/kernels/cudnn.py), and MAE-LM keeps L - k tokens: 435 of 512, 870 of 1024.
        Padded inside every layer, that was 178 pad kernels, 2.4 of 43.5 ms per
        modern_mae_lm_base step on an H200 (2026-11-27, docs/results.md), where one pad here
        does. The extra slots are a segment of their own (-1): no kept token sees them and
        they see only each other, so every kept token's output is what it was."""
        kept = ids.shape[1]
        extra = -kept % (self.config.encoder_length_multiple or 1)  # 0: not made concrete
        if extra:
            widths = ((0, 0), (0, extra))
            ids = jnp.pad(ids, widths, constant_values=self.pad_id)
            positions = jnp.pad(positions, widths)
            segments = jnp.pad(segments, widths, constant_values=-1)
        return self.encode(ids, positions, deterministic, segments)[:, :kept]


def init_inputs(seq_len: int, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(input_ids, masked_idx, visible_idx) of one placeholder row for `MaskedLM.init`:
    parameter shapes depend only on seq_len and k, never on the values."""
    ids = jnp.zeros((1, seq_len), jnp.int32)
    masked_idx = jnp.arange(k, dtype=jnp.int32)[None]
    visible_idx = jnp.arange(k, seq_len, dtype=jnp.int32)[None]
    return ids, masked_idx, visible_idx


def count_params(params) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(params))
