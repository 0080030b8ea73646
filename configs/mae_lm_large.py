"""MAE-LM large."""

from configs import base, mae_lm_base


def get_config():
    return base.use_large_model(mae_lm_base.get_config())
