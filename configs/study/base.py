"""The study scale: the four objectives on one encoder a 2-core CPU pretrains in minutes.

The demo's recipe (configs/default.py: 4 layers, seq 128, 1024 pieces, local relative
biases) at half its width, with what a comparison needs held equal: every objective gets the
same encoder, the same relative bias, steps, batch and data order, and a one-layer decoder
where it has one. The corpus is the study's own (`study:task_text`,
maelm_jax/studies/task_text.py): the unlabeled train text of the study's tasks, about 1M
words for CoLA, SST-2, RTE and STS-B.
Why 4 x 128 at batch 16 and lr 1e-3 for 1400 steps (2.9M tokens, 1.3 passes over the text):
the study's first budget, 4 x 256 at batch 8 and lr 5e-4 for 800 steps (0.8M tokens), left
MLM at eval loss 4.70 and every row, random init included, at chance. Half the width runs
2.5 times the tokens per second: 3.5 times the text for 1.3 to 1.5 times the pretraining
time, and MLM ends at 3.92 (unigram 5.55); fine-tuning runs twice as fast. With 100
fine-tuning steps at lr 1e-3 (study.py's defaults) the four objectives and the random-init
row took 59 minutes on this 2-core CPU, the issue's budget being 75, and 39 after issue #63's
fine-tuning loop (docs/results.md, "The study at 4 x 128 after issue #63's loop").
`python -m maelm_jax.study` reads the four files beside this one.
"""

from configs import default
from maelm_jax.config.run_config import STUDY_TASK_TEXT


def get_config():
    c = default.get_config()
    c.dataset = STUDY_TASK_TEXT
    c.model.hidden_size = 128
    c.model.num_heads = 2
    c.model.mlp_dim = 512
    c.model.num_decoder_layers = 1
    c.batch_size = 16
    c.learning_rate = 1e-3
    c.num_train_steps = 1400
    c.eval_every_steps = 700
    c.checkpoint_every_steps = 1400
    return c
