"""Study row: RoBERTa's MLM (15%, 80/10/10; the encoder sees [MASK]), the LM head on the
encoder."""

from configs.study import base


def get_config():
    c = base.get_config()
    c.objective = "mlm"
    c.mask_rate = 0.15
    c.model.decoder_relative_attention = False  # no decoder
    c.model.decoder_relative_attention_init_slope = 0.0
    return c
