"""Study row: 3ML-self (50%; a one-layer full-length self-attention decoder)."""

from configs.study import base


def get_config():
    c = base.get_config()
    c.objective = "mae_lm"
    c.mask_rate = 0.5
    c.model.decoder = "self"
    return c
