"""Joining the other processes of a run (`main` and `study` run on every host).

On a multi-host TPU/GPU system JAX's cluster detection finds the peers by itself; elsewhere
(several processes on one machine, as the tests do) the commands' coordinator flags say who
is who.

What counts as a cluster is narrower than what JAX's detectors report present. A detector
that says "present" makes `jax.distributed.initialize()` a must, and a single-host run must
not need one:
- mpi4py's detector is opt-in in JAX (`Mpi4pyCluster.opt_in_only_method`): it is "present"
  wherever the package imports, as in NVIDIA's containers. JAX's own initialize skips it,
  so asking it made a one-GPU machine fail with "coordinator_address should be defined".
  `--cluster_detection=mpi4py` (or MAELM_CLUSTER_DETECTION=mpi4py) opts in under `mpirun`.
- Kubernetes' detector is "present" in any pod whose image has the `kubernetes` package,
  and then asks the API server for the pod's Job: a lone pod (one GPU, no Job) fails. A
  pod of an Indexed Job, the shape a multi-pod JAX job takes, carries
  JOB_COMPLETION_INDEX; only such a pod counts.
- A cluster of one process is a lone process: a single-task `srun`, `mpirun -np 1`, and a
  one-host Cloud TPU VM (v4-8, v5p-8, v6e-8: its metadata names it worker 0 of a slice of
  one, and JAX's TPU detector says "present") have no peer to join, and a job of one would
  only hold a coordination client that a study must not keep past pretraining (its
  accelerator handover refuses while one lives).
"""

import os

from maelm_jax.config.run_config import ConfigError

CLUSTER_ENV_VAR = "MAELM_CLUSTER_DETECTION"
# "auto": JAX's automatic detectors, as narrowed above; "none": never join a cluster;
# any other value is one of JAX's detectors by name, asked alone (opt-in ones included).
AUTO, NONE = "auto", "none"


def cluster_detection_default() -> str:
    return os.environ.get(CLUSTER_ENV_VAR) or AUTO


def _detectors():
    from jax._src import clusters  # JAX's registry of cluster environments

    return clusters.ClusterEnv._cluster_types


def detector_names() -> list[str]:
    return sorted(env.name for env in _detectors() if env.name)


def _counts(env) -> bool:
    """Whether an automatically detected environment is a cluster this run must join."""
    if env.opt_in_only_method:
        return False
    if env.__name__ == "K8sCluster" and "JOB_COMPLETION_INDEX" not in os.environ:
        return False  # checked before is_env_present, which calls the API server
    return env.is_env_present()


def _of_one(env) -> bool:
    """Whether the environment's job has a single process. A detector that cannot say (its
    metadata server or API unreachable) counts as a cluster: joining it reports why."""
    try:
        return int(env.get_process_count()) == 1
    except Exception:  # whatever the detector's own lookup raises
        return False


def detected_cluster(method: str) -> str | None:
    """The name of the cluster environment `method` joins, None for a lone process (a job of
    one process among them); ConfigError for a method JAX does not know, or one whose
    environment is absent."""
    if method == NONE:
        return None
    if method == AUTO:
        found = next((env for env in _detectors() if _counts(env)), None)
        return None if found is None or _lone(found) else (found.name or found.__name__)
    env = next((env for env in _detectors() if env.name == method), None)
    if env is None:
        raise ConfigError(
            f"--cluster_detection={method!r}: use {AUTO!r}, {NONE!r} or one of JAX's "
            f"detectors {detector_names()}"
        )
    if not env.is_env_present():
        raise ConfigError(
            f"--cluster_detection={method!r}: that environment is not present here (for "
            "mpi4py: the package must import and the command run under mpirun)"
        )
    return None if _lone(env) else method


def _lone(env) -> bool:
    if not _of_one(env):
        return False
    from absl import logging

    logging.info(
        "%s: a job of one process; it runs as a lone process (no jax.distributed job)",
        env.name or env.__name__,
    )
    return True


def initialize(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    cpu_collectives: str,
    cluster_detection: str = AUTO,
) -> None:
    """Explicitly when a coordinator address is given, otherwise when `detected_cluster`
    names an environment; a lone process does nothing."""
    import jax  # here, not at the top: `study` answers bad flags before JAX loads

    if coordinator_address:
        # Only CPU devices use it; a GPU/TPU run ignores the setting.
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
        return
    name = detected_cluster(cluster_detection)
    if name is None:
        return
    if cluster_detection == AUTO:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(cluster_detection_method=name)
