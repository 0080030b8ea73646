"""MAE-LM base: the encoder sees the unmasked 85%; a 4-layer self-attention decoder."""

from configs import base


def get_config():
    c = base.get_config()
    c.objective = "mae_lm"
    c.mask_rate = 0.15
    c.model.decoder = "self"
    c.model.num_decoder_layers = 4
    c.model.relative_attention_buckets = 64
    c.model.relative_attention_max_distance = 128
    return c
