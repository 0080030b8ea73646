"""Whether the train and eval programs fit in the devices' memory, checked before step 0.

A config too big for its devices would prepare its data, start the step-0 eval and die in
XLA's RESOURCE_EXHAUSTED traceback. The compiled programs know their memory
(`Compiled.memory_analysis()`, which `maelm_jax.compile` reads for a TPU slice), so `check`
compiles them ahead of time through the same jitted functions the loop calls: JAX's call
cache keeps the executables, and the first step and eval run them without compiling again.

A device's memory is what JAX's allocator may still hand out (`memory_stats()`: "bytes_limit"
less "bytes_in_use") on a GPU or TPU; on a CPU, the host's available memory (MemAvailable,
capped by the cgroup's limit less its use) shared by the process's CPU devices.
`MAELM_JAX_DEVICE_MEMORY_BYTES` replaces it, e.g. on a host shared with other jobs.
"""

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
from absl import logging

from maelm_jax.aot.memory import Memory, required_bytes
from maelm_jax.config.run_config import ConfigError, RunConfig
from maelm_jax.hardware import multihost
from maelm_jax.step import programs, sharding

ENV_VAR = "MAELM_JAX_DEVICE_MEMORY_BYTES"
WARN_SHARE = 0.9  # a line of warning above this share of a device; refused above all of it
CGROUP_ROOT = "/sys/fs/cgroup"
_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2**63
_UNITS = "BKMGT"


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    bytes: int  # per device
    source: str  # where the number came from, for the message


def human_bytes(n: int) -> str:
    if n >= 2**28:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def parse_size(text: str) -> int:
    """'21474836480', '20GiB', '20G', '512 MiB' -> bytes (units are binary)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not match:
        raise ConfigError(
            f"{ENV_VAR}={text!r} is no size: give bytes (21474836480), a size with a binary "
            "unit (20GiB, 512MiB), or 'off' to skip the memory check"
        )
    return int(float(match[1]) * 1024 ** _UNITS.index(match[2].upper() or "B"))


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # absent, or "max" (cgroup v2's no limit)
        return None


def host_available_bytes(meminfo: str = "/proc/meminfo", cgroup_root: str = CGROUP_ROOT):
    """The memory this process could still take: MemAvailable, or less where a cgroup limit
    (v2 `memory.max`, v1 `memory.limit_in_bytes`) is nearer; None where neither is known."""
    available = None
    try:
        with open(meminfo) as f:
            match = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
        available = int(match[1]) * 1024 if match else None
    except OSError:
        pass
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        limit = _read_int(os.path.join(cgroup_root, limit_file))
        usage = _read_int(os.path.join(cgroup_root, usage_file))
        if limit is not None and limit < _NO_LIMIT and usage is not None:
            left = max(limit - usage, 0)
            available = left if available is None else min(available, left)
            break
    return available


def device_memory(devices: list, environ=os.environ) -> DeviceMemory | None:
    """What each of this process's `devices` can hold; None: unknown, or the check is off."""
    override = environ.get(ENV_VAR, "").strip()
    if override.lower() == "off":
        return None
    if override:
        return DeviceMemory(parse_size(override), f"{ENV_VAR}={override}")
    if devices[0].platform == "cpu":
        available = host_available_bytes()
        if available is None:
            return None
        shared = f", shared by {len(devices)} CPU devices" if len(devices) > 1 else ""
        return DeviceMemory(available // len(devices), f"the host's available memory{shared}")
    stats = [d.memory_stats() or {} for d in devices]
    if not all("bytes_limit" in s for s in stats):
        return None
    free = min(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)
    return DeviceMemory(free, f"{devices[0].device_kind}'s free memory for JAX")


def _compiled_memory(jitted, args, progs: programs.Programs) -> tuple[Memory | None, int | None]:
    """(the program's memory per device, its total); after a compile-time out-of-memory (TPU),
    (None, the compiler's lower bound on the total, or None)."""
    with sharding.activate(progs.mesh, progs.rules):
        lowered = jitted.lower(*args)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return None, required_bytes(str(e))
    memory = Memory.of(compiled)
    return memory, memory.total


def needs(run: RunConfig, progs: programs.Programs) -> dict[str, int | None]:
    """Per-device bytes of {"train": the train step, "eval": an eval step while the train
    state is held} (no "eval" without eval batches); None where a compile ran out of memory
    and said nothing of how much it needed."""
    state = progs.abstract_state()  # outside the rules context, as for AOT compiles
    batch = progs.abstract_batch(run.batch_size, run.seq_len)
    train, train_total = _compiled_memory(progs.train_step, (state, batch), progs)
    found = {"train": train_total}
    if run.loop.eval_batches:
        index = jax.ShapeDtypeStruct((), jnp.int32)
        evaluate, eval_total = _compiled_memory(
            progs.eval_step, (state.params, batch, index), progs
        )
        # While an eval runs, the whole train state and a batch are held: the train step's
        # arguments, in place of the eval's own (params, batch).
        held = train.arguments - evaluate.arguments if train and evaluate else 0
        found["eval"] = None if eval_total is None else eval_total + held
    return found


def _advice(run: RunConfig, over: list[str], platform: str) -> str:
    advice = [f"lower batch_size (now {run.batch_size})"]
    if "eval" in over:
        advice.append("set eval_batches=0 to run no eval (each eval batch is batch_size rows)")
    if "train" in over:
        advice.append(
            f"raise grad_accum_steps (now {run.loop.grad_accum_steps}) or set "
            f"model.remat_policy (now {run.model.remat_policy!r}) to 'full' or 'dots_saveable'"
        )
    if platform == "tpu":
        advice.append("`python -m maelm_jax.compile --topology=... --max_batch` sizes the batch")
    return "; ".join(advice)


def _override_hint(memory: DeviceMemory) -> str:
    if memory.source.startswith(ENV_VAR):
        return ""
    return f" ({ENV_VAR}=<bytes> replaces the memory read here)"


def verdict(run: RunConfig, need: dict[str, int | None], memory: DeviceMemory, platform: str):
    """(a ConfigError if a program needs more than a device has, else None; a warning line
    if one needs more than WARN_SHARE of it, else None)."""
    known = {name: n for name, n in need.items() if n is not None}
    over = [name for name, n in need.items() if n is None or n > memory.bytes]
    close = [name for name, n in known.items() if n > WARN_SHARE * memory.bytes]
    if not close and not over:
        return None, None
    named = ", ".join(
        f"the {name} step {'?' if n is None else human_bytes(n)}"
        + (" (with the train state held)" if name == "eval" else "")
        for name, n in need.items()
    )
    has = f"a device has {human_bytes(memory.bytes)} ({memory.source})"
    if over:
        return ConfigError(
            f"the programs do not fit in device memory: per device {named}, and {has}; "
            f"{_advice(run, over, platform)}{_override_hint(memory)}"
        ), None
    return None, (
        f"The programs fill over {WARN_SHARE:.0%} of device memory: per device {named}, and "
        f"{has}; if the run runs out of memory, {_advice(run, close, platform)}"
    )


def check(run: RunConfig, progs: programs.Programs) -> None:
    """Collective. Raises a one-line ConfigError on every process if a program needs more
    memory than one of its devices has (each process checks its own devices); compiles the
    train and eval programs for the loop."""
    error = None
    try:
        devices = progs.mesh.local_devices
        memory = device_memory(devices)
        need = needs(run, progs)  # compiled even when unchecked: the loop runs them next
        if memory is None:
            logging.info("Device memory unknown or %s=off: programs need %s", ENV_VAR, need)
        else:
            error, warning = verdict(run, need, memory, devices[0].platform)
            if warning:
                logging.warning(warning)
    except ConfigError as e:
        error = e
    multihost.raise_together(error, "checking that the programs fit in device memory")
