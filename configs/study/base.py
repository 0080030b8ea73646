"""The study scale: the four objectives on one encoder a 2-core CPU pretrains in minutes.

The demo's encoder (configs/default.py: 4 x 256, seq 128, 1024 pieces), with what a
comparison needs held equal: every objective gets the same encoder, the same relative bias,
steps, batch and data order, and a one-layer decoder where it has one.
The corpus is the study's own (`study:task_text`, maelm_jax/studies/task_text.py): the
unlabeled train text of the study's tasks, about 1M words for CoLA, SST-2, RTE and STS-B. On
the demo's Python-docs corpus the default's export matched random init on STS-B after 150
fine-tuning steps (docs/results.md). 800 steps of 8 x 128 read 0.8M of the task text's 2.2M
tokens: with 100 fine-tuning steps at lr 1e-3 (study.py's defaults) the four objectives and
the random-init row run in 73 minutes on this 2-core CPU, the issue's budget of 75.
`python -m maelm_jax.study` reads the four files beside this one.
"""

from configs import default
from maelm_jax.config.run_config import STUDY_TASK_TEXT


def get_config():
    c = default.get_config()
    c.dataset = STUDY_TASK_TEXT
    c.model.num_decoder_layers = 1
    c.num_train_steps = 800
    c.eval_every_steps = 400
    c.checkpoint_every_steps = 800
    return c
