"""MLM on the modern backbone, base (configs/modern.py): ModernBERT's own objective, 30%
masking with 80/10/10 corruption."""

from configs import mlm_base, modern


def get_config():
    c = modern.base_model(mlm_base.get_config())
    c.mask_rate = 0.3
    return c
