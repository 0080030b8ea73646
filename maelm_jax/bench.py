"""Benchmarks that print numbers: training speed and checkpoint saves on this machine.

    python -m maelm_jax.bench speed --configs=mlm_base,three_ml_self_base --seq_len=128 \
        --batch_size=8 [--rounds=8 --steps=5] [--dtype=float32] [--json]
    python -m maelm_jax.bench checkpoint --configs=mae_lm_base

`speed`: the real sharded train step against this machine's matmul rate
(`maelm_jax/training/step_speed.py`); `checkpoint`: a save and a restore of a state the
size of the config's (`maelm_jax/checkpoints/save_speed.py`). FLOPs per step by method and
region: `python -m maelm_jax.flops`.
"""

import importlib
import json
import pathlib

import jax
from absl import app, flags

from maelm_jax import cli, configuration
from maelm_jax.checkpoints import save_speed
from maelm_jax.run_config import RunConfig
from maelm_jax.training import metric_logging, step_speed

_CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"

flags.DEFINE_list("configs", ["mlm_base", "three_ml_self_base"], "Config modules in configs/.")
flags.DEFINE_integer("batch_size", None, "Global batch; default: each config's own.", lower_bound=1)
flags.DEFINE_integer("seq_len", None, "Sequence length; default: each config's own.", lower_bound=2)
flags.DEFINE_integer("steps", 5, "`speed`: timed steps per config and round.", lower_bound=1)
flags.DEFINE_integer(
    "rounds", 8, "`speed`: rounds, each timing every config in turn.", lower_bound=1
)
flags.DEFINE_enum(
    "dtype",
    None,
    ["float32", "bfloat16"],
    "`speed`: compute dtype; default: float32 on CPU (which emulates bf16 matmuls), else "
    "each config's own.",
)
flags.DEFINE_boolean("json", False, "`speed`: print one JSON object instead of the table.")
flags.register_validator(
    "configs",
    lambda names: all((_CONFIGS_DIR / f"{name}.py").is_file() for name in names),
    message=f"--configs names a config that is not in {_CONFIGS_DIR}",
)
FLAGS = flags.FLAGS


def _config(name: str, dtype: str | None = None) -> RunConfig:
    """configs/`name`.py with the command's --batch_size, --seq_len and `dtype`, frozen."""
    config = importlib.import_module(f"configs.{name}").get_config()
    if FLAGS.batch_size:
        config.batch_size = FLAGS.batch_size
    if FLAGS.seq_len:
        config.seq_len = FLAGS.seq_len
    if dtype:
        config.model.dtype = dtype
    return configuration.freeze(config)


def _speed_dtype() -> str | None:
    if FLAGS.dtype:
        return FLAGS.dtype
    return "float32" if jax.default_backend() == "cpu" else None


def run_speed() -> None:
    dtype = _speed_dtype()
    runs = {name: _config(name, dtype) for name in FLAGS.configs}
    result = step_speed.measure(runs, FLAGS.steps, FLAGS.rounds)
    print(json.dumps(result) if FLAGS.json else step_speed.format_result(result))


def run_checkpoint() -> None:
    for name in FLAGS.configs:
        print(save_speed.format_result(name, save_speed.measure(_config(name))))


def main(argv):
    metric_logging.quiet_library_logs()
    commands = {"speed": run_speed, "checkpoint": run_checkpoint}
    if len(argv) != 2 or argv[1] not in commands:
        raise app.UsageError(
            f"usage: python -m maelm_jax.bench {{{'|'.join(commands)}}} [flags] "
            "(FLOPs per step: python -m maelm_jax.flops --config=...)"
        )
    commands[argv[1]]()


if __name__ == "__main__":
    cli.run(main, prog="maelm_jax.bench")
