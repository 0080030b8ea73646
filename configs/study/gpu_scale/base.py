"""The study at a GPU's scale (`python -m maelm_jax.study --preset=gpu`): the CPU study's
objectives on a 6 x 512 encoder, 3000 steps of 128 x 128 on the study's own corpus.

At the CPU study's 4 x 128 and 2.9M tokens the encoders learned nothing GLUE rewards. This
scale is the one measured on one H200 on 2026-11-28 (issue #63; docs/evaluation.md): 49M
tokens, about 35 passes over the 1.41M tokens of task text, in 82 s (MLM) and 99 s (MAE-LM)
with compile, and both pretrained rows 3.4 and 4.9 points above random init (one seed).
bfloat16 because the GPU's matmuls and cuDNN's fused attention want it; dropout and attention
dropout 0.1, RoBERTa's, for a run that reads its text about 35 times; the vocabulary (8192
pieces) and the decoders (2 layers, 3ML's; MAE-LM's paper has 4) as in that run.

Each objective's file is the CPU study's file passed through `at_gpu_scale`, so an
objective is defined once, in configs/study/, and these are exactly what ran: the CPU
study's configs with the `--overrides` of that run.
"""

from configs.study import base


def at_gpu_scale(c):
    m = c.model
    m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim = 6, 512, 8, 2048
    m.num_decoder_layers = 2
    m.dtype = "bfloat16"
    m.dropout_rate = 0.1
    m.attention_dropout_rate = 0.1
    c.vocab_size = 8192
    c.batch_size = 128  # x seq 128 (the CPU study's)
    c.num_train_steps = 3000
    c.learning_rate = 5e-4
    c.warmup_steps = 300
    c.eval_every_steps = 1000
    c.checkpoint_every_steps = 3000
    c.log_every_steps = 500
    return c


def get_config():
    return at_gpu_scale(base.get_config())
