"""Benchmarks that print numbers: training speed and checkpoint saves on this machine.

    python -m maelm_jax.bench speed --configs=default --steps=20
    python -m maelm_jax.bench checkpoint --configs=mae_lm_base

`speed` times the real sharded train step on the local devices (random token ids: content
does not change the work). FLOPs per step by method and region: `python -m maelm_jax.flops`.
"""

import importlib
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from maelm_jax import (
    checkpoint_integrity,
    checkpointing,
    cli,
    metric_logging,
    programs,
    sharding,
    train,
)
from maelm_jax import tokenizer as tokenizer_lib
from maelm_jax.model import count_params
from maelm_jax.tokenizer import BOS_ID, FIRST_REGULAR_ID, Tokenizer

_CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"

flags.DEFINE_list("configs", ["mlm_base", "three_ml_self_base"], "Config modules in configs/.")
flags.DEFINE_integer("batch_size", None, "Global batch; default: each config's own.", lower_bound=1)
flags.DEFINE_integer("seq_len", None, "Sequence length; default: each config's own.", lower_bound=2)
flags.DEFINE_integer("steps", 20, "`speed`: timed steps after the compile step.", lower_bound=1)
flags.register_validator(
    "configs",
    lambda names: all((_CONFIGS_DIR / f"{name}.py").is_file() for name in names),
    message=f"--configs names a config that is not in {_CONFIGS_DIR}",
)
FLAGS = flags.FLAGS


def _config(name: str):
    config = importlib.import_module(f"configs.{name}").get_config()
    if FLAGS.batch_size:
        config.batch_size = FLAGS.batch_size
    if FLAGS.seq_len:
        config.seq_len = FLAGS.seq_len
    return config


def run_speed() -> None:
    for name in FLAGS.configs:
        config = _config(name)
        mesh = sharding.create_mesh(config)
        progs = programs.build(config, mesh, config.vocab_size)
        state = progs.initialize(jax.random.PRNGKey(0))
        rng = np.random.default_rng(0)
        local = config.batch_size // jax.process_count()
        rows = rng.integers(FIRST_REGULAR_ID, config.vocab_size, (local, config.seq_len))
        rows[:, 0] = BOS_ID
        batch = train.global_batch(progs, rows.astype(np.int32))
        with sharding.activate(mesh, progs.rules):
            start = time.perf_counter()
            state, metrics = progs.train_step(state, batch)
            jax.block_until_ready(metrics)
            compile_s = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(FLAGS.steps):
                state, metrics = progs.train_step(state, batch)
            jax.block_until_ready(metrics)
            per_step = (time.perf_counter() - start) / FLAGS.steps
        tokens = config.batch_size * config.seq_len
        print(
            f"{name}: batch {config.batch_size} x {config.seq_len} on {len(mesh.devices.flat)} "
            f"{jax.devices()[0].device_kind} device(s): first step (compile) {compile_s:.1f}s, "
            f"{1 / per_step:.2f} steps/s, {tokens / per_step:,.0f} tokens/s"
        )


def run_checkpoint() -> None:
    """Save time of a state the size of `config`'s: the blocking part (until training could
    go on) and the total (until the step is committed), and its size on disk."""
    for name in FLAGS.configs:
        config = _config(name)
        mesh = sharding.create_mesh(config)
        progs = programs.build(config, mesh, config.vocab_size)
        state = _incompressible(progs.initialize(jax.random.PRNGKey(0)), progs.state_shardings)
        params = count_params(state.params)
        with tempfile.TemporaryDirectory() as workdir:
            tokenizer = _bench_tokenizer()
            checkpointer = checkpointing.Checkpointer(config, workdir, tokenizer)
            checkpoint_integrity.record(state)  # compiled once, as a run's first save does
            start = time.perf_counter()
            checkpoint_integrity.record(state)
            record = time.perf_counter() - start
            start = time.perf_counter()
            checkpointer.save(1, state, {"step": 1}, force=True)
            blocking = time.perf_counter() - start
            checkpointer.wait_until_finished()
            total = time.perf_counter() - start
            step_dir = pathlib.Path(workdir) / checkpointing.CHECKPOINT_DIRNAME / "1"
            size = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
            start = time.perf_counter()
            with sharding.activate(progs.mesh, progs.rules):
                restored, _ = checkpointer.restore_latest(progs.abstract_state())
            restore = time.perf_counter() - start
            start = time.perf_counter()
            checkpoint_integrity.record(restored)
            verify = time.perf_counter() - start
            checkpointer.close()
        print(
            f"{name}: {params:,} params + Adam state, {size / 1e9:.2f} GB on disk: save blocks "
            f"{blocking:.2f}s, committed after {total:.2f}s ({size / 1e6 / total:.0f} MB/s); "
            f"integrity record {record:.2f}s of the blocking save; restore {restore:.2f}s, of "
            f"which verifying the record {verify:.2f}s"
        )


def _incompressible(state, shardings):
    """Random values in every float leaf, in place of a fresh state's zero Adam moments,
    which would compress away and make the save look cheaper than a trained run's."""

    def randomize(state):
        leaves, treedef = jax.tree_util.tree_flatten(state)
        keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
        noisy = [
            jax.random.normal(k, x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
            for k, x in zip(keys, leaves, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, noisy)

    return jax.block_until_ready(jax.jit(randomize, out_shardings=shardings)(state))


def _bench_tokenizer() -> Tokenizer:
    """Any valid tokenizer: a checkpoint carries one, its content does not matter here."""
    text = [f"The quick brown fox jumps over the lazy dog number {i}." for i in range(200)]
    return Tokenizer(tokenizer_lib.train(text, 300))


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
