"""Where a train step's time goes, from a `jax.profiler` trace: the kernels (GPU) or XLA ops
(CPU) by time per step, and their shares by category (`python -m maelm_jax.bench kernels`;
the trace is read by `trace_files`).

Sources, best first (`Summary.source` says which one a table came from):

1. XProf's own converters (the `xprof` package, the `profile` extra), offline on the
   `.xplane.pb`: `kernel_stats` (one row per GPU kernel and the HLO op that launched it),
   else `hlo_stats` (one row per HLO op: TPU). Both are empty for a CPU trace.
2. The trace events themselves, read with `jax.profiler.ProfileData` (no xprof needed): the
   events of the `/device:GPU:N` planes (one per kernel or memcpy), else, on a CPU, the
   XLA thunk events of the `/host:CPU` plane (those carrying an `hlo_op` stat). A CPU op
   may contain others (a `while` and its body, a `call`): each op counts its self time,
   its duration less that of the ops nested inside it, so the times add up.

Categories come from the name and, where the trace holds the program (its HLO proto, in
the `/host:metadata` plane), from the opcodes inside a fusion: a CPU `ynn_fusion` is a dot,
a `pad_gather_fusion` a gather. A kernel counts once, under the first category that
matches, in the order of `CATEGORIES`: attention before matmul (a cuDNN flash kernel runs
its own GEMMs), collectives before reductions (an all-reduce reduces).

Times are per step and per device: the trace's total over `steps` and the devices seen in
it. On a CPU with simulated devices (`--xla_force_host_platform_device_count`) the devices
share the cores and wait for each other in every collective, so `collectives` there is
mostly waiting, not transfer.
"""

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

CATEGORIES = (
    "attention",
    "collectives",
    "matmul",
    "scatter/gather",
    "reductions",
    "copies",
    "elementwise",
    "other",
)

_ATTENTION = ("fmha", "flash", "splash", "sdpa", "attention", "cudnn_mha")
_COLLECTIVE_TOKENS = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast", "send", "recv", "allreduce", "allgather",
    "reducescatter", "alltoall",
)  # fmt: skip
_MATMUL_SUBSTRINGS = ("gemm", "cublas", "nvjet", "cutlass", "xmma", "matmul", "ynn", "xnn")
_MATMUL_TOKENS = ("dot", "convolution", "conv", "einsum")
_GATHER_TOKENS = ("scatter", "gather", "dynamic-gather")
_REDUCE_TOKENS = ("reduce", "reduce-window", "reduction", "softmax", "argmax", "input", "kinput")
_COPY_SUBSTRINGS = ("memcpy", "memset", "memcopy")
# Ops that only move or re-lay data: a fusion made of nothing else is a copy.
_MOVEMENT = {
    "copy", "transpose", "bitcast", "reshape", "broadcast", "slice", "dynamic-slice",
    "dynamic-update-slice", "concatenate", "pad", "reverse", "copy-start", "copy-done",
    "dynamic", "update",  # GPU kernel names spell dynamic-update-slice with underscores
}  # fmt: skip
# Tokens that say nothing about the work: names' glue and the leaves of every fusion.
_NEUTRAL = {
    "", "fusion", "fused", "wrapped", "loop", "kloop", "kcustom", "koutput", "parameter",
    "constant", "tuple", "get-tuple-element", "kernel", "triton",
}  # fmt: skip
_CONTROL = {
    "while", "call", "closed_call", "closed", "conditional", "custom-call", "sort", "rng",
    "rng-bit-generator", "partition-id", "replica-id", "after-all", "infeed", "outfeed",
    "topk", "iota", "optimization-barrier",
}  # fmt: skip


def _tokens(name: str) -> set[str]:
    """`name` lowercased and split at everything but letters, digits and '-' (so HLO
    opcodes like `dynamic-update-slice` stay whole), instance numbers dropped."""
    return {t for t in re.split(r"[^a-z0-9-]+", name.lower()) if not t.isdigit()}


def categorise(name: str, opcodes: Iterable[str] = ()) -> str:
    """The category of a kernel or HLO op called `name`; `opcodes` are what is known of its
    program: the opcodes inside it (a fusion's), its fusion kind (`kInput`), a custom call's
    target, or XProf's HLO category. Every check reads both the name and `opcodes`."""
    lowered = " ".join([name.lower(), *(o.lower() for o in opcodes)])
    tokens = _tokens(name) | {t for o in opcodes for t in _tokens(o)}
    if any(s in lowered for s in _ATTENTION):
        return "attention"
    if "nccl" in lowered or any(t.startswith(_COLLECTIVE_TOKENS) for t in tokens):
        return "collectives"
    if any(s in lowered for s in _MATMUL_SUBSTRINGS) or tokens & set(_MATMUL_TOKENS):
        return "matmul"
    if any(t.endswith(_GATHER_TOKENS) for t in tokens):
        return "scatter/gather"
    work = tokens - _NEUTRAL
    # A fusion that only moves data is a copy. XLA's GPU backend emits transposes as input
    # fusions too: "input_transpose_fusion" is a copy (mae_lm_base's were 25 of its 152 ms
    # on an H200), "input_add_reduce" a reduction.
    moved = work - {"input", "kinput"}
    if moved and moved <= _MOVEMENT and not tokens & (set(_REDUCE_TOKENS) - {"input", "kinput"}):
        return "copies"
    if tokens & set(_REDUCE_TOKENS):
        return "reductions"
    if any(s in lowered for s in _COPY_SUBSTRINGS):
        return "copies"
    if work - _MOVEMENT - _CONTROL or "fusion" in tokens or "loop" in tokens:
        return "elementwise"
    return "other"


def base_name(name: str) -> str:
    """`name` without its instance number: `copy.1074` and `loop_add_fusion_3` are rows of
    `copy` and `loop_add_fusion` (one HLO op each, many per step)."""
    return re.sub(r"([._]\d+)+$", "", name) or name


@dataclasses.dataclass(frozen=True)
class Event:
    """One kernel or op execution in a trace: `name` (kernel or HLO op), `op` (the HLO op
    that ran it; `name` itself on a CPU), its self time and the device it ran on."""

    name: str
    op: str
    self_ns: float
    device: str
    program: str = ""
    hints: frozenset[str] = frozenset()  # XProf's HLO category, for `categorise`


@dataclasses.dataclass(frozen=True)
class Row:
    """One kernel (or op) name, its instances merged (`base_name`), per step and device."""

    name: str
    category: str
    ms_per_step: float
    count_per_step: float
    share: float


@dataclasses.dataclass(frozen=True)
class CategoryRow:
    category: str
    ms_per_step: float
    count_per_step: float
    share: float


@dataclasses.dataclass(frozen=True)
class Summary:
    """`rows` sorted by time, longest first; `categories` in `CATEGORIES` order, every one
    present (zeros included) so runs compare column by column."""

    source: str
    steps: int
    devices: int
    total_ms_per_step: float
    rows: tuple[Row, ...]
    categories: tuple[CategoryRow, ...]
    num_kernels: int = 0  # rows before any `top` cut
    wall_ms_per_step: float | None = None
    device_kind: str = ""
    trace: str = ""

    def to_json(self, top: int | None = None) -> dict:
        """Plain JSON types; `rows` cut to the `top` longest (`num_kernels` counts all)."""
        out = dataclasses.asdict(self)
        out["rows"] = [dict(r) for r in out["rows"][:top]]
        out["categories"] = [dict(c) for c in out["categories"]]
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> "Summary":
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["rows"] = tuple(Row(**r) for r in data["rows"])
        kwargs["categories"] = tuple(CategoryRow(**c) for c in data["categories"])
        return cls(**kwargs)


def summarise(
    events: Iterable[Event],
    steps: int,
    source: str,
    opcodes: Mapping[tuple[str, str], frozenset[str]] | None = None,
    devices: int | None = None,
) -> Summary:
    """Rows and category shares of `events` (the whole trace) per step and device.
    `opcodes` maps (program, HLO op) to what `categorise` reads; `devices` defaults to
    the number of distinct devices among the events."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    opcodes = opcodes or {}
    by_op = _by_op_name(opcodes)
    time_ns, count, category, seen = defaultdict(float), defaultdict(int), {}, set()
    for e in events:
        key = base_name(e.name)
        time_ns[key] += e.self_ns
        count[key] += 1
        seen.add(e.device)
        if key not in category:
            hints = opcodes.get((e.program, e.op)) or by_op.get(e.op, frozenset())
            category[key] = categorise(e.name, hints | e.hints)
    per = steps * (devices or max(1, len(seen)))
    total = sum(time_ns.values())
    share = (lambda ns: ns / total) if total else (lambda ns: 0.0)
    rows = sorted(
        (
            Row(k, category[k], ns / per / 1e6, count[k] / per, share(ns))
            for k, ns in time_ns.items()
        ),
        key=lambda r: (-r.ms_per_step, r.name),
    )
    cats = []
    for c in CATEGORIES:
        mine = [r for r in rows if r.category == c]
        ns = sum(time_ns[r.name] for r in mine)
        cats.append(
            CategoryRow(c, ns / per / 1e6, sum(count[r.name] for r in mine) / per, share(ns))
        )
    return Summary(source, steps, devices or max(1, len(seen)), total / per / 1e6,
                   tuple(rows), tuple(cats), num_kernels=len(rows))  # fmt: skip


def _by_op_name(opcodes: Mapping[tuple[str, str], frozenset[str]]) -> dict[str, frozenset]:
    """{op: opcodes} with the program left out (XProf's kernel table names no program):
    the largest program, the train step, wins a name two programs share."""
    sizes = defaultdict(int)
    for program, _ in opcodes:
        sizes[program] += 1
    out = {}
    for (_, op), codes in sorted(opcodes.items(), key=lambda kv: sizes[kv[0][0]]):
        out[op] = codes
    return out


def format_summary(s: Summary, top: int = 15) -> str:
    wall = f", wall {s.wall_ms_per_step:.3f} ms/step" if s.wall_ms_per_step is not None else ""
    kind = f" {s.device_kind}" if s.device_kind else ""
    lines = [
        f"profile: {s.steps} step(s) on {s.devices}{kind} device(s); kernel time "
        f"{s.total_ms_per_step:.3f} ms/step per device{wall}",
        f"source: {s.source}",
        f"trace: {s.trace}",
        "",
        f"top {min(top, len(s.rows))} of {s.num_kernels} kernels/ops (instances merged)",
        f"{'ms/step':>9} {'share':>7} {'count/step':>10}  {'category':<15}name",
    ]
    for r in s.rows[:top]:
        lines.append(
            f"{r.ms_per_step:>9.3f} {r.share:>7.1%} {r.count_per_step:>10.1f}  "
            f"{r.category:<15}{r.name}"
        )
    lines += ["", "by category", f"{'category':<15}{'ms/step':>9} {'share':>7} {'count/step':>10}"]
    for c in s.categories:
        lines.append(
            f"{c.category:<15}{c.ms_per_step:>9.3f} {c.share:>7.1%} {c.count_per_step:>10.1f}"
        )
    return "\n".join(lines)
