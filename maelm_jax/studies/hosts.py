"""Which process does which stage of a study that runs on several processes (a pod).

Pretraining needs every process in one `jax.distributed` job: it is the ordinary training
path, sharded over every host's chips. What follows it needs one: an export and its rank
read a checkpoint, and PyTorch fine-tunes the export from files. So every process pretrains
each objective in turn, process 0 alone writes the corpus, the spec and the markers, and once
the last objective is pretrained the processes leave the job together. Process 0 goes on
alone; its JAX runtime still belongs to the job (its process count is the pod's, a
collective would wait for hosts that left), so the export and the rank run as commands in
a fresh CPU runtime of their own.

The study's folder must be the same folder on every host (NFS, a bucket mounted with
gcsfuse; docs/evaluation.md says what each needs): the other processes read what process 0
wrote. A process that does not see the spec is refused, every process with it.
"""

import os
import subprocess
import sys

import jax

from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import multihost


def many() -> bool:
    return jax.process_count() > 1


def joined() -> bool:
    """In a `jax.distributed` job, of several processes or (given a coordinator) of one."""
    from jax._src import distributed

    return distributed.global_state.client is not None


def on_process_0(what: str, work):
    """`work()`'s result on process 0 (None on the others); if it raises, every process
    raises with it (collective), so no host walks on into the next stage alone."""
    result, error = None, None
    if jax.process_index() == 0:
        try:
            result = work()
        except Exception as e:  # re-raised below, after the others have heard of it
            error = e
    multihost.raise_together(error, what)
    return result


def check_shared(study_dir: str, spec_file: str) -> None:
    """Collective, after process 0 wrote the spec: every process must see it."""
    error = None
    if not os.path.isfile(os.path.join(study_dir, spec_file)):
        error = ConfigError(
            f"--study_dir={study_dir}: process {jax.process_index()} does not see the "
            f"{spec_file} that process 0 wrote there; a study on several hosts needs one "
            "folder that every host mounts (NFS, or a bucket through gcsfuse)"
        )
    multihost.raise_together(error, f"looking for {spec_file} in --study_dir={study_dir}")


def leave_job() -> bool:
    """Every process leaves the `jax.distributed` job together (its shutdown is a barrier);
    True on process 0, which goes on alone."""
    lead = jax.process_index() == 0
    jax.distributed.shutdown()
    return lead


def run_command(module: str, *args: str) -> None:
    """`python -m maelm_jax.<module> ARGS` in a CPU runtime of its own (see the module doc);
    its last line of stderr is the error when it fails."""
    command = [sys.executable, "-m", f"maelm_jax.{module}", *args]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`python -m maelm_jax.{module} {' '.join(args)}` failed: {last}")
