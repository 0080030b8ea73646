"""RoBERTa-style MLM baseline, base size: 15% masking with 80/10/10 corruption.

Recipe: RoBERTa (Liu et al., 2019), Table 9, BASE column: batch 8k sequences of 512,
500k updates, peak lr 6e-4, 24k warmup then linear decay, Adam (0.9, 0.98) eps 1e-6,
weight decay 0.01, no gradient clipping (0.0), dropout and attention dropout 0.1. Checked
against RoBERTa's released model cards (lr, warmup, Adam, decay); batch and steps per the
paper's text. RoBERTa packed FULL-SENTENCES across documents: `packing="concatenated"`
reproduces that; the default keeps documents apart like every config here.
"""

from configs import base


def get_config():
    c = base.get_config()
    c.objective = "mlm"
    c.mask_rate = 0.15
    c.batch_size = 8192
    c.num_train_steps = 500_000
    c.learning_rate = 6e-4
    c.warmup_steps = 24_000
    c.adam_b1, c.adam_b2, c.adam_eps = 0.9, 0.98, 1e-6
    c.weight_decay = 0.01
    c.max_grad_norm = 0.0
    return c
