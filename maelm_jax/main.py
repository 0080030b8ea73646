"""`python -m maelm_jax.main --config=configs/<name>.py --workdir=DIR [--config.key=value]`.

Every host of a pod runs the same command. On a multi-host TPU/GPU system
`jax.distributed.initialize()` finds its peers by itself; elsewhere (several processes on one
machine, as the tests do) give --coordinator_address, --num_processes and --process_id.
"""

import sys

import jax
from absl import app, flags, logging
from clu import platform
from ml_collections import config_flags

from maelm_jax import metric_logging, platforms, train
from maelm_jax.checkpointing import CheckpointSaveError, silence_writes_after_a_failed_save
from maelm_jax.configuration import ConfigError

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the tokenizer.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (manual multi-process).")
flags.DEFINE_integer("num_processes", None, "Number of processes (manual multi-process).")
flags.DEFINE_integer("process_id", None, "This process's index (manual multi-process).")
flags.DEFINE_string(
    "cpu_collectives", "gloo", "CPU collectives for multi-process CPU runs ('gloo' or 'mpi')."
)
flags.mark_flags_as_required(["config", "workdir"])


def initialize_distributed() -> None:
    """Joins the other processes: explicitly when coordinator flags are given, otherwise
    whenever JAX's cluster auto-detection recognises a multi-host environment."""
    if FLAGS.coordinator_address:
        # Only CPU devices use it; a GPU/TPU run ignores the setting.
        jax.config.update("jax_cpu_collectives_implementation", FLAGS.cpu_collectives)
        jax.distributed.initialize(
            coordinator_address=FLAGS.coordinator_address,
            num_processes=FLAGS.num_processes,
            process_id=FLAGS.process_id,
        )
        return
    # The detectors `jax.distributed.initialize()` itself uses (TPU pods, SLURM, Open MPI,
    # Kubernetes); called without a cluster it would fail, so ask them first.
    from jax._src import clusters

    if any(env.is_env_present() for env in clusters.ClusterEnv._cluster_types):
        jax.distributed.initialize()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    platforms.skip_absent_tpu()
    metric_logging.quiet_library_logs()
    silence_writes_after_a_failed_save()
    initialize_distributed()
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
        train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except (ConfigError, train.NonFiniteLossError, CheckpointSaveError) as e:
        sys.exit(f"maelm_jax: error: {e}")  # one line on stderr, exit status 1


if __name__ == "__main__":
    jax.config.config_with_absl()
    app.run(main)
