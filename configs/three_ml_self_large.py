"""3ML-self large."""

from configs import base, three_ml_self_base


def get_config():
    return base.use_large_model(three_ml_self_base.get_config())
