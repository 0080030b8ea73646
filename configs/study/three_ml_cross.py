"""Study row: 3ML-cross (50%; one decoder layer whose queries are the masked slots, with
self- and cross-attention to the encoder)."""

from configs.study import base


def get_config():
    c = base.get_config()
    c.objective = "mae_lm"
    c.mask_rate = 0.5
    c.model.decoder = "cross"
    return c
