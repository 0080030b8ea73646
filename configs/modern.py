"""The modern backbone (`model.backbone="modern"`) at ModernBERT's sizes, for any objective.

Sizes from HuggingFace's ModernBERT configs (answerdotai/ModernBERT-base and -large, as
transformers' `ModernBertConfig` defaults give base): base 22 layers x 768 (12 heads, GLU
width 1152), large 28 x 1024 (16 heads, 2624); every third layer global from the first,
local window 128, rotary bases 160k (global) and 10k (local), LayerNorm eps 1e-5, no
dropout. Sequence 1024, with room for 8192 positions: `--config.seq_len=8192` is the
long-context variant (model/positions/rotary.py; docs/design.md).

Training recipe: ModernBERT trained with StableAdamW, a warmup-stable-decay schedule and
30% MLM masking; the optimizer and schedule here stay the project's AdamW with linear decay
(configs/base.py), and lr, batch and steps below are this project's choices at 1024 tokens
(about 4M tokens per step, as the papers' batches are), not ModernBERT's published recipe,
which the stored material did not give: check them before comparing numbers. For 8192,
keep the tokens per step: `--config.seq_len=8192 --config.batch_size=512` (unverified).
"""


def _modern(c, layers, hidden, heads, mlp):
    c.model.backbone = "modern"
    c.model.num_layers = layers
    c.model.hidden_size = hidden
    c.model.num_heads = heads
    c.model.mlp_dim = mlp
    c.model.max_positions = 8192
    c.model.local_attention = 128
    c.model.global_attention_every_n_layers = 3
    c.model.rope_theta_global = 160_000.0
    c.model.rope_theta_local = 10_000.0
    c.model.relative_attention_buckets = 0  # rotary positions instead
    c.model.dropout_rate = 0.0
    c.model.attention_dropout_rate = 0.0
    c.model.layer_norm_epsilon = 1e-5
    # A loop over the layers, also on GPU: the unrolled 22-layer stack did not finish
    # compiling and timing within 130 s on an H200 (docs/results.md).
    c.model.scan_unroll = 1
    c.seq_len = 1024
    c.batch_size = 4096
    c.vocab_size = 50_368  # ModernBERT's vocabulary size (the model pads to 50,432)
    return c


def base_model(c):
    """ModernBERT-base's shape on config `c` (an objective's paper config).

    Memory: at 32 x 1024 each layer kept ~2.5 GiB for its backward pass (150.7 GiB for the
    step as XLA's CPU compiler lays it out; an H200 ran out of memory asking for 104.6).
    Keeping only the weight matmuls' outputs and, on the XLA attention path, building the
    scores 256 queries at a time brings the step to 24.8 GiB (MAE-LM's, with its decoder
    keeping everything, 28.7); on an H200, where cuDNN's kernel never builds the scores,
    modern_mlm_base peaked at 14.0 GiB (docs/results.md). Where memory is plentiful,
    `--config.model.remat_policy=none` spares the recomputation.
    """
    c = _modern(c, 22, 768, 12, 1152)
    c.learning_rate = 8e-4
    c.model.remat_policy = "dots_saveable"
    c.model.attention_query_chunk = 256
    return c


def large_model(c):
    """ModernBERT-large's shape; remat and blocks as the large paper configs have them."""
    c = _modern(c, 28, 1024, 16, 2624)
    c.learning_rate = 5e-4
    c.model.remat_policy = "dots_saveable"
    c.model.decoder_remat_policy = "full"
    c.model.attention_query_chunk = 128
    c.model.lm_head_chunk = 32
    return c
