"""MLM on the modern backbone, large (configs/modern.py): ModernBERT's own objective, 30%
masking with 80/10/10 corruption."""

from configs import mlm_large, modern


def get_config():
    c = modern.large_model(mlm_large.get_config())
    c.mask_rate = 0.3
    return c
