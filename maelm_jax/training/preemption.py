"""Noticing preemption at a step boundary that every process agrees on.

With several processes, JAX's preemption sync manager (started by
`jax.distributed.initialize`) catches SIGTERM and `reached_preemption_sync_point` turns it
into the same step on every host, so all of them join the final checkpoint. A single process
has no such service, so a SIGTERM handler raises a flag that the loop reads at its next step.

Ctrl-C (SIGINT) in a single process is a SIGTERM: the run saves at the next step and stops,
but then raises `Interrupted`, which `main` turns into exit status 130 (the shell's 128 +
SIGINT), so a script can tell a run stopped by hand from a finished one (exit 0, as after a
preemption, which the launcher reruns). A second Ctrl-C, for someone who will not wait for
the save, ends the process at once (the checkpoints already committed stay good; the one
being written is never committed).

A caller that goes on after training (`study`'s next stage) must not take a preempted run
for a finished one: `train_and_evaluate` returns the step it stopped at, and `Preempted`
is what such a caller raises when that step is short of the last.
"""

import os
import signal
import sys

import jax
from absl import logging
from jax.experimental import multihost_utils

EXIT_INTERRUPTED = 130
# The shell's 128 + SIGTERM: a study stopped by a preemption, its progress saved.
EXIT_PREEMPTED = 143


class Interrupted(Exception):
    """Ctrl-C stopped the run before its last step, after its checkpoint was saved."""


class Preempted(Exception):
    """A preemption stopped training before its last step, after its checkpoint was saved."""


class PreemptionWatcher:
    def __init__(self):
        self.reason = None
        self._previous_handlers = {}
        if jax.process_count() == 1:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        name = signal.Signals(signum).name
        if self.reason is not None and signum == signal.SIGINT:
            logging.flush()
            sys.stderr.write(f"maelm_jax: error: {name} again: stopped without saving\n")
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        self.reason = name
        hint = " (Ctrl-C again to stop at once, without saving)" if name == "SIGINT" else ""
        logging.warning("Received %s: saving a checkpoint at the next step boundary%s", name, hint)

    def reached(self, step: int) -> bool:
        """True (on every process alike) when the run should checkpoint and stop at `step`."""
        if self.reason is not None:
            return True
        if jax.process_count() > 1 and multihost_utils.reached_preemption_sync_point(step):
            self.reason = "a preemption notice (JAX preemption sync point)"
        return self.reason is not None

    def close(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}
