"""3ML-self on the modern backbone, large (configs/modern.py): 50% masking, 3ML's 2-layer
self-attention decoder and learned [MASK] vector."""

from configs import modern, three_ml_self_large


def get_config():
    return modern.large_model(three_ml_self_large.get_config())
