"""`analyze`: a config's train step compiled for a TPU slice, judged against its HBM.

The module doc of `maelm_jax.compile` says how effort, FLOPs and the batch search work.
"""

import concurrent.futures

from maelm_jax.aot.compile_step import (
    FAST,
    NO_WINDOWED_EINSUM,
    compile_step,
    counting_config,
    matmul_loops,
    xla_flops,
)
from maelm_jax.aot.max_batch import max_batch
from maelm_jax.aot.memory import memory_of
from maelm_jax.aot.report import Report
from maelm_jax.aot.step_time import Unavailable, estimate
from maelm_jax.aot.topology import topology_devices
from maelm_jax.config.run_config import ConfigError, RunConfig
from maelm_jax.hardware import tpu_chips
from maelm_jax.model import flop_count

FLOPS_MODES = ("analytic", "unrolled", "skip")
EFFORTS = ("fast", "full")
STEP_TIMES = ("estimate", "skip")
# A fast total at this share of HBM or more is confirmed by a full compile: more than twice
# the largest gap measured between the two (6.4%, three_ml_self_large at its largest batch).
CONFIRM_SHARE = 0.85


def _count_flops(run: RunConfig, devices, compiled, mode: str):
    """(FLOPs per device or None, where they come from, seconds spent compiling for them)."""
    if mode == "skip":
        return None, "skipped (--flops=skip)", None
    if mode == "analytic":
        flops = flop_count.step_flops(run, flop_count.num_params(run))
        return flops / len(devices), "analytic model FLOPs (maelm_jax/model/flop_count.py)", None
    if compiled is None:
        return None, "skipped: the step does not compile within HBM", None
    if not matmul_loops(compiled.as_text()):
        return xla_flops(compiled), "the configured program, which has no loops with matmuls", None
    counting, oom, _, seconds = compile_step(counting_config(run), devices, NO_WINDOWED_EINSUM)
    if counting is None:
        return None, f"failed: the unrolled program ran out of memory ({oom})", seconds
    source = "unrolled compile (no layer scan, no windowed einsums, one micro-batch)"
    if loops := matmul_loops(counting.as_text()):
        source += f"; UNDERCOUNT: {loops} loops with matmuls remain, each counted once"
    return xla_flops(counting) * run.loop.grad_accum_steps, source, seconds


def analyze(
    run: RunConfig,
    topology: str,
    num_slices: int = 1,
    flops: str = "analytic",
    hbm_bytes: int | None = None,
    find_max_batch: bool = False,
    effort: str = "fast",
    step_time: str = "estimate",
) -> Report:
    """Compiles `run`'s train step for `num_slices` x `topology` (e.g. "v5p-64").

    `hbm_bytes` replaces the chip's usable HBM in the `fits` verdict (to demand headroom);
    `find_max_batch` adds the largest global batch that fits (more compiles); `effort`: see
    the module doc; `step_time="estimate"` adds XLA's estimate of the step's time
    (`step_time.py`), whose programs compile in threads beside the step's: where the host
    has a core for each (a TPU VM) that costs one program's compile in wall time; on two
    cores, about as long as compiling them in turn (mae_lm_large as shipped on v5p-64: 112 to
    121 s in all, the step's own 44 s).
    """
    if flops not in FLOPS_MODES:
        raise ConfigError(f"flops={flops!r} is not allowed; use one of {FLOPS_MODES}")
    if effort not in EFFORTS:
        raise ConfigError(f"effort={effort!r} is not allowed; use one of {EFFORTS}")
    if step_time not in STEP_TIMES:
        raise ConfigError(f"step_time={step_time!r} is not allowed; use one of {STEP_TIMES}")
    slice_ = tpu_chips.parse(topology)
    devices = topology_devices(slice_, num_slices)
    hbm = hbm_bytes or slice_.chip.usable_hbm_bytes
    fast = FAST if effort == "fast" else None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        timing = pool.submit(estimate, run, devices) if step_time == "estimate" else None
        compiled, oom, mesh, seconds = compile_step(run, devices, fast)
        memory, needed = memory_of(compiled, oom)
        fast_total = None
        if effort == "fast" and (memory is None or memory.total >= CONFIRM_SHARE * hbm):
            fast_total = needed
            compiled, oom, mesh, more = compile_step(run, devices)
            seconds, effort = seconds + more, "full"
            memory, needed = memory_of(compiled, oom)
        estimated, no_estimate = None, None
        try:
            estimated = None if timing is None else timing.result()
        except Unavailable as e:
            no_estimate = str(e)
    fits = compiled is not None and memory.total <= hbm

    per_device, source, flops_seconds = _count_flops(run, devices, compiled, flops)
    # A fast compile is no probe for the edge: the probes are full compiles.
    known = (run.batch_size, fits, needed, memory is not None) if effort == "full" else None
    return Report(
        topology=topology,
        libtpu_topology=slice_.libtpu_name,
        chip=slice_.chip.name,
        num_slices=num_slices,
        num_devices=len(devices),
        mesh_shape=dict(mesh.shape),
        batch_size=run.batch_size,
        seq_len=run.seq_len,
        fits=fits,
        memory=memory,
        memory_per_chip_bytes=needed,
        hbm_per_chip_bytes=hbm,
        compile_seconds=seconds,
        effort=effort,
        fast_memory_per_chip_bytes=fast_total,
        oom_message=oom,
        flops_per_device=per_device,
        flops_per_step=None if per_device is None else per_device * len(devices),
        flops_source=source,
        flops_compile_seconds=flops_seconds,
        peak_flops_per_chip=slice_.chip.peak_bf16_flops,
        model_flops_per_step=flop_count.step_flops(run, flop_count.num_params(run)),
        step_time=estimated,
        step_time_unavailable=no_estimate,
        max_batch=max_batch(run, devices, hbm, known) if find_max_batch else None,
    )
