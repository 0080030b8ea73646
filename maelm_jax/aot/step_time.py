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
(tests/test_compile.py holds it to that), for two or three small compiles instead of one of
every layer.
"""

import dataclasses
import time

from maelm_jax import configuration
from maelm_jax.aot.compile_step import (
    FAST,
    NO_WINDOWED_EINSUM,
    compile_step,
    costs,
    counting_config,
    estimated_seconds,
)
from maelm_jax.run_config import RunConfig

OPTIONS = FAST | NO_WINDOWED_EINSUM  # windowed einsums are loops too


@dataclasses.dataclass(frozen=True)
class StepTime:
    seconds: float  # one optimizer step, on every chip at once
    one_layer_seconds: float  # the program with one encoder (and one decoder) layer
    encoder_layer_seconds: float
    decoder_layer_seconds: float
    compile_seconds: float


def shallow(run: RunConfig, encoder_layers: int, decoder_layers: int) -> RunConfig:
    """`run`'s counting program with this many layers."""
    changes = {"model.num_layers": encoder_layers}
    if run.model.num_decoder_layers:
        changes["model.num_decoder_layers"] = decoder_layers
    return configuration.override(counting_config(run), changes)


class Unavailable(Exception):
    """The compiler gives no estimate for this step; the message says why."""


def estimate(run: RunConfig, devices: list) -> StepTime:
    """The step's estimated time on `devices` (TPU compile-only devices); `Unavailable` where
    the compiler has no cost model of time, a shallow program does not fit, or the model
    has no estimate for part of a program (it then reports a negative time)."""
    if devices[0].platform != "tpu":
        raise Unavailable(f"XLA's {devices[0].platform} compiler has no cost model of time")
    start = time.perf_counter()
    shapes = [(1, 1), (2, 1)] + ([(1, 2)] if run.model.num_decoder_layers else [])
    seconds = []
    for encoder_layers, decoder_layers in shapes:
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
        seconds.append(value)
    base, encoder = seconds[0], seconds[1] - seconds[0]
    decoder = seconds[2] - seconds[0] if len(seconds) == 3 else 0.0
    layers = (run.model.num_layers - 1) * encoder
    layers += max(run.model.num_decoder_layers - 1, 0) * decoder
    return StepTime(
        seconds=(base + layers) * run.loop.grad_accum_steps,
        one_layer_seconds=base,
        encoder_layer_seconds=encoder,
        decoder_layer_seconds=decoder,
        compile_seconds=time.perf_counter() - start,
    )
