"""MAE-LM large.

Relative positions: 128 buckets, max distance 256, the defaults of the official `ae_large`
architecture (yumeng5/MAE-LM fairseq/models/ae/model.py). Peak lr 1e-4: not in the stored
material (neither the script, which is base++ only, nor a readable copy of the paper's
appendix); kept from the COCO-LM/MAE-LM large++ recipe as remembered, to be checked against
the paper's appendix table. Everything else as base++ (configs/base.py).
"""

from configs import base, mae_lm_base


def get_config():
    c = base.use_large_model(mae_lm_base.get_config(), grad_accum_steps=2)
    c.model.relative_attention_buckets = 128
    c.model.relative_attention_max_distance = 256
    c.learning_rate = 1e-4
    return c
