"""The STS-B regression path can learn a pair task that bag-of-pieces overlap solves, at a
generous budget (init_std 0.1, lr 3e-3, 1500 steps, one seed), not at the study's settings.

At the CPU study's scale every row's STS-B cross-encoder predicts the labels' mean (docs/
results.md, "STS-B at the study's scale, understood"). This holds the other half of that
finding: the project's fine-tuning (`finetuning/training.py`'s `fine_tune`, the export loaded by
`glue/classifier.py` as the study's random-init row loads it, MSE on the `<s>` head, scored
by `glue/metrics.py`) does learn regression on sentence pairs when the budget lets it. The
task: two sentences of six distinct words each, scored 5 x (the share of the first's words
the second repeats), so a bag-of-words overlap scores Spearman 1.0 and the mean scores 0.

A cross-encoder from random init has to learn to match equal tokens across the two sentences
before its score moves off the mean; on this CPU (2026-11-28) the study's 4 x 128 encoder did
not, in 100 to 400 steps at lr 1e-4 to 3e-3, nor with labels scaled to 0-1 or dropout 0.
The budget here (this 2 x 64 encoder, 1500 steps, lr 3e-3, initializer_range 0.1, dropout 0)
passed that point on every seed tried: dev Spearman 0.82 to 0.86 over seeds 1-5 (final train
loss 0.35 to 0.63, the labels' variance 2.9), 19 s a run on one free core. With RoBERTa's
initializer_range 0.02 the same budget scored 0.21, 0.51 and -0.04 (seeds 1-3): the escape
from the mean depends on the seed there, so the test does not use it.
"""

import json
import shutil
import types

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from maelm_jax.finetuning import training
from maelm_jax.glue import classifier, tasks
from maelm_jax.hf import convert as hf_convert
from maelm_jax.hf import export, modeling

torch.set_num_threads(1)  # a toy model runs faster on one thread; the suite shares two cores

WORDS = 55  # distinct words; id 5 + i is word i (ids 0-4: <s>, <pad>, </s>, <unk>, <mask>)
PER_SENTENCE = 6
BOS, PAD, EOS = 0, 1, 2
SPEC = training.RunSpec(
    task="stsb", init="random", learning_rate=3e-3, batch_size=32, seed=1, epochs=100.0,
    max_steps=1500, warmup_ratio=0.06, weight_decay=0.1, dropout=0.0, attention_dropout=0.0,
    max_seq_length=64, max_train_examples=0,
)  # fmt: skip


def overlap_pairs(n: int, seed: int) -> training.Encoded:
    """`<s> A </s></s> B </s>` rows: A six distinct words, B k of them (k uniform in 0..6,
    shuffled) and 6 - k others; the label 5k / 6."""
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for _ in range(n):
        a = rng.choice(WORDS, PER_SENTENCE, replace=False)
        k = int(rng.integers(0, PER_SENTENCE + 1))
        others = np.setdiff1d(np.arange(WORDS), a)
        b = np.concatenate(
            [rng.choice(a, k, replace=False), rng.choice(others, PER_SENTENCE - k, replace=False)]
        )
        rng.shuffle(b)
        rows.append(np.concatenate([[BOS], a + 5, [EOS, EOS], b + 5, [EOS]]).astype(np.int64))
        labels.append(5.0 * k / PER_SENTENCE)
    return training.Encoded(rows, np.asarray(labels))


@pytest.fixture(scope="module")
def random_export(tmp_path_factory):
    """A 2 x 64 encoder with the study's relative bias as `export` writes it (config.json
    from `hf_config`, the shipped modeling code, float32 weights); the weights are never read,
    since the random-init row builds the architecture fresh from config.json."""
    from transformers import AutoConfig, AutoModel

    out = tmp_path_factory.mktemp("random_export")
    model = dict(
        hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128, max_positions=64,
        dropout_rate=0.0, attention_dropout_rate=0.0, init_std=0.1, layer_norm_epsilon=1e-5,
        relative_attention_buckets=16, relative_attention_max_distance=16,
    )  # fmt: skip
    config = hf_convert.hf_config(types.SimpleNamespace(**model), 5 + WORDS, with_lm_head=False)
    (out / "config.json").write_text(json.dumps(config))
    shutil.copyfile(modeling.__file__, out / export.MODELING_FILE)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(out, trust_remote_code=True)
    encoder = AutoModel.from_config(config, trust_remote_code=True)
    save_file({k: v.contiguous() for k, v in encoder.state_dict().items()},
              out / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    return str(out)


def test_the_regression_path_can_learn_pair_overlap_at_a_generous_budget(random_export):
    """Shows the path (fine_tune, the MSE head, the correlations) learns when the budget lets
    it. The study's own settings do not get there (the module's docstring), so this is no
    test of them."""
    train, dev = overlap_pairs(4000, 0), overlap_pairs(500, 1)
    task = tasks.TASKS["stsb"]
    assert classifier.needs_remote_code(random_export)  # the study's class, relative bias

    def model():
        return classifier.classifier(random_export, 1, "random", SPEC.dropout, 0.0)

    result = training.fine_tune(model, task, train, {"dev": dev}, SPEC, PAD, torch.device("cpu"))
    got = result.metrics["dev"]
    variance = float(np.var(train.labels))  # the mean predictor's MSE, about 2.9
    # The mean scores 0; the runs this was sized on scored 0.82 to 0.86 (module docstring).
    assert got["spearman"] > 0.5 and got["pearson"] > 0.5, (got, result.final_train_loss)
    assert result.final_train_loss < 0.5 * variance, (result.final_train_loss, variance)
    assert result.steps == SPEC.max_steps
