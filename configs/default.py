"""The embedded default: a tiny MAE-LM on the Python-docs corpus, visibly learning on a CPU.

No download: the corpus is built from the running Python's own documentation text.

Chosen so the eval loss ends well below `eval/unigram_loss` (the best a context-free model
could score) within minutes on a 2-core CPU: a 1024-piece vocabulary splits most words into
pieces that their neighbours predict, and the relative position bias (official MAE-LM's)
gives attention a direct, learnable notion of "nearby" that absolute position embeddings
only learn slowly. Eval is 4 batches, so it costs little.
"""

from configs import base


def get_config():
    c = base.get_config()
    c.objective = "mae_lm"
    c.mask_rate = 0.15
    c.seq_len = 128
    c.batch_size = 16
    c.num_train_steps = 600
    c.model.num_layers = 4
    c.model.hidden_size = 256
    c.model.num_heads = 4
    c.model.mlp_dim = 512
    c.model.num_decoder_layers = 2
    c.model.max_positions = 128
    c.model.relative_attention_buckets = 32
    c.model.relative_attention_max_distance = 128
    c.model.dtype = "float32"
    c.learning_rate = 1e-3
    c.warmup_steps = 50
    c.max_grad_norm = 1.0
    c.dataset = "python_docs"
    c.eval_holdout_fraction = 0.05
    c.vocab_size = 1024
    c.tokenizer_train_documents = 20_000
    c.eval_every_steps = 100
    c.eval_batches = 4
    c.log_every_steps = 50
    c.checkpoint_every_steps = 200
    c.keep_every_steps = 0
    return c
