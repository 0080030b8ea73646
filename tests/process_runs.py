"""`python -m maelm_jax.main` as subprocesses: one, or several joined by `jax.distributed` on
localhost with gloo, each with its own simulated CPU devices (as launch/local_processes.sh).

Every process is waited for under one deadline and killed if it outlives it, so a deadlocked
collective fails the test quickly instead of hanging it.
"""

import contextlib
import dataclasses
import os
import pathlib
import socket
import subprocess
import sys
import time

from tiny_configs import REPO_ROOT
from xla_flags import FAST_COMPILE

DEVICES_PER_PROCESS = 4
# What libtpu prints on a machine without TPU chips when JAX tries its backend (platforms.py).
TPU_INIT_ERRORS = (
    "Failed to find host bounds for accelerator type",
    "unexpected worker hostname",
    "Unable to initialize backend 'tpu'",
)


def users_machine(env: dict[str, str]) -> dict[str, str]:
    """`env` as a user's shell on a GPU box has it: JAX left to choose its backend (no
    JAX_PLATFORMS), none of the libtpu variables that in-process TPU compiles set, and an
    importable mpi4py on PYTHONPATH (tests/mpi4py_importable), as NVIDIA's containers ship."""
    dropped = ("JAX_PLATFORMS", "ALLOW_MULTIPLE_LIBTPU_LOAD")
    env = {n: v for n, v in env.items() if n not in dropped and not n.startswith("TPU_")}
    mpi4py = REPO_ROOT / "tests" / "mpi4py_importable"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(mpi4py)])
    return env


def free_port() -> int:
    """A localhost TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def process_env(devices: int = DEVICES_PER_PROCESS) -> dict[str, str]:
    """The caller's environment with a CPU-only JAX of `devices` devices; the XLA flags
    replace the pytest process's (which asks for 8 devices)."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


@dataclasses.dataclass(frozen=True)
class ProcessResult:
    process_id: int
    returncode: int
    stdout: str
    stderr: str

    def tail(self, chars: int = 3000) -> str:
        return f"--- process {self.process_id} (rc={self.returncode}) ---\n{self.stderr[-chars:]}"


def describe(results: list[ProcessResult], chars: int = 3000) -> str:
    return "\n".join(r.tail(chars) for r in results)


def run_main(
    flags: list[str],
    *,
    num_processes: int,
    log_dir: pathlib.Path,
    timeout: float,
    devices: int = DEVICES_PER_PROCESS,
    extra_env: dict[int, dict[str, str]] | None = None,
) -> list[ProcessResult]:
    """Runs `python -m maelm_jax.main --config=configs/default.py FLAGS` as `num_processes`
    processes (process i adds --process_id=i and the coordinator flags when there are
    several) and waits for all of them.

    stdout/stderr of process i go to `log_dir/process_<i>.{out,err}`. Raises AssertionError,
    with the log tails, if any process is still running `timeout` seconds after the start;
    every process started here is killed before this returns or raises. `extra_env[i]` adds
    environment variables to process i only.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "maelm_jax.main", "--config=configs/default.py", *flags]
    if num_processes > 1:
        command += [
            f"--coordinator_address=localhost:{free_port()}",
            f"--num_processes={num_processes}",
            "--cpu_collectives=gloo",
        ]
    procs: list[subprocess.Popen] = []
    stuck = []
    with contextlib.ExitStack() as files:
        try:
            for i in range(num_processes):
                out = files.enter_context(open(log_dir / f"process_{i}.out", "w"))
                err = files.enter_context(open(log_dir / f"process_{i}.err", "w"))
                extra = [f"--process_id={i}"] if num_processes > 1 else []
                procs.append(
                    subprocess.Popen(
                        command + extra,
                        cwd=REPO_ROOT,
                        env=process_env(devices) | (extra_env or {}).get(i, {}),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                    )
                )
            deadline = time.monotonic() + timeout
            for i, proc in enumerate(procs):
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    stuck.append(i)
        finally:
            for proc in procs:  # only the processes started here, by their own handles
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    results = [
        ProcessResult(
            process_id=i,
            returncode=proc.returncode,
            stdout=(log_dir / f"process_{i}.out").read_text(errors="replace"),
            stderr=(log_dir / f"process_{i}.err").read_text(errors="replace"),
        )
        for i, proc in enumerate(procs)
    ]
    if stuck:
        raise AssertionError(
            f"processes {stuck} of {num_processes} still ran after {timeout}s (deadlock?); "
            f"killed them\n{describe(results)}"
        )
    return results
