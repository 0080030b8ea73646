"""Benchmarks that print numbers: training speed and checkpoint saves on this machine.

    python -m maelm_jax.bench speed --configs=mlm_base,three_ml_self_base --seq_len=128 \
        --batch_size=8 [--rounds=8 --steps=5] [--dtype=float32] [--json]
    python -m maelm_jax.bench checkpoint --configs=mae_lm_base

`speed` times the real sharded train step on the local devices (random token ids: content
does not change the work) against what this machine's matmuls reach in the same process:
each round times every config's steps and then a plain `jnp.dot` of the first config's MLP
shape ([batch x seq, hidden] x [hidden, mlp]), so load from elsewhere lands on all of them
alike, and the medians over rounds are reported. "of matmul" is the model's FLOP/s
(`flop_count`'s analytic FLOPs: what the model needs, not what remat recomputes) over that
matmul rate: the share of the step that runs at matmul speed. A compile after the first
step counts as a recompile (there should be none). FLOPs per step by method and region:
`python -m maelm_jax.flops`.
"""

import importlib
import json
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from maelm_jax import cli, configuration
from maelm_jax.checkpoints import checkpointing, manifest
from maelm_jax.checkpoints import integrity as checkpoint_integrity
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.tokenizer import BOS_ID, FIRST_REGULAR_ID, Tokenizer
from maelm_jax.model import flop_count
from maelm_jax.model.masked_lm import count_params
from maelm_jax.run_config import RunConfig
from maelm_jax.training import metric_logging, programs, sharding, train

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


class _CompileCounter:
    """Counts XLA compiles: a step that compiles after the first is a recompile."""

    count = 0

    @classmethod
    def install(cls) -> None:
        def listen(event, duration, **kwargs):
            del duration, kwargs
            if event == "/jax/core/compile/backend_compile_duration":
                cls.count += 1

        jax.monitoring.register_event_duration_secs_listener(listen)


def _speed_dtype() -> str | None:
    if FLAGS.dtype:
        return FLAGS.dtype
    return "float32" if jax.default_backend() == "cpu" else None


class _Timed:
    """One config's train step, compiled, with its state and a batch."""

    def __init__(self, name: str, dtype: str | None):
        self.name = name
        self.config = config = _config(name, dtype)
        self.dtype = jnp.dtype(config.model.dtype).name
        self.mesh = sharding.create_mesh(config.mesh)
        self.progs = programs.build(config, self.mesh, config.data.vocab_size)
        self.state = self.progs.initialize(jax.random.PRNGKey(0))
        rows = np.random.default_rng(0).integers(
            FIRST_REGULAR_ID,
            config.data.vocab_size,
            (config.batch_size // jax.process_count(), config.seq_len),
        )
        rows[:, 0] = BOS_ID
        self.batch = train.global_batch(self.progs, rows.astype(np.int32))
        self.flops = flop_count.step_flops(config, flop_count.num_params(config))
        self.compile_s = self.run(1)
        self.seconds = []  # per round, for FLAGS.steps steps

    def run(self, steps: int) -> float:
        with sharding.activate(self.mesh, self.progs.rules):
            start = time.perf_counter()
            for _ in range(steps):
                self.state, metrics = self.progs.train_step(self.state, self.batch)
            jax.block_until_ready(metrics)
        return time.perf_counter() - start


class _Matmul:
    """`jnp.dot` at the config's MLP shape, rows sharded like the batch: the reference rate."""

    def __init__(self, config: RunConfig, dtype: str, mesh):
        self.shape = (
            config.batch_size * config.seq_len,
            config.model.hidden_size,
            config.model.mlp_dim,
        )
        m, e, f = self.shape
        rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names))
        keys = jax.random.split(jax.random.PRNGKey(0))
        self.x = jax.device_put(jax.random.normal(keys[0], (m, e), dtype), rows)
        self.w = jax.random.normal(keys[1], (e, f), dtype)
        self.dot = jax.jit(jnp.dot)
        self.flops = 2 * m * e * f
        jax.block_until_ready(self.dot(self.x, self.w))
        start = time.perf_counter()
        jax.block_until_ready(self.dot(self.x, self.w))
        self.reps = max(1, round(0.5 / (time.perf_counter() - start)))  # ~0.5 s a round
        self.rates = []

    def round(self) -> None:
        start = time.perf_counter()
        for _ in range(self.reps):
            out = self.dot(self.x, self.w)
        jax.block_until_ready(out)
        self.rates.append(self.reps * self.flops / (time.perf_counter() - start))


def run_speed() -> None:
    dtype = _speed_dtype()
    _CompileCounter.install()
    timed = [_Timed(name, dtype) for name in FLAGS.configs]
    first = timed[0]
    matmul_dtype = dtype or first.dtype
    matmul = _Matmul(first.config, matmul_dtype, first.mesh)
    compiles_before = _CompileCounter.count
    for _ in range(FLAGS.rounds):
        for t in timed:
            t.seconds.append(t.run(FLAGS.steps))
        matmul.round()
    recompiles = _CompileCounter.count - compiles_before
    rows = []
    for t in timed:
        step_s = [s / FLAGS.steps for s in t.seconds]
        rates = [t.flops / s for s in step_s]
        tokens = t.config.batch_size * t.config.seq_len
        rows.append(
            {
                "config": t.name,
                "dtype": t.dtype,
                "compile_s": t.compile_s,
                "steps_per_sec": statistics.median(1 / s for s in step_s),
                "tokens_per_sec": statistics.median(tokens / s for s in step_s),
                "model_tflops_per_sec": statistics.median(rates) / 1e12,
                "of_matmul": statistics.median(
                    r / m for r, m in zip(rates, matmul.rates, strict=True)
                ),
                "flops_per_step": t.flops,
                "flops_vs_first": t.flops / first.flops,
                "step_time_vs_first": statistics.median(
                    a / b for a, b in zip(t.seconds, first.seconds, strict=True)
                ),
            }
        )
    result = {
        "batch_size": first.config.batch_size,
        "seq_len": first.config.seq_len,
        "devices": len(first.mesh.devices.flat),
        "device_kind": jax.devices()[0].device_kind,
        "rounds": FLAGS.rounds,
        "steps_per_round": FLAGS.steps,
        "matmul": {
            "shape": list(matmul.shape),
            "dtype": matmul_dtype,
            "tflops_per_sec": statistics.median(matmul.rates) / 1e12,
        },
        "recompiles": recompiles,
        "configs": rows,
    }
    if FLAGS.json:
        print(json.dumps(result))
        return
    print(_speed_table(result))


def _speed_table(result: dict) -> str:
    m, e, f = result["matmul"]["shape"]
    lines = [
        f"bench speed: {result['devices']} {result['device_kind']} device(s), batch "
        f"{result['batch_size']} x {result['seq_len']}; {result['rounds']} rounds of "
        f"{result['steps_per_round']} steps per config, each round then the matmul; medians",
        f"matmul: jnp.dot [{m}, {e}] x [{e}, {f}] {result['matmul']['dtype']}: "
        f"{result['matmul']['tflops_per_sec']:.4g} TFLOP/s",
        f"FLOPs and time ratios are to {result['configs'][0]['config']}",
        f"{'config':<22}{'dtype':>9}{'compile s':>10}{'steps/s':>9}{'tokens/s':>10}"
        f"{'model TFLOP/s':>15}{'of matmul':>11}{'FLOPs ratio':>13}{'time ratio':>12}",
    ]
    for r in result["configs"]:
        lines.append(
            f"{r['config']:<22}{r['dtype']:>9}{r['compile_s']:>10.1f}{r['steps_per_sec']:>9.3f}"
            f"{r['tokens_per_sec']:>10,.0f}{r['model_tflops_per_sec']:>15.4g}"
            f"{r['of_matmul']:>11.3f}{r['flops_vs_first']:>13.3f}{r['step_time_vs_first']:>12.3f}"
        )
    lines.append(f"recompiles after the first step: {result['recompiles']}")
    return "\n".join(lines)


def run_checkpoint() -> None:
    """Save time of a state the size of `config`'s: the blocking part (until training could
    go on) and the total (until the step is committed), and its size on disk."""
    for name in FLAGS.configs:
        config = _config(name)
        mesh = sharding.create_mesh(config.mesh)
        progs = programs.build(config, mesh, config.data.vocab_size)
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
            step_dir = pathlib.Path(workdir) / manifest.CHECKPOINT_DIRNAME / "1"
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
