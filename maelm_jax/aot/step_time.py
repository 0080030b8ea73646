"""XLA's estimate of a train step's time on one TPU chip: the compiler's clock.

`compiled.cost_analysis()["optimal_seconds"]` is XLA's cost model of a program on the chip
it was compiled for: what the TPU compiler optimises against, an estimate and not a
measurement. Like the FLOP count it sums a while loop's body once, and the configured step
is loops (scanned layers, query blocks, LM-head slot blocks, micro-batches). So the estimate
comes from shallow programs with none: the counting variant of the step (`counting_config`:
layers unrolled, no blocks, one micro-batch) at one encoder and one decoder layer, then with
a second encoder layer, then with a second decoder layer. Their differences are one layer's
time, and the step is the one-layer program plus (L - 1) encoder and (D - 1) decoder layers,
times the micro-batches. XLA's cost of an unrolled program is the sum of its instructions',
so where every layer compiles alike this is the deep unrolled program's estimate
(tests/test_aot_step_time.py holds it to that), for two or three small compiles instead of one of
every layer.

Two things the estimate is not. Attention runs on the XLA path in these programs, since the
cost model sees nothing inside a kernel (`counting_config`), so a step that uses splash is
estimated as its XLA twin. And the programs compile at the fastest effort (`FAST`), which
skips memory-space assignment: at training's default effort XLA adds prefetch copies into
on-chip memory and the model charges their bytes, putting mlm_base's step 1.34x higher
(30.2 against 22.6 ms on v5p-8 at batch 64, shallow programs at both efforts) for four times
the compile time. `maelm_jax.flops` compiles at the default effort.
"""

import concurrent.futures
import dataclasses
import time

from maelm_jax.aot.compile_step import (
    FAST,
    NO_WINDOWED_EINSUM,
    compile_step,
    costs,
    counting_config,
    estimated_seconds,
)
from maelm_jax.config import configdict
from maelm_jax.config.run_config import RunConfig

OPTIONS = FAST | NO_WINDOWED_EINSUM  # windowed einsums are loops too


@dataclasses.dataclass(frozen=True)
class StepTime:
    seconds: float  # one optimizer step, on every chip at once
    one_layer_seconds: float  # the program with one encoder (and one decoder) layer
    encoder_layer_seconds: float  # the second encoder layer's: a local one where they alternate
    decoder_layer_seconds: float
    compile_seconds: float
    # The modern backbone's global encoder layers, where they alternate with local ones
    # (layer 0 is global, in the one-layer program); None where every layer is alike.
    global_layer_seconds: float | None = None


def shallow(run: RunConfig, encoder_layers: int, decoder_layers: int) -> RunConfig:
    """`run`'s counting program with this many layers."""
    changes = {"model.num_layers": encoder_layers}
    if run.model.num_decoder_layers:
        changes["model.num_decoder_layers"] = decoder_layers
    return configdict.override(counting_config(run), changes)


class Unavailable(Exception):
    """The compiler gives no estimate for this step; the message says why."""


def _program_seconds(run: RunConfig, devices: list, encoder_layers: int, decoder_layers: int):
    program = shallow(run, encoder_layers, decoder_layers)
    compiled, oom, _, _ = compile_step(program, devices, OPTIONS)
    layers = f"{encoder_layers} + {program.model.num_decoder_layers}-layer program"
    if compiled is None:
        raise Unavailable(f"the {layers} does not fit in HBM ({oom.splitlines()[0]})")
    analysis = costs(compiled)
    value = estimated_seconds(analysis)
    if value is None:
        raise Unavailable(
            f"XLA's cost model gives the {layers} optimal_seconds="
            f"{analysis.get('optimal_seconds')}: no estimate for part of it"
        )
    return value


def _global_every(run: RunConfig) -> int:
    """n where the encoder alternates one global and n - 1 local layers (modern backbone),
    else 0; local layers run in blocks and cost less than global ones."""
    m = run.model
    n = m.global_attention_every_n_layers
    return n if m.modern and n > 1 and m.num_layers > 1 else 0


def estimate(run: RunConfig, devices: list) -> StepTime:
    """The step's estimated time on `devices` (TPU compile-only devices); `Unavailable` where
    the compiler has no cost model of time, a shallow program does not fit, or the model
    has no estimate for part of a program (it then reports a negative time).

    Where the encoder alternates layer kinds (modern backbone, one global then n - 1 local),
    the second layer is a local one, and one more program of 1 + n layers adds a global
    layer: global = T(1 + n) - T(1) - (n - 1) local."""
    if devices[0].platform != "tpu":
        raise Unavailable(f"XLA's {devices[0].platform} compiler has no cost model of time")
    start = time.perf_counter()
    every = _global_every(run)
    shapes = [(1, 1), (2, 1)] + ([(1, 2)] if run.model.num_decoder_layers else [])
    shapes += [(1 + every, 1)] if every else []
    # The TPU backend compiles a program on one core: side by side, the programs take the
    # wall time of one where there are cores for all (a TPU VM host), and no more than in
    # turn where there are not.
    with concurrent.futures.ThreadPoolExecutor(len(shapes)) as pool:
        seconds = list(pool.map(lambda shape: _program_seconds(run, devices, *shape), shapes))
    by_shape = dict(zip(shapes, seconds, strict=True))
    base, encoder = by_shape[(1, 1)], by_shape[(2, 1)] - by_shape[(1, 1)]
    decoder = by_shape[(1, 2)] - base if (1, 2) in by_shape else 0.0
    global_layer = None
    layers = (run.model.num_layers - 1) * encoder
    if every:
        global_layer = by_shape[(1 + every, 1)] - base - (every - 1) * encoder
        num_global = -(-run.model.num_layers // every)  # layers 0, n, 2n, ...
        layers = (num_global - 1) * global_layer + (run.model.num_layers - num_global) * encoder
    layers += max(run.model.num_decoder_layers - 1, 0) * decoder
    return StepTime(
        seconds=(base + layers) * run.loop.grad_accum_steps,
        one_layer_seconds=base,
        encoder_layer_seconds=encoder,
        decoder_layer_seconds=decoder,
        compile_seconds=time.perf_counter() - start,
        global_layer_seconds=global_layer,
    )
