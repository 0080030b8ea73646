"""Agreement between processes, so one host's failure never leaves the others waiting.

Every host of a pod runs the same program; if one raises while the others walk on into the
next collective (a barrier, an all-gather, a checkpoint), they wait there until a timeout
kills the job with no useful message. Where only some processes can fail, they instead all
reach one of these calls, learn who failed, and fail together with a clear error.
"""

import contextlib

import jax
import numpy as np
from jax.experimental import multihost_utils

from maelm_jax.config.run_config import ConfigError


def all_true(ok: bool) -> bool:
    """True only if `ok` on every process; a barrier when there are several."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def raise_together(error: Exception | None, what: str) -> None:
    """Collective. Re-raises `error` if this process has one; if only another process has
    one, raises a ConfigError that names the failed processes and `what` they were doing."""
    if jax.process_count() > 1:
        failed = multihost_utils.process_allgather(np.asarray(error is not None))
        failed = [int(i) for i in np.flatnonzero(failed)]
        if failed and error is None:
            raise ConfigError(f"process(es) {failed} failed while {what}; their own error says why")
    if error is not None:
        raise error


def gather_ints(value: int) -> list[int]:
    """Every process's `value`, in process order (collective)."""
    if jax.process_count() == 1:
        return [int(value)]
    return [int(v) for v in multihost_utils.process_allgather(np.asarray(value, np.int64))]


def leave_together() -> None:
    """Before a failing process exits: waits (up to `jax.distributed`'s shutdown timeout) for
    the other processes to leave too.

    Process 0 hosts the coordination service. A config error that every process raises on
    its own reaches process 0 first when another process is still importing, and if process 0
    then exits at once the others lose the service and abort (SIGABRT) instead of printing
    the same one-line error. `jax.distributed.shutdown()` is that barrier; a process that
    never gets there (stuck elsewhere) costs the timeout, not a hang.
    """
    from jax._src import distributed

    if distributed.global_state.client is None:
        return
    with contextlib.suppress(Exception):  # exiting with an error anyway; others say why
        jax.distributed.shutdown()
