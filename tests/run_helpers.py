"""Training runs as the tests see them: CLI subprocesses, in-process reruns, files on disk.

A subprocess is `python -m maelm_jax.main` exactly as a user or a pod launcher starts it, so
signals, exit codes and stderr are the real ones. Its environment is this test session's
(conftest's 8 simulated CPU devices and XLA flags), which keeps its numbers bit-identical to
runs made inside the test process.
"""

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

from etils import epath
from tiny_configs import REPO_ROOT, run_flags

from maelm_jax.checkpoints import manifest
from maelm_jax.config import configdict
from maelm_jax.training import metric_logging, train


def main_command(config, workdir) -> list[str]:
    """The command line a user types for `config`."""
    return [
        sys.executable, "-m", "maelm_jax.main", "--config=configs/default.py",
        f"--workdir={workdir}", *run_flags(config),
    ]  # fmt: skip


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu")


def run(config, workdir, prefix=(), timeout=600) -> tuple[int, str]:
    """Runs the CLI on `config` to its end (behind `prefix`, e.g. a shell setting a limit):
    (exit status, everything it printed). Output goes through a pipe, never a file, so a
    file-size limit on the run cannot swallow its last words."""
    result = subprocess.run(
        [*prefix, *main_command(config, workdir)],
        cwd=REPO_ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return result.returncode, result.stdout


def start(config, workdir, log_path) -> subprocess.Popen:
    """Starts the CLI on `config` in the background; its output goes to `log_path`, since a
    pipe nobody reads while the test waits would fill up and stall the run."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            main_command(config, workdir),
            cwd=REPO_ROOT,
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def finish(proc: subprocess.Popen, log_path, timeout=600) -> tuple[int, str]:
    """(exit status, everything it printed) once `proc` has ended."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, epath.Path(log_path).read_text()


def checksums(root) -> dict[str, str]:
    """{path under `root`: sha256} of every file below `root`: what "intact" compares."""
    root = pathlib.Path(root)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def step_dirs(workdir) -> dict[int, epath.Path]:
    """{step: directory} of the numbered (not renamed, not temporary) checkpoint dirs."""
    root = epath.Path(workdir) / manifest.CHECKPOINT_DIRNAME
    if not root.exists():
        return {}
    return {int(p.name): p for p in root.iterdir() if p.name.isdigit()}


def committed_steps(workdir) -> list[int]:
    """Steps that Orbax committed and that carry the manifest: what a rerun may resume."""
    done = []
    for step, path in step_dirs(workdir).items():
        if (path / manifest.ORBAX_COMMIT).exists() and (path / manifest.MANIFEST).exists():
            done.append(step)
    return sorted(done)


def good_steps(workdir) -> list[int]:
    """Steps whose files all match their manifest."""
    dirs = step_dirs(workdir)
    return sorted(s for s, path in dirs.items() if manifest.problem_with(path) is None)


def wait_for_checkpoint(proc: subprocess.Popen, workdir, timeout=600) -> int:
    """Polls until `proc` has committed a checkpoint and returns its step; fails if the run
    ends or times out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = committed_steps(workdir)
        if steps:
            return steps[0]
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before any checkpoint")
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint in {workdir} after {timeout}s")


def losses(workdir) -> dict[int, float]:
    """{step: train/loss} as a reader of metrics.jsonl sees it (the last line per step)."""
    rows = metric_logging.read_metrics(workdir)
    return {step: row["train/loss"] for step, row in rows.items() if "train/loss" in row}


def _metric_lines(workdir) -> list[dict]:
    path = epath.Path(workdir) / metric_logging.METRICS_FILENAME
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_in_process(config, workdir) -> dict[int, float]:
    """Runs `train_and_evaluate` here (cheaper than a subprocess: no imports, no startup)
    and returns {step: train/loss} of the lines *this* run appended to metrics.jsonl, so a
    resumed run shows where it started."""
    seen = len(_metric_lines(workdir))
    train.train_and_evaluate(configdict.freeze(config), workdir)
    new = _metric_lines(workdir)[seen:]
    return {row["step"]: row["train/loss"] for row in new if "train/loss" in row}
