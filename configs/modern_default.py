"""The embedded default on the modern backbone: a tiny MAE-LM on the Python-docs corpus.

configs/default.py's run (corpus, tokenizer, batch, schedule) with the encoder and decoder of
configs/modern.py at a demo's size: 4 layers (global, local, local, global) with a 32-token
window on 128-token blocks. The roberta default needs its local-starting relative bias to
leave the unigram plateau within minutes; rotary positions need no such help (docs/results.md,
"The modern backbone's demo": the curve).
"""

from configs import default


def get_config():
    c = default.get_config()
    c.model.backbone = "modern"
    c.model.relative_attention_buckets = 0
    c.model.relative_attention_init_slope = 0.0
    c.model.decoder_relative_attention = False
    c.model.decoder_relative_attention_init_slope = 0.0
    c.model.mlp_dim = 384  # GeGLU: two input matrices, so ~ the MLP parameters of 512
    c.model.local_attention = 32
    c.model.global_attention_every_n_layers = 3
    return c
