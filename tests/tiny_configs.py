"""Tiny versions of the real configs, for tests that must run in seconds on a CPU."""

from configs import default
from maelm_jax import configuration
from maelm_jax.tokenizer import BOS_ID, EOS_ID, FIRST_REGULAR_ID, MASK_ID, PAD_ID

VOCAB = 300


def tiny_config(objective="mae_lm", decoder="self", seq_len=32, **model_overrides):
    c = default.get_config()
    c.objective = objective
    c.mask_rate = 0.25
    c.seq_len = seq_len
    c.batch_size = 8
    c.vocab_size = VOCAB
    c.model.decoder = decoder
    c.model.num_layers = 2
    c.model.num_decoder_layers = 1
    c.model.hidden_size = 32
    c.model.num_heads = 4
    c.model.mlp_dim = 64
    c.model.max_positions = seq_len
    c.model.dropout_rate = 0.1
    for key, value in model_overrides.items():
        c.model[key] = value
    return c


def frozen(c, vocab=VOCAB):
    """(ModelConfig, MaskingConfig) for a tiny config with the project's special ids."""
    return configuration.model_config(c, vocab), configuration.masking_config(
        c,
        vocab_size=vocab,
        mask_id=MASK_ID,
        pad_id=PAD_ID,
        special_ids=(BOS_ID, PAD_ID, EOS_ID),
        first_regular_id=FIRST_REGULAR_ID,
    )
