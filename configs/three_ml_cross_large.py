"""3ML-cross large."""

from configs import base, three_ml_cross_base


def get_config():
    return base.use_large_model(three_ml_cross_base.get_config())
