"""Tiny versions of the real configs, for tests that must run in seconds on a CPU."""

import os
import pathlib
import subprocess
import sys

import ml_collections

from configs import default
from maelm_jax.config import configdict
from maelm_jax.step import programs

VOCAB = 300
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def tiny_config(objective="mae_lm", decoder="self", seq_len=32, **model_overrides):
    c = default.get_config()
    c.objective = objective
    c.mask_rate = 0.25
    c.seq_len = seq_len
    c.batch_size = 8
    c.vocab_size = VOCAB
    c.model.decoder = decoder
    c.model.num_layers = 2
    c.model.num_decoder_layers = 1
    c.model.hidden_size = 32
    c.model.num_heads = 4
    c.model.mlp_dim = 64
    c.model.max_positions = seq_len
    c.model.dropout_rate = 0.1
    c.model.attention_dropout_rate = 0.1  # the paper configs' value; the demo runs without
    c.model.relative_attention_buckets = 0  # the default's bias is for its demo, not tests
    c.model.relative_attention_init_slope = 0.0
    c.model.relative_attention_init_cap = 0.0
    c.model.decoder_relative_attention = False
    c.model.decoder_relative_attention_init_slope = 0.0
    for key, value in model_overrides.items():
        c.model[key] = value
    return c


def frozen(c, vocab=VOCAB):
    """(ModelConfig, MaskingConfig) for a tiny config with the project's special ids, as
    training builds them."""
    model, masking = programs.model_and_masking(configdict.freeze(c), vocab)
    return model.config, masking


def tiny_run_config(dataset: str, /, **overrides):
    """A whole run in seconds: the tiny MAE-LM on `dataset`, logging every step."""
    c = tiny_config()
    c.dataset = dataset
    c.mask_rate = 0.2
    c.num_train_steps = 24
    c.learning_rate = 3e-3
    c.warmup_steps = 4
    c.log_every_steps = 1
    c.eval_every_steps = 12
    c.eval_batches = 1
    c.eval_holdout_fraction = 0.1
    c.checkpoint_every_steps = 8
    c.tokenizer_train_documents = 1000
    for key, value in overrides.items():
        target = c
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return c


def run_flags(c, base=None, prefix="--config.") -> list[str]:
    """`--config.a.b=value` flags that turn configs/default.py into config `c`, at any depth."""
    base = default.get_config() if base is None else base
    flags = []
    for key, value in c.items():
        if isinstance(value, ml_collections.ConfigDict):
            flags += run_flags(value, base[key], f"{prefix}{key}.")
        elif base[key] != value:
            flags.append(f"{prefix}{key}={value}")
    return flags


def run_command_on_tiny(module: str, directory, model: dict, *args, env=None, timeout=300):
    """`python -m <module> --config=<file>` as a user runs it, the file a `tiny_config` with
    `model` written into `directory`; `args` appended, this session's environment updated
    with `env`."""
    config = pathlib.Path(directory) / "tiny.py"
    config.write_text(
        "from tiny_configs import tiny_config\n\n\n"
        f"def get_config():\n    return tiny_config(**{model!r})\n"
    )
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])
    return subprocess.run(
        [sys.executable, "-m", module, f"--config={config}", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def printed_by_fresh_python(code: str) -> list[str]:
    """The words `python -c code` prints in a new process (the repo and tests/ importable):
    what a module loads is only visible in a process that has loaded nothing else."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()
