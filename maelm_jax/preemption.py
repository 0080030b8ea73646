"""Noticing preemption at a step boundary that every process agrees on.

With several processes, JAX's preemption sync manager (started by
`jax.distributed.initialize`) catches SIGTERM and `reached_preemption_sync_point` turns it
into the same step on every host, so all of them join the final checkpoint. A single process
has no such service, so a SIGTERM handler raises a flag that the loop reads at its next step.
"""

import signal

import jax
from absl import logging
from jax.experimental import multihost_utils


class PreemptionWatcher:
    def __init__(self):
        self.reason = None
        self._previous_handler = None
        if jax.process_count() == 1:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self.reason = "SIGTERM"
        logging.warning("Received SIGTERM: saving a checkpoint at the next step boundary")

    def reached(self, step: int) -> bool:
        """True (on every process alike) when the run should checkpoint and stop at `step`."""
        if self.reason is not None:
            return True
        if jax.process_count() > 1 and multihost_utils.reached_preemption_sync_point(step):
            self.reason = "a preemption notice (JAX preemption sync point)"
        return self.reason is not None

    def close(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None
