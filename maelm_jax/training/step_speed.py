"""How fast the real sharded train step runs on the local devices, against this machine's
own matmul rate (`python -m maelm_jax.bench speed`).

Random token ids (content does not change the work). Each round times every config's steps
and then a plain `jnp.dot` of the first config's MLP shape ([batch x seq, hidden] x
[hidden, mlp]) in the same process, so load from elsewhere lands on all of them alike, and
the medians over rounds are reported. "of matmul" is the model's FLOP/s (`flop_count`'s
analytic FLOPs: what the model needs, not what remat recomputes) over that matmul rate:
the share of the step that runs at matmul speed. "MFU" is the same FLOP/s over the device's
published peak (hardware/accelerators.py: H100, H200, A100, L4, TPU v4, v5e, v5p, v6e; none
for a CPU). A compile after the first step counts as a recompile (there should be none).
The devices' peak memory (where the backend reports it) is the process's: run one config
per process to read one config's.
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from maelm_jax.config.run_config import RunConfig
from maelm_jax.data.tokenizer import BOS_ID, FIRST_REGULAR_ID
from maelm_jax.hardware import accelerators
from maelm_jax.model import flop_count
from maelm_jax.step import programs, sharding


class DoesNotFit(Exception):
    """A config's step does not fit in the local devices' memory at the batch asked for; the
    message names the config, its batch and the flags that change it."""


def _out_of_memory(name: str, config: RunConfig, error: Exception) -> DoesNotFit | None:
    """`error` as a DoesNotFit where XLA ran out of memory (each config's own batch is a pod's
    global batch: 8192 x 512 for mlm_base), else None."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    return DoesNotFit(
        f"{name} at batch {config.batch_size} x seq_len {config.seq_len} does not fit in the "
        f"memory of {jax.device_count()} {jax.devices()[0].device_kind} device(s) "
        f"({text.strip().splitlines()[0][:200]}); pass a smaller --batch_size and --seq_len, "
        "e.g. --batch_size=8 --seq_len=128 on a CPU"
    )


class _CompileCounter:
    """Counts XLA compiles: a step that compiles after the first is a recompile. jax times
    the persistent compilation cache's lookup inside the same event, so a program the cache
    serves (pods often set `jax_compilation_cache_dir`) still counts (test_bench)."""

    count = 0

    @classmethod
    def install(cls) -> None:
        def listen(event, duration, **kwargs):
            del duration, kwargs
            if event == "/jax/core/compile/backend_compile_duration":
                cls.count += 1

        jax.monitoring.register_event_duration_secs_listener(listen)


class Timed:
    """One config's train step, compiled, with its state and a batch."""

    def __init__(self, name: str, config: RunConfig):
        self.name = name
        self.config = config
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
        self.batch = self.progs.global_batch(rows.astype(np.int32))
        self.flops = flop_count.step_flops(config, flop_count.num_params(config))
        try:
            self.compile_s = self.run(1)
        except jax.errors.JaxRuntimeError as e:
            raise _out_of_memory(name, config, e) or e from None
        logging.info("%s: compiled and ran one step in %.1f s", name, self.compile_s)
        self.seconds = []  # per round, for `steps` steps

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


def measure(runs: dict[str, RunConfig], steps: int, rounds: int) -> dict:
    """Times `steps` steps of each run per round, `rounds` times, beside the matmul of the
    first run's MLP shape; {"configs": one row per run, "matmul": its rate, ...}."""
    _CompileCounter.install()
    timed = [Timed(name, run) for name, run in runs.items()]
    first = timed[0]
    matmul_dtype = first.dtype
    matmul = _Matmul(first.config, matmul_dtype, first.mesh)
    compiles_before = _CompileCounter.count
    for r in range(rounds):
        for t in timed:
            t.seconds.append(t.run(steps))
            logging.info("round %d: %s %.1f ms/step", r, t.name, 1e3 * t.seconds[-1] / steps)
        matmul.round()
    recompiles = _CompileCounter.count - compiles_before
    device_kind = jax.devices()[0].device_kind
    rows = []
    for t in timed:
        step_s = [s / steps for s in t.seconds]
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
                "mfu": mfu(
                    statistics.median(rates), device_kind, t.dtype, len(t.mesh.devices.flat)
                ),
                "flops_per_step": t.flops,
                "flops_vs_first": t.flops / first.flops,
                "step_time_vs_first": statistics.median(
                    a / b for a, b in zip(t.seconds, first.seconds, strict=True)
                ),
            }
        )
    return {
        "batch_size": first.config.batch_size,
        "seq_len": first.config.seq_len,
        "devices": len(first.mesh.devices.flat),
        "device_kind": device_kind,
        "device_peak_gib": _peak_memory_gib(),
        "rounds": rounds,
        "steps_per_round": steps,
        "matmul": {
            "shape": list(matmul.shape),
            "dtype": matmul_dtype,
            "tflops_per_sec": statistics.median(matmul.rates) / 1e12,
        },
        "recompiles": recompiles,
        "configs": rows,
    }


def mfu(flops_per_sec: float, device_kind: str, dtype: str, devices: int) -> float | None:
    """Model FLOP/s over `devices` devices' published peak in `dtype`; None where the table
    has no such device (CPUs)."""
    peak = accelerators.peak_flops(device_kind, dtype)
    return None if peak is None else flops_per_sec / (peak * devices)


def _peak_memory_gib() -> float | None:
    """The largest peak of bytes in use over the local devices since the process started;
    None where the backend keeps no such count (the CPU)."""
    stats = [d.memory_stats() for d in jax.local_devices()]
    peaks = [s.get("peak_bytes_in_use") for s in stats if s]
    return max(peaks) / 2**30 if peaks and None not in peaks else None


def format_result(result: dict) -> str:
    m, e, f = result["matmul"]["shape"]
    lines = [
        f"bench speed: {result['devices']} {result['device_kind']} device(s), batch "
        f"{result['batch_size']} x {result['seq_len']}; {result['rounds']} rounds of "
        f"{result['steps_per_round']} steps per config, each round then the matmul; medians",
        f"matmul: jnp.dot [{m}, {e}] x [{e}, {f}] {result['matmul']['dtype']}: "
        f"{result['matmul']['tflops_per_sec']:.4g} TFLOP/s",
        f"FLOPs and time ratios are to {result['configs'][0]['config']}; MFU against the "
        "device's published peak (- where unknown)",
        f"{'config':<22}{'dtype':>9}{'compile s':>10}{'steps/s':>9}{'tokens/s':>10}"
        f"{'model TFLOP/s':>15}{'of matmul':>11}{'MFU':>7}{'FLOPs ratio':>13}{'time ratio':>12}",
    ]
    for r in result["configs"]:
        mfu_text = "-" if r["mfu"] is None else f"{r['mfu']:.3f}"
        lines.append(
            f"{r['config']:<22}{r['dtype']:>9}{r['compile_s']:>10.1f}{r['steps_per_sec']:>9.3f}"
            f"{r['tokens_per_sec']:>10,.0f}{r['model_tflops_per_sec']:>15.4g}"
            f"{r['of_matmul']:>11.3f}{mfu_text:>7}{r['flops_vs_first']:>13.3f}"
            f"{r['step_time_vs_first']:>12.3f}"
        )
    lines.append(f"recompiles after the first step: {result['recompiles']}")
    if result.get("device_peak_gib") is not None:
        lines.append(f"device memory, peak of the process: {result['device_peak_gib']:.2f} GiB")
    return "\n".join(lines)
