"""The study scale: the four objectives on one encoder a 2-core CPU pretrains in minutes.

The demo's encoder and corpus (configs/default.py: 4 x 256, seq 128, the Python-docs corpus,
1024 pieces), with what a comparison needs held equal: every objective gets the same encoder,
the same relative bias, steps, batch and data order, and a one-layer decoder where it has one.
`python -m maelm_jax.study` reads the four files beside this one.
"""

from configs import default


def get_config():
    c = default.get_config()
    c.model.num_decoder_layers = 1
    c.num_train_steps = 1600
    c.eval_every_steps = 400
    c.checkpoint_every_steps = 800
    return c
