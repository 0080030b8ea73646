"""MAE-LM on the modern backbone, base (configs/modern.py): the encoder sees the unmasked
85% at their original positions; MAE-LM's 4-layer decoder and [MASK] row, pre-LN and global."""

from configs import mae_lm_base, modern


def get_config():
    return modern.base_model(mae_lm_base.get_config())
