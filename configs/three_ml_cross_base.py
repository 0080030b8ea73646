"""3ML-cross base: 50% masking; 2 decoder layers whose queries are the masked slots only.

Recipe and [MASK] vector as configs/three_ml_self_base.py."""

from configs import three_ml_self_base


def get_config():
    c = three_ml_self_base.get_config()
    c.model.decoder = "cross"
    return c
