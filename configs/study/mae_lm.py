"""Study row: MAE-LM (15%; the encoder sees only the unmasked tokens; a one-layer decoder)."""

from configs.study import base


def get_config():
    c = base.get_config()
    c.objective = "mae_lm"
    c.mask_rate = 0.15
    c.model.decoder = "self"
    return c
