"""GPU study row: MAE-LM (15%, a self-attention decoder), configs/study/mae_lm.py at
`base.at_gpu_scale`."""

from configs.study import mae_lm
from configs.study.gpu_scale import base


def get_config():
    return base.at_gpu_scale(mae_lm.get_config())
