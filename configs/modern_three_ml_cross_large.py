"""3ML-cross on the modern backbone, large (configs/modern.py): 50% masking; 2 decoder
layers whose queries are the masked slots, cross-attending to the kept tokens."""

from configs import modern, three_ml_cross_large


def get_config():
    return modern.large_model(three_ml_cross_large.get_config())
