"""RoBERTa-style MLM baseline, base size: 15% masking with 80/10/10 corruption."""

from configs import base


def get_config():
    c = base.get_config()
    c.objective = "mlm"
    c.mask_rate = 0.15
    return c
