"""The train step lowered and compiled ahead of time for any devices, and what XLA counts in it.

Built through the same `sharding.create_mesh` and `programs.build` that training uses, so
what `maelm_jax.compile` and `maelm_jax.flops` measure is what `main` runs.
"""

import re
import time

import jax

from maelm_jax.config import configdict
from maelm_jax.config.run_config import RunConfig
from maelm_jax.step import programs, sharding

# XLA's lowest effort level for the program's speed, O0 (its EffortLevel enum: 9; training
# compiles at the default). jax 0.10 and 0.11 also took the older float knob,
# `exec_time_optimization_effort=-1`, which jax 0.12 no longer accepts; on jax 0.10.2 with
# libtpu 0.0.42 the two give the same programs (the same memory and time estimate, on a tiny
# and a 4 x 256 step for v5p-8).
FAST = {"optimization_level": 9}
# The counting program's matmuls stay whole; the arithmetic is the same either way.
NO_WINDOWED_EINSUM = {
    "xla_tpu_enable_windowed_einsum_for_all_gather": False,
    "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False,
}


def compile_step(run: RunConfig, devices: list, options: dict | None = None):
    """(Compiled or None, OOM message or None, mesh, seconds to lower and compile)."""
    mesh = sharding.create_mesh(run.mesh, devices=devices)
    progs = programs.build(run, mesh, run.data.vocab_size)
    # Outside the rules context: unboxing there would constrain the abstract leaves.
    args = (progs.abstract_state(), progs.abstract_batch(run.batch_size, run.seq_len))
    start = time.perf_counter()
    with sharding.activate(mesh, progs.rules):
        lowered = progs.train_step.lower(*args)
    try:
        compiled = lowered.compile(compiler_options=options)
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        message = str(e).split(" [type.googleapis.com/")[0].strip()  # drop the raw proto
        return None, message, mesh, time.perf_counter() - start
    return compiled, None, mesh, time.perf_counter() - start


def matmul_loops(hlo: str) -> int:
    """While loops whose body reaches a dot or convolution (through the computations it
    calls): the ones whose single counting matters. XLA also emits loops that only move
    data, e.g. to relayout a large gather; those are left as they are."""
    bodies = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^(?:ENTRY )?%?([\w.-]+) [^\n]*\{\n(.*?)^\}", hlo, re.M | re.S)
    }

    def reaches_matmul(name: str, seen: set) -> bool:
        seen.add(name)
        if re.search(r"\s(?:dot|convolution)\(", bodies.get(name, "")):
            return True
        called = set(re.findall(r"%([\w.-]+)", bodies.get(name, ""))) & bodies.keys()
        return any(reaches_matmul(c, seen) for c in called - seen)

    loops = re.findall(r"\swhile\([^\n]*?body=%?([\w.-]+)", hlo)
    return sum(reaches_matmul(body, set()) for body in loops)


def costs(compiled) -> dict:
    """XLA's cost analysis of a compiled program, per device (a loop body counted once)."""
    analysis = compiled.cost_analysis()
    return analysis[0] if isinstance(analysis, list) else analysis


def xla_flops(compiled) -> float:
    return float(costs(compiled)["flops"])


def estimated_seconds(analysis: dict) -> float | None:
    """XLA's cost-model time of a program on one of its devices (`optimal_seconds`; TPU
    targets only, the CPU compiler has none): what the compiler optimises against, an
    estimate and not a clock."""
    value = analysis.get("optimal_seconds")
    return float(value) if value and value > 0 else None


def counting_config(run: RunConfig) -> RunConfig:
    """The same step with every loop XLA would count once unrolled (layers, query blocks,
    LM-head slot blocks): one micro-batch. `maelm_jax.flops` counts from it too. Attention
    takes the XLA path: XLA counts nothing inside a kernel (splash, cuDNN), neither FLOPs
    nor time, so a kernel's work would vanish from both clocks."""
    return configdict.override(
        run,
        {
            "model.scan_layers": False,
            "model.attention_query_chunk": 0,
            "model.lm_head_chunk": 0,
            "model.attention_impl": "xla",
            "model.attention_dropout_impl": "xla",
            "batch_size": run.batch_size // run.loop.grad_accum_steps,
            "grad_accum_steps": 1,
        },
    )
