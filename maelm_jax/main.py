"""`python -m maelm_jax.main --config=configs/<name>.py --workdir=DIR [--config.key=value]`.

Every host of a pod runs the same command. On a multi-host TPU/GPU system
`jax.distributed.initialize()` finds its peers by itself; elsewhere (several processes on one
machine, as the tests do) give --coordinator_address, --num_processes and --process_id.

Bad input is answered before the heavy modules (TensorFlow, Orbax, the model) load: the
flags and config (`cli`), the config's values (`configdict.freeze`), the workdir and its
lease (`workdir_lease`) are checked first, each failure one line and a non-zero exit.
"""

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from maelm_jax.checkpoints import workdir_lease
from maelm_jax.config import cli, configdict
from maelm_jax.config.run_config import ConfigError, RunConfig
from maelm_jax.hardware import distributed, multihost, platforms

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the tokenizer.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (manual multi-process).")
flags.DEFINE_integer("num_processes", None, "Number of processes (manual multi-process).")
flags.DEFINE_integer("process_id", None, "This process's index (manual multi-process).")
flags.DEFINE_string(
    "cpu_collectives", "gloo", "CPU collectives for multi-process CPU runs ('gloo' or 'mpi')."
)
flags.DEFINE_string(
    "cluster_detection",
    distributed.cluster_detection_default(),
    "How a multi-host run finds its peers without --coordinator_address: 'auto' (TPU pods, "
    "SLURM, Open MPI's mpirun, Indexed Kubernetes Jobs), 'none', or one of JAX's detectors "
    f"by name, e.g. 'mpi4py' (default: ${distributed.CLUSTER_ENV_VAR} or 'auto').",
)
flags.DEFINE_integer(
    "profiler_port", 0, "If > 0, serve jax.profiler here, so traces can be captured on demand."
)
flags.mark_flags_as_required(["config", "workdir"])


def _take_lease(workdir) -> workdir_lease.Lease | None:
    """Process 0 holds the workdir's lease; the others learn whether it got it."""
    lease, error = None, None
    if jax.process_index() == 0:
        try:
            lease = workdir_lease.acquire(workdir)
        except ConfigError as e:
            error = e
    multihost.raise_together(error, "taking the workdir lease")
    return lease


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    platforms.skip_absent_tpu()
    run = configdict.freeze(FLAGS.config)
    workdir_lease.check_workdir(FLAGS.workdir)
    distributed.initialize(
        FLAGS.coordinator_address,
        FLAGS.num_processes,
        FLAGS.process_id,
        FLAGS.cpu_collectives,
        FLAGS.cluster_detection,
    )
    lease = _take_lease(FLAGS.workdir)
    status, failure = 1, None
    try:
        status, failure = _run(run)
    finally:
        if lease is not None:
            lease.release()
    if failure is not None:
        multihost.leave_together()
        cli.exit_now(status, failure)


def _run(run: RunConfig) -> tuple[int, str | None]:
    """The run itself; returns (exit status, the one line of an error the user can act on)
    for a run that did not finish: 1 for an error, 130 for Ctrl-C (after its save)."""
    from clu import platform

    from maelm_jax.checkpoints.save_errors import (
        CheckpointSaveError,
        silence_writes_after_a_failed_save,
    )
    from maelm_jax.training import preemption, train

    cli.quiet_library_logs()
    silence_writes_after_a_failed_save()
    if FLAGS.profiler_port:
        jax.profiler.start_server(FLAGS.profiler_port)  # launch/profile.sh captures from it
    logging.info(
        "Process %d of %d; local devices: %s",
        jax.process_index(),
        jax.process_count(),
        jax.local_devices(),
    )
    platform.work_unit().set_task_status(
        f"process_index: {jax.process_index()}, process_count: {jax.process_count()}"
    )
    platform.work_unit().create_artifact(platform.ArtifactType.DIRECTORY, FLAGS.workdir, "workdir")
    try:
        train.train_and_evaluate(run, FLAGS.workdir)
    except (ConfigError, train.NonFiniteLossError, CheckpointSaveError) as e:
        return 1, str(e)
    except preemption.Interrupted as e:
        return preemption.EXIT_INTERRUPTED, str(e)
    return 0, None


if __name__ == "__main__":
    jax.config.config_with_absl()
    cli.run(main)
