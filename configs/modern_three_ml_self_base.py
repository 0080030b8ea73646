"""3ML-self on the modern backbone, base (configs/modern.py): 50% masking, 3ML's 2-layer
self-attention decoder and learned [MASK] vector."""

from configs import modern, three_ml_self_base


def get_config():
    return modern.base_model(three_ml_self_base.get_config())
