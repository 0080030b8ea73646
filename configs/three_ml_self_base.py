"""3ML-self base: 50% masking, a 2-layer full-length self-attention decoder."""

from configs import base


def get_config():
    c = base.get_config()
    c.objective = "mae_lm"
    c.mask_rate = 0.5
    c.model.decoder = "self"
    c.model.num_decoder_layers = 2
    c.model.mask_token_source = "learned"  # 3ML's own [MASK] vector, not the <mask> row
    return c
