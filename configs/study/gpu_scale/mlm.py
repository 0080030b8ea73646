"""GPU study row: RoBERTa's MLM, configs/study/mlm.py at `base.at_gpu_scale`."""

from configs.study import mlm
from configs.study.gpu_scale import base


def get_config():
    return base.at_gpu_scale(mlm.get_config())
