"""MAE-LM base: the encoder sees the unmasked 85%; a 4-layer self-attention decoder.

Recipe: MAE-LM's base++ setting as the official `run_pretrain.sh` runs it (configs/base.py):
2M updates, batch 2048 x 512, lr 2e-4, 10k warmup, Adam (0.9, 0.98) eps 1e-6, clip 2.0,
weight decay 0.01; `--rel-pos-bins 64 --max-rel-pos 128 --gen-decoder-layers 4`. The paper's
"base" setting (125k updates on the 16 GB corpus) needs its own peak lr, which the stored
material did not give, so it has no config here.
"""

from configs import base


def get_config():
    c = base.get_config()
    c.objective = "mae_lm"
    c.mask_rate = 0.15
    c.model.decoder = "self"
    c.model.num_decoder_layers = 4
    c.model.relative_attention_buckets = 64
    c.model.relative_attention_max_distance = 128
    c.model.mask_token_source = "embedding_row"
    return c
