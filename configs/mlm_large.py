"""RoBERTa-style MLM baseline, large size.

Recipe: RoBERTa Table 9, LARGE column: as BASE (configs/mlm_base.py) but peak lr 4e-4 and
30k warmup updates.
"""

from configs import base, mlm_base


def get_config():
    c = base.use_large_model(mlm_base.get_config(), grad_accum_steps=8)
    c.learning_rate = 4e-4
    c.warmup_steps = 30_000
    return c
