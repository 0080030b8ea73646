"""What `maelm_jax.compile` found: the `Report`, as JSON for machines and a table for people."""

import dataclasses

from maelm_jax.aot.max_batch import MaxBatch
from maelm_jax.aot.memory import Memory, oom_summary
from maelm_jax.aot.step_time import StepTime


@dataclasses.dataclass(frozen=True)
class Report:
    topology: str
    libtpu_topology: str
    chip: str
    num_slices: int
    num_devices: int
    mesh_shape: dict
    batch_size: int
    seq_len: int
    fits: bool
    memory: Memory | None  # None when the compiler ran out of memory
    memory_per_chip_bytes: int | None  # memory.total, or what the compiler said it needed
    hbm_per_chip_bytes: int  # usable HBM the total is judged against
    compile_seconds: float  # every compile of the step, a confirming one included
    effort: str  # the compile whose numbers these are ("fast" or "full"; `EFFORTS`)
    fast_memory_per_chip_bytes: int | None  # a fast compile's total that a full one replaced
    oom_message: str | None
    flops_per_device: float | None
    flops_per_step: float | None  # all devices together
    flops_source: str
    flops_compile_seconds: float | None
    peak_flops_per_chip: float
    model_flops_per_step: float  # flop_count's, whatever the source above
    max_batch: MaxBatch | None = None
    step_time: StepTime | None = None  # XLA's cost model, not a measurement
    step_time_unavailable: str | None = None  # why there is no estimate, if asked for one

    @property
    def estimated_step_seconds(self) -> float | None:
        return None if self.step_time is None else self.step_time.seconds

    @property
    def estimated_mfu(self) -> float | None:
        """Model FLOPs (`flop_count`'s) over what the chips could do at peak in the
        estimated step time: the MFU a run would log if the estimate held."""
        if self.step_time is None:
            return None
        peak = self.num_devices * self.peak_flops_per_chip * self.step_time.seconds
        return self.model_flops_per_step / peak

    @property
    def estimated_tokens_per_sec(self) -> float | None:
        if self.step_time is None:
            return None
        return self.batch_size * self.seq_len / self.step_time.seconds

    @property
    def step_seconds_lower_bound(self) -> float | None:
        """No step runs faster than its FLOPs at the chip's bf16 peak."""
        if self.flops_per_device is None:
            return None
        return self.flops_per_device / self.peak_flops_per_chip

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.memory is not None:
            out["memory"]["total"] = self.memory.total
        out["step_seconds_lower_bound"] = self.step_seconds_lower_bound
        out["estimated_step_seconds"] = self.estimated_step_seconds
        out["estimated_mfu"] = self.estimated_mfu
        out["estimated_tokens_per_sec"] = self.estimated_tokens_per_sec
        return out


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def needed(r: Report) -> str:
    """The per-chip total and its share of HBM; after an OOM, the compiler's lower bound."""
    if r.memory_per_chip_bytes is None:
        return "?"
    at_least = ">= " if r.memory is None else ""
    share = r.memory_per_chip_bytes / r.hbm_per_chip_bytes
    return f"{at_least}{gib(r.memory_per_chip_bytes)} ({share:.1%})"


def format_report(r: Report) -> str:
    mesh = " ".join(f"{k}={v}" for k, v in r.mesh_shape.items())
    slices = f"{r.num_slices} slices x " if r.num_slices > 1 else ""
    if r.effort == "fast":
        effort = "fast; training's full-effort compile needs a few % more: --effort=full"
    elif r.fast_memory_per_chip_bytes is not None:
        share = r.fast_memory_per_chip_bytes / r.hbm_per_chip_bytes
        effort = f"fast, then full: the fast compile needed {share:.1%} of HBM"
    else:  # asked for, or after a fast compile that ran out of memory
        effort = "full, as training's"
    lines = [
        f"{slices}{r.topology} ({r.libtpu_topology}): {r.num_devices} {r.chip} chips, mesh {mesh}",
        f"batch {r.batch_size} x {r.seq_len} tokens; compiled in {r.compile_seconds:.1f} s"
        f" ({effort})",
        "memory per chip:",
    ]
    if r.memory:
        m = r.memory
        for label, n in (
            ("arguments", m.arguments),
            ("outputs", m.outputs),
            ("aliased (donated)", -m.aliased),
            ("temporaries", m.temporaries),
            ("generated code", m.generated_code),
        ):
            lines.append(f"  {label:<18} {gib(n):>12}")
    else:
        lines += ["  " + line for line in oom_summary(r.oom_message).splitlines()]
    lines.append(
        f"  {'total':<18} {needed(r):>12} of {gib(r.hbm_per_chip_bytes)} usable HBM: "
        + ("fits" if r.fits else "DOES NOT FIT")
    )
    if r.flops_per_step is None:
        lines.append(f"FLOPs per step: {r.flops_source}")
    else:
        took = f", {r.flops_compile_seconds:.1f} s" if r.flops_compile_seconds else ""
        tokens = r.batch_size * r.seq_len / r.step_seconds_lower_bound
        lines += [
            f"FLOPs per step: {r.flops_per_step:.4g} ({r.flops_per_device:.4g} per chip; "
            f"{r.flops_source}{took})",
            f"step time >= {r.step_seconds_lower_bound:.3g} s at {r.peak_flops_per_chip / 1e12:g}"
            f" TFLOP/s bf16 peak per chip (<= {tokens:,.0f} tokens/s)",
        ]
    if r.step_time:
        t = r.step_time
        per_layer = f"{t.encoder_layer_seconds * 1e3:.2f} ms per encoder layer"
        if t.global_layer_seconds is not None:
            per_layer = (
                f"{t.global_layer_seconds * 1e3:.2f} ms per global and "
                f"{t.encoder_layer_seconds * 1e3:.2f} ms per local encoder layer"
            )
        lines.append(
            f"step time ~ {t.seconds:.3g} s, ~ {r.estimated_tokens_per_sec:,.0f} tokens/s, "
            f"MFU ~ {r.estimated_mfu:.1%}: XLA's TPU cost model (optimal_seconds), an estimate, "
            f"not a measurement (one-layer program {t.one_layer_seconds * 1e3:.1f} ms + "
            f"{per_layer} + "
            f"{t.decoder_layer_seconds * 1e3:.2f} ms per decoder layer, unrolled; "
            f"{t.compile_seconds:.0f} s of compiles beside the step's)"
        )
    if r.step_time_unavailable:
        lines.append(f"step time estimate: none ({r.step_time_unavailable})")
    if r.max_batch:
        mb = r.max_batch
        probes = ", ".join(f"{b} {'fits' if ok else 'no'}" for b, ok, _ in mb.probes)
        lines.append(
            f"largest global batch that fits: {mb.batch_size} (multiples of {mb.unit}; "
            f"{len(mb.probes)} compiles in {mb.seconds:.0f} s: {probes})"
        )
    return "\n".join(lines)
