"""GPU study row: 3ML-cross (50%, a cross-attention decoder), configs/study/three_ml_cross.py
at `base.at_gpu_scale`."""

from configs.study import three_ml_cross
from configs.study.gpu_scale import base


def get_config():
    return base.at_gpu_scale(three_ml_cross.get_config())
