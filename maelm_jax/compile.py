"""`python -m maelm_jax.compile --config=configs/<name>.py --topology=v5p-64 [--num_slices=N]
[--json] [--flops=analytic|unrolled|skip] [--effort=fast|full] [--hbm_bytes=B] [--max_batch]
[--config.key=value]`.

Compiles the real train step for a TPU slice on a CPU-only machine (libtpu's compile-only
devices), through the same `sharding.create_mesh` and `programs.build` that training uses,
so a layout or memory problem shows up before a pod is reserved. Exit status: 0 the step
fits in HBM, 1 it does not, 2 it could not be judged (bad config or topology, no libtpu).

Memory is per chip, as XLA assigned it: arguments + outputs - aliased (the donated state is
written in place) + temporaries + the program itself; the compiler's own verdict decides
`fits` (it refuses to compile a step that does not fit), and the total is also compared
with the chip's usable HBM (the compiler's number, a little under the published one).

Effort: by default (`--effort=fast`) the compile asks libtpu for less work on the program's
speed (XLA's `exec_time_optimization_effort=-1`; memory fitting as usual): mae_lm_large on
v5p-64 compiles in about 105 s instead of 152 to 174 s on a 2-core CPU. Its memory is not
quite the training compile's: a full compile's scheduler spends spare HBM (on overlap), so
its total is higher, by 0.4% to 6.4% in the large configs measured (README, "Pod
preflight"). Where the verdict could turn on that, a fast total at `CONFIRM_SHARE` of HBM or
more, or an out-of-memory, the step is compiled again at full effort and that compile's
numbers are reported. `--effort=full` always compiles as training does; `--max_batch`
probes at full effort (its edge is exactly where the two differ).

FLOPs: one compile is the whole preflight. By default (`--flops=analytic`) FLOPs per step
are `flop_count`'s model FLOPs (matmuls, forward + backward, optimizer; checked against
XLA's count of small unrolled programs in the tests); rematerialisation's recomputation is
not in them, so the step-time bound is what the model's work needs at the chip's bf16 peak.
XLA's own count of the configured program is no use: it counts a while loop's body once,
and scanned layers, gradient accumulation and windowed einsums (on a large mesh XLA:TPU
turns an FSDP all-gather + matmul into a loop over weight shards) are loops. `--flops=
unrolled` compiles a second program to count what the chips execute, recomputation
included: the same step with `model.scan_layers=False`, windowed einsums off, on one
micro-batch, scaled by `grad_accum_steps` (a 24-layer config: minutes more).

`--max_batch` finds the largest global batch that fits, exactly, in steps of the
data-parallel size (batch shards x `grad_accum_steps`, which every batch must divide by):
memory is nearly linear in the batch, so two compiled probes predict the answer and one
more compile on each side of it confirms it (`max_batch`).
"""

import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import app, flags
from jax.experimental import topologies
from ml_collections import config_flags

from maelm_jax import cli
from maelm_jax.configuration import ConfigError
from maelm_jax.hardware import tpu_chips
from maelm_jax.model import flop_count
from maelm_jax.training import programs, sharding

EXIT_DOES_NOT_FIT = 1
EXIT_ERROR = 2
FLOPS_MODES = ("analytic", "unrolled", "skip")
EFFORTS = ("fast", "full")
FAST = {"exec_time_optimization_effort": -1.0}  # XLA's range is [-1, 1]; 0 is training's
# A fast total at this share of HBM or more is confirmed by a full compile: more than twice
# the largest gap measured between the two (6.4%, three_ml_self_large at its largest batch).
CONFIRM_SHARE = 0.85
# The counting program's matmuls stay whole; the arithmetic is the same either way.
NO_WINDOWED_EINSUM = {
    "xla_tpu_enable_windowed_einsum_for_all_gather": False,
    "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False,
}

# libtpu without a TPU: no metadata server to ask, no peers, and no lock on the library
# (another process, e.g. a test run, may hold it).
_LIBTPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
}


class LibtpuMissingError(RuntimeError):
    """Compiling for TPU needs libtpu even without a TPU."""


def topology_devices(slice_: tpu_chips.Slice, num_slices: int = 1) -> list:
    """Compile-only devices for `num_slices` copies of the slice (one per chip)."""
    if num_slices < 1:
        raise ConfigError(f"num_slices={num_slices} is not allowed; it must be >= 1")
    if not (importlib.util.find_spec("libtpu") or os.environ.get("TPU_LIBRARY_PATH")):
        raise LibtpuMissingError(
            "libtpu is not installed, and compiling for TPU needs it (no TPU needed): "
            'pip install -e ".[tpu]"  or  pip install "jax[tpu]==0.10.2"'
        )
    for key, value in {**_LIBTPU_ENV, "TPU_ACCELERATOR_TYPE": slice_.accelerator_type}.items():
        os.environ.setdefault(key, value)
    shape3 = slice_.shape + (1,) * (3 - len(slice_.shape))
    # Hosts hold up to 2x2x1 chips; a whole number of 4x4x4 cubes is a torus on v4/v5p.
    # Both only steer the compiler's choice of collectives, not memory or FLOPs.
    torus = len(slice_.shape) == 3 and all(s % 4 == 0 for s in slice_.shape)
    # One-core chips (v5e, v6e) have no chip_config_name; libtpu takes no None, so leave it out.
    name = slice_.chip.chip_config_name
    chip_config = {} if name is None else {"chip_config_name": name}
    try:
        topology = topologies.get_topology_desc(
            topology_name=slice_.libtpu_name,
            platform="tpu",
            chips_per_host_bounds=tuple(min(s, h) for s, h in zip(shape3, (2, 2, 1), strict=True)),
            num_slices=num_slices,
            wrap=(torus,) * 3,
            **chip_config,
        )
    except jax.errors.JaxRuntimeError as e:
        raise ConfigError(f"libtpu rejects topology {slice_.libtpu_name!r}: {e}") from e
    return list(topology.devices)


@dataclasses.dataclass(frozen=True)
class Memory:
    """Per-chip bytes from `Compiled.memory_analysis()`."""

    arguments: int
    outputs: int
    aliased: int  # outputs that reuse a donated argument's buffer
    temporaries: int
    generated_code: int

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.generated_code

    @classmethod
    def of(cls, compiled) -> "Memory":
        m = compiled.memory_analysis()
        return cls(
            arguments=m.argument_size_in_bytes,
            outputs=m.output_size_in_bytes,
            aliased=m.alias_size_in_bytes,
            temporaries=m.temp_size_in_bytes,
            generated_code=m.generated_code_size_in_bytes,
        )


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
    max_batch: "MaxBatch | None" = None

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
        return out


_SIZE = r"([\d.]+)([KMGT]?)i?B?"


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * 1024 ** "BKMGT".index(unit or "B"))


def required_bytes(oom_message: str) -> int | None:
    """A lower bound on the step's per-chip need, from libtpu's out-of-memory message (the
    compiler stops at the first allocation that does not fit)."""
    match = re.search(rf"Total hbm usage >= {_SIZE}", oom_message) or re.search(
        rf"required for HLO temporaries \({_SIZE}\) exceeds", oom_message
    )
    if match:
        return _bytes(*match.groups())
    match = re.search(
        rf"Used {_SIZE} of {_SIZE} hbm. Exceeded hbm capacity by {_SIZE}", oom_message
    )
    if match:
        return _bytes(*match.groups()[:2]) + _bytes(*match.groups()[4:])
    return None


def oom_summary(oom_message: str, allocations: int = 5) -> str:
    """libtpu's report cut to its totals and the largest allocations: what to shrink."""
    head, _, rest = oom_message.partition("Largest program allocations in hbm:")
    lines = [line for line in head.splitlines() if line.strip()]
    for block in re.split(r"\n\s*=+\s*\n", rest)[:allocations]:
        fields = [re.sub(r"^\d+\.\s*", "", line.strip()) for line in block.splitlines()]
        picked = [f for f in fields if f.startswith(("Size:", "Operator:", "Shape:"))]
        if picked:
            lines.append("  - " + "; ".join(picked))
    return "\n".join(lines)


def compile_step(config: ml_collections.ConfigDict, devices: list, options: dict | None = None):
    """(Compiled or None, OOM message or None, mesh, seconds to lower and compile)."""
    mesh = sharding.create_mesh(config, devices=devices)
    progs = programs.build(config, mesh, config.vocab_size)
    # Outside the rules context: unboxing there would constrain the abstract leaves.
    args = (progs.abstract_state(), progs.abstract_batch(config.batch_size, config.seq_len))
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


def memory_of(compiled, oom: str | None) -> tuple[Memory | None, int | None]:
    """(the compiled step's memory, its per-chip total); after an OOM, (None, the compiler's
    lower bound on the total)."""
    if compiled is None:
        return None, required_bytes(oom)
    memory = Memory.of(compiled)
    return memory, memory.total


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


def _flops(compiled) -> float:
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, list) else costs
    return float(costs["flops"])


def counting_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The same step with every loop XLA would count once unrolled (layers, query blocks,
    LM-head slot blocks): one micro-batch. `maelm_jax.flops` counts from it too."""
    c = config.copy_and_resolve_references()
    c.model.scan_layers = False
    c.model.attention_query_chunk = 0
    c.model.lm_head_chunk = 0
    c.batch_size = config.batch_size // config.grad_accum_steps
    c.grad_accum_steps = 1
    return c


def _count_flops(config, devices, compiled, mode: str):
    """(FLOPs per device or None, where they come from, seconds spent compiling for them)."""
    if mode == "skip":
        return None, "skipped (--flops=skip)", None
    if mode == "analytic":
        flops = flop_count.step_flops(config, flop_count.num_params(config))
        return flops / len(devices), "analytic model FLOPs (maelm_jax/model/flop_count.py)", None
    if compiled is None:
        return None, "skipped: the step does not compile within HBM", None
    if not matmul_loops(compiled.as_text()):
        return _flops(compiled), "the configured program, which has no loops with matmuls", None
    counting, oom, _, seconds = compile_step(counting_config(config), devices, NO_WINDOWED_EINSUM)
    if counting is None:
        return None, f"failed: the unrolled program ran out of memory ({oom})", seconds
    source = "unrolled compile (no layer scan, no windowed einsums, one micro-batch)"
    if loops := matmul_loops(counting.as_text()):
        source += f"; UNDERCOUNT: {loops} loops with matmuls remain, each counted once"
    return _flops(counting) * config.grad_accum_steps, source, seconds


@dataclasses.dataclass(frozen=True)
class MaxBatch:
    """The largest global batch that fits, and every probe: (batch, fits, bytes per chip)."""

    batch_size: int  # 0: not even one data-parallel unit fits
    unit: int  # batches are multiples of this
    probes: tuple[tuple[int, bool, int | None], ...]
    seconds: float


def batch_unit(config: ml_collections.ConfigDict, devices: list) -> int:
    """What every global batch must be a multiple of: batch shards x micro-batches."""
    mesh = sharding.create_mesh(config, devices=devices)
    spec = sharding.batch_sharding(mesh, sharding.axis_rules(config)).spec
    axes = () if not spec or spec[0] is None else spec[0]
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes) * config.grad_accum_steps


def max_batch(config, devices: list, hbm: int, known: tuple | None = None) -> MaxBatch:
    """The largest multiple of the data-parallel unit that fits, exactly, in few compiles.

    Per-chip memory is close to linear in the batch (the state is fixed, activations and
    temporaries grow with it), so a line through compiled probes predicts the edge, and a
    probe on each side of the prediction confirms it. The second probe sits an eighth
    away from the first: an out-of-memory probe gives only the compiler's lower bound (it
    stops at the first allocation that does not fit), so a far one (double the batch) bends
    the line; only compiled probes' totals draw it. Where the line still misses (layout
    changes), a bisection step follows each prediction, so the bracket still halves.
    `known` is a probe already made: (batch, fits, bytes, bytes are a compiled total).
    """
    start = time.perf_counter()
    unit = batch_unit(config, devices)
    probes, exact = {}, set()
    if known and known[0] % unit == 0:
        probes[known[0] // unit] = tuple(known[:3])
        if known[3]:
            exact.add(known[0] // unit)

    def fits(units: int) -> bool:
        if units not in probes:
            c = config.copy_and_resolve_references()
            c.batch_size = units * unit
            compiled, oom, _, _ = compile_step(c, devices)
            _, needed = memory_of(compiled, oom)
            probes[units] = (c.batch_size, compiled is not None and needed <= hbm, needed)
            if compiled is not None:
                exact.add(units)
        return probes[units][1]

    def bracket() -> tuple[int, int | None]:
        """(largest fitting units, 0 if none; smallest larger one that does not, or None)."""
        lo = max((u for u, p in probes.items() if p[1]), default=0)
        return lo, min((u for u, p in probes.items() if u > lo and not p[1]), default=None)

    first = max(1, config.batch_size // unit)
    step = max(1, first // 8)
    fits(first + step if fits(first) else max(1, first - step))
    predict = True  # alternate: a prediction (and its neighbour), then a bisection step
    lo, hi = bracket()
    while hi is None or hi - lo > 1:
        line = predict or hi is None  # nothing to bisect before a probe fails
        guess = _linear_guess({u: probes[u][2] for u in exact}, hbm) if line else None
        if guess is None:  # bisection, or doubling while nothing is known not to fit
            guess = 2 * max(lo, 1) if hi is None else (lo + hi) // 2
        guess = max(guess, lo + 1) if hi is None else min(max(guess, lo + 1), hi - 1)
        neighbour = guess + 1 if fits(guess) else guess - 1  # across the predicted edge
        if line and neighbour > lo and (hi is None or neighbour < hi):
            fits(neighbour)
        predict = not predict
        lo, hi = bracket()
    return MaxBatch(lo * unit, unit, tuple(sorted(probes.values())), time.perf_counter() - start)


def _linear_guess(measured: dict, hbm: int) -> int | None:
    """Units where the least-squares line through the compiled probes' totals reaches
    `hbm` (all of them: single layouts jitter a few MiB); None without two."""
    if len(measured) < 2:
        return None
    units = np.array(sorted(measured), dtype=np.float64)
    slope, intercept = np.polyfit(units, [measured[u] for u in units.astype(int)], 1)
    if slope <= 0:  # no growth seen: the line says nothing
        return None
    return int((hbm - intercept) // slope)


def analyze(
    config: ml_collections.ConfigDict,
    topology: str,
    num_slices: int = 1,
    flops: str = "analytic",
    hbm_bytes: int | None = None,
    find_max_batch: bool = False,
    effort: str = "fast",
) -> Report:
    """Compiles `config`'s train step for `num_slices` x `topology` (e.g. "v5p-64").

    `hbm_bytes` replaces the chip's usable HBM in the `fits` verdict (to demand headroom);
    `find_max_batch` adds the largest global batch that fits (more compiles); `effort`: see
    the module doc.
    """
    if flops not in FLOPS_MODES:
        raise ConfigError(f"flops={flops!r} is not allowed; use one of {FLOPS_MODES}")
    if effort not in EFFORTS:
        raise ConfigError(f"effort={effort!r} is not allowed; use one of {EFFORTS}")
    slice_ = tpu_chips.parse(topology)
    devices = topology_devices(slice_, num_slices)
    hbm = hbm_bytes or slice_.chip.usable_hbm_bytes
    compiled, oom, mesh, seconds = compile_step(config, devices, FAST if effort == "fast" else None)
    memory, needed = memory_of(compiled, oom)
    fast_total = None
    if effort == "fast" and (memory is None or memory.total >= CONFIRM_SHARE * hbm):
        fast_total = needed
        compiled, oom, mesh, more = compile_step(config, devices)
        seconds, effort = seconds + more, "full"
        memory, needed = memory_of(compiled, oom)
    fits = compiled is not None and memory.total <= hbm

    per_device, source, flops_seconds = _count_flops(config, devices, compiled, flops)
    # A fast compile is no probe for the edge: the probes are full compiles.
    known = (config.batch_size, fits, needed, memory is not None) if effort == "full" else None
    return Report(
        topology=topology,
        libtpu_topology=slice_.libtpu_name,
        chip=slice_.chip.name,
        num_slices=num_slices,
        num_devices=len(devices),
        mesh_shape=dict(mesh.shape),
        batch_size=config.batch_size,
        seq_len=config.seq_len,
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
        model_flops_per_step=flop_count.step_flops(config, flop_count.num_params(config)),
        max_batch=max_batch(config, devices, hbm, known) if find_max_batch else None,
    )


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def _needed(r: Report) -> str:
    """The per-chip total and its share of HBM; after an OOM, the compiler's lower bound."""
    if r.memory_per_chip_bytes is None:
        return "?"
    at_least = ">= " if r.memory is None else ""
    share = r.memory_per_chip_bytes / r.hbm_per_chip_bytes
    return f"{at_least}{_gib(r.memory_per_chip_bytes)} ({share:.1%})"


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
            lines.append(f"  {label:<18} {_gib(n):>12}")
    else:
        lines += ["  " + line for line in oom_summary(r.oom_message).splitlines()]
    lines.append(
        f"  {'total':<18} {_needed(r):>12} of {_gib(r.hbm_per_chip_bytes)} usable HBM: "
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
    if r.max_batch:
        mb = r.max_batch
        probes = ", ".join(f"{b} {'fits' if ok else 'no'}" for b, ok, _ in mb.probes)
        lines.append(
            f"largest global batch that fits: {mb.batch_size} (multiples of {mb.unit}; "
            f"{len(mb.probes)} compiles in {mb.seconds:.0f} s: {probes})"
        )
    return "\n".join(lines)


FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined only when it runs: `maelm_jax.flops` imports this
    module for its compile helpers and defines flags of the same names."""
    config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
    flags.DEFINE_string(
        "topology", None, f"TPU slice, e.g. {', '.join(tpu_chips.EXAMPLES)}.", required=True
    )
    flags.DEFINE_integer("num_slices", 1, "Slices joined over DCN (config.mesh.dcn).")
    flags.DEFINE_boolean("json", False, "Print one JSON object instead of the table.")
    flags.DEFINE_enum("flops", "analytic", FLOPS_MODES, "How to count FLOPs; see the module doc.")
    flags.DEFINE_enum("effort", "fast", EFFORTS, "Compile effort; see the module doc.")
    flags.DEFINE_integer("hbm_bytes", 0, "Judge `fits` against this per chip; 0: the chip's HBM.")
    flags.DEFINE_boolean("max_batch", False, "Also find the largest batch that fits (compiles).")
    flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    jax.config.update("jax_platforms", "cpu")  # libtpu compiles; no TPU is opened
    try:
        report = analyze(
            FLAGS.config,
            FLAGS.topology,
            FLAGS.num_slices,
            FLAGS.flops,
            FLAGS.hbm_bytes or None,
            FLAGS.max_batch,
            FLAGS.effort,
        )
    except (ConfigError, LibtpuMissingError) as e:
        print(f"maelm_jax.compile: error: {e}", file=sys.stderr)
        sys.exit(EXIT_ERROR)
    print(json.dumps(report.to_json(), indent=1) if FLAGS.json else format_report(report))
    if not report.fits:
        print(
            f"maelm_jax.compile: the train step does not fit: it needs {_needed(report)} of "
            f"the {_gib(report.hbm_per_chip_bytes)} usable HBM per {report.chip} chip",
            file=sys.stderr,
        )
        sys.exit(EXIT_DOES_NOT_FIT)


if __name__ == "__main__":
    define_flags()
    jax.config.config_with_absl()
    cli.run(main, errors=(LibtpuMissingError,), error_status=EXIT_ERROR, prog="maelm_jax.compile")
