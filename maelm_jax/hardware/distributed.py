"""Joining the other processes of a run (`main` and `study` run on every host).

On a multi-host TPU/GPU system JAX's cluster detection finds the peers by itself; elsewhere
(several processes on one machine, as the tests do) the commands' coordinator flags say who
is who.
"""


def initialize(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    cpu_collectives: str,
) -> None:
    """Explicitly when a coordinator address is given, otherwise whenever JAX's cluster
    auto-detection recognises a multi-host environment; a lone process does nothing."""
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
    # The detectors `jax.distributed.initialize()` itself uses (TPU pods, SLURM, Open MPI,
    # Kubernetes); called without a cluster it would fail, so ask them first.
    from jax._src import clusters

    if any(env.is_env_present() for env in clusters.ClusterEnv._cluster_types):
        jax.distributed.initialize()
