"""3ML-cross large: recipe as its base config (3ML's table was not in the stored material);
peak lr 1e-4 as the MAE-LM large config, unverified."""

from configs import base, three_ml_cross_base


def get_config():
    c = base.use_large_model(three_ml_cross_base.get_config())
    c.learning_rate = 1e-4
    return c
