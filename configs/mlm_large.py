"""RoBERTa-style MLM baseline, large size."""

from configs import base, mlm_base


def get_config():
    return base.use_large_model(mlm_base.get_config())
