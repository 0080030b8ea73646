"""Reading a `jax.profiler` trace for `summary`: the trace of a few real train steps
(`trace_steps`), the `.xplane.pb` it leaves, the HLO opcodes stored in it, and its kernel
events, from XProf's converters where the `xprof` package has rows for them, else from the
events themselves (`summary`'s module docstring says which, and why)."""

import dataclasses
import glob
import json
import os
import re

import jax

from maelm_jax.config.run_config import RunConfig
from maelm_jax.profiling.summary import Event, Summary, summarise
from maelm_jax.training import step_speed


def trace_steps(config: RunConfig, steps: int, logdir: str) -> tuple[str, float]:
    """(the trace's .xplane.pb, wall ms per traced step) of `steps` steps of `config`'s
    train step (built as `bench speed` builds it), after its compile and a warm-up step."""
    timed = step_speed.Timed("kernels", config)  # compiles, runs a step
    timed.run(1)  # warm-up: the first step's one-off work stays out of the trace
    jax.profiler.start_trace(logdir)
    try:
        seconds = timed.run(steps)
    finally:
        jax.profiler.stop_trace()
    return find_xplane(logdir), seconds / steps * 1e3


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
