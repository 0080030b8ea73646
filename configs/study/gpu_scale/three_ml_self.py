"""GPU study row: 3ML-self (50%, a self-attention decoder), configs/study/three_ml_self.py
at `base.at_gpu_scale`."""

from configs.study import three_ml_self
from configs.study.gpu_scale import base


def get_config():
    return base.at_gpu_scale(three_ml_self.get_config())
