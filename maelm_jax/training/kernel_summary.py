"""Where a train step's time goes, from a `jax.profiler` trace: the kernels (GPU) or XLA ops
(CPU) by time per step, and their shares by category (`python -m maelm_jax.profile`).

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
import glob
import json
import os
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
    if tokens & set(_REDUCE_TOKENS):
        return "reductions"
    if any(s in lowered for s in _COPY_SUBSTRINGS):
        return "copies"
    work = tokens - _NEUTRAL
    if work and work <= _MOVEMENT:
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


# --- Reading a trace --------------------------------------------------------------------


def find_xplane(logdir: str | os.PathLike) -> str:
    """The newest `*.xplane.pb` under `logdir` (jax writes
    `<logdir>/plugins/profile/<time>/<host>.xplane.pb`)."""
    paths = glob.glob(os.path.join(os.fspath(logdir), "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"no *.xplane.pb under {logdir}")
    return max(paths, key=os.path.getmtime)


def hlo_opcodes(xplane_path: str) -> dict[tuple[str, str], frozenset[str]]:
    """{(program id, HLO op): the opcodes inside it} from the HLO protos jax stores in the
    trace's metadata plane: a fusion's instructions, its kind (`kLoop`, `kInput`), a custom
    call's target. {} where TensorFlow's protobuf modules (a core dependency, but imported
    only here) are missing."""
    try:
        from tensorflow.compiler.xla.service import hlo_pb2
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        return {}
    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    out = {}
    for plane in space.planes:
        if plane.name != "/host:metadata":
            continue
        for event in plane.event_metadata.values():
            for stat in event.stats:
                if plane.stat_metadata[stat.metadata_id].name != "Hlo Proto":
                    continue
                module = hlo_pb2.HloProto.FromString(stat.bytes_value).hlo_module
                found = re.search(r"\((\d+)\)$", event.name)  # "jit_train_step(20)"
                program = found.group(1) if found else event.name
                computations = {c.id: c for c in module.computations}
                for computation in module.computations:
                    for inst in computation.instructions:
                        out[(program, inst.name)] = frozenset(_inside(inst, computations))
    return out


def _inside(inst, computations) -> set[str]:
    """The opcodes a fused instruction runs (its fused computations, recursively), its
    fusion kind and custom-call target; a `while`'s or `call`'s body is not inside it (the
    body's ops are events of their own)."""
    codes = {inst.opcode}
    if inst.fusion_kind:
        codes.add(inst.fusion_kind)
    if inst.custom_call_target:
        codes.add(inst.custom_call_target)
    if inst.opcode != "fusion":
        return codes
    stack = list(inst.called_computation_ids)
    while stack:
        comp = computations.get(stack.pop())
        if comp is None:
            continue
        for sub in comp.instructions:
            codes.add(sub.opcode)
            if sub.custom_call_target:
                codes.add(sub.custom_call_target)
            stack.extend(sub.called_computation_ids)
    return codes


def xplane_events(xplane_path: str) -> tuple[list[Event], str]:
    """(events, where they came from) from the trace itself: GPU planes' kernels where
    there are any, else the CPU's XLA thunk events; self times (nested ops subtracted)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(xplane_path)
    gpu = [p for p in data.planes if p.name.startswith("/device:GPU")]
    events = []
    if gpu:
        for plane in gpu:
            for line in plane.lines:
                if line.name in ("XLA Modules", "XLA Ops", "Steps", "Source code"):
                    continue  # derived lines: the kernels again, grouped
                events += _self_times(line, plane.name, require_hlo_op=False)
        return events, "trace events of the /device:GPU planes (xplane)"
    for plane in data.planes:
        if plane.name.startswith("/host:CPU"):
            for line in plane.lines:
                events += _self_times(line, None, require_hlo_op=True)
    return events, "XLA op events of the /host:CPU plane (xplane)"


def _self_times(line, device: str | None, require_hlo_op: bool) -> list[Event]:
    """The events of one thread or stream with each one's self time: its duration less
    that of the events nested directly inside it."""
    spans = []
    for ev in line.events:
        stats = dict(ev.stats)
        op = stats.get("hlo_op")
        if require_hlo_op and op is None:
            continue
        dev = device if device is not None else f"cpu:{stats.get('device_ordinal', '?')}"
        program = str(stats.get("program_id", ""))
        spans.append((ev.start_ns, ev.duration_ns, ev.name, op or ev.name, dev, program))
    spans.sort(key=lambda s: (s[0], -s[1]))
    child_ns = [0.0] * len(spans)
    stack = []  # indices of open spans
    for i, (start, _, *_rest) in enumerate(spans):
        while stack and spans[stack[-1]][0] + spans[stack[-1]][1] <= start:
            stack.pop()
        if stack:
            child_ns[stack[-1]] += spans[i][1]
        stack.append(i)
    return [
        Event(name, op, max(0.0, dur - child), dev, program)
        for (_, dur, name, op, dev, program), child in zip(spans, child_ns, strict=True)
    ]


def xprof_events(xplane_path: str) -> tuple[list[Event], str] | None:
    """(events, source) from XProf's converters: `kernel_stats` rows (GPU), else `hlo_stats`
    rows (TPU), each row one event of its total time; None where xprof is not installed
    or both tables are empty (a CPU trace)."""
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        return None
    for tool, name_col, op_col, time_col, hint_col in (
        ("kernel_stats", "kernel_name", "op_name", "total_duration_us", None),
        ("hlo_stats", "hlo_op_name", "hlo_op_name", "total_self_time", "category"),
    ):
        data, _ = raw_to_tool_data.xspace_to_tool_data([xplane_path], tool, {})
        if not data:
            continue
        table = json.loads(data)
        table = table[0] if isinstance(table, list) else table
        cols = [c["id"] for c in table["cols"]]
        events = []
        for row in table.get("rows", []):
            v = dict(zip(cols, (c.get("v") for c in row["c"]), strict=False))
            hints = frozenset([v[hint_col]] if hint_col and v.get(hint_col) else [])
            occurrences = max(1, int(v.get("occurrences") or 1))
            # A row as `occurrences` events sharing its time, so counts per step hold.
            # XProf's tables are the whole host's: `summarise` is given the device count.
            per = v[time_col] * 1e3 / occurrences
            event = Event(v[name_col], v.get(op_col) or "", per, "all", hints=hints)
            events += [event] * occurrences
        if events:
            return events, f"xprof {tool} (xprof.convert.raw_to_tool_data)"
    return None


def summarise_trace(
    xplane_path: str, steps: int, devices: int | None = None, use_xprof: bool = True
) -> Summary:
    """The summary of one trace file: XProf's tables where they have rows, else the events."""
    opcodes = hlo_opcodes(xplane_path)
    found = xprof_events(xplane_path) if use_xprof else None
    if found is not None:
        events, source = found
        return dataclasses.replace(
            summarise(events, steps, source, opcodes, devices or 1), trace=xplane_path
        )
    events, source = xplane_events(xplane_path)
    if use_xprof:
        source += "; xprof's tables are empty for this trace" if _has_xprof() else (
            "; xprof is not installed (pip install -e '.[profile]')"
        )  # fmt: skip
    return dataclasses.replace(
        summarise(events, steps, source, opcodes, devices), trace=xplane_path
    )


def _has_xprof() -> bool:
    import importlib.util

    return importlib.util.find_spec("xprof") is not None


# --- Printing ----------------------------------------------------------------------------


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
