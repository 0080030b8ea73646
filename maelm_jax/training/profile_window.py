"""An XProf trace of a chosen window of training steps, on process 0 only.

`config.profile_start_step` / `config.profile_num_steps` pick the steps; the first step of a
run compiles and is never worth tracing, so the window must start after it. The trace lands
in `<workdir>/plugins/profile/<timestamp>/` (open it with `tensorboard --logdir=<workdir>` and
the `xprof` package, the `profile` extra). Each step is a `train` step marker (the loop's
`StepTraceAnnotation`), and its ops carry the named scopes `encoder`, `decoder`, `lm_head`,
`loss` and `optimizer` (jvp(...) forward, transpose(jvp(...)) backward).
"""

import os

import jax
from absl import logging


class ProfileWindow:
    """A loop hook, called with `done` (steps dispatched so far) after each dispatch.

    Tracing starts before step `start` is dispatched. The loop reads a step's metrics (and
    so waits for it) once the next one is dispatched; stopping one call after the last
    traced step is dispatched leaves every traced step finished inside the trace.
    """

    def __init__(self, logdir: str | os.PathLike, start: int, num_steps: int, first_step: int):
        self._logdir = os.fspath(logdir)
        self._start = start
        self._stop = start + num_steps + 1
        self._running = False
        if num_steps <= 0:  # no window: a step equal to `start` must not open one
            self._start = self._stop = -1
        elif start <= first_step:
            logging.warning(
                "profile_start_step=%d is not after this run's first step %d (which compiles): "
                "no trace",
                start,
                first_step,
            )
            self._start = self._stop = -1

    def __call__(self, done: int) -> None:
        if done == self._start:
            jax.profiler.start_trace(self._logdir)
            self._running = True
            logging.info("Profiling steps %d..%d", self._start, self._stop - 2)
        elif done == self._stop and self._running:
            self.close()

    def close(self) -> None:
        """Ends a trace the run stopped inside of (the last step, a preemption)."""
        if self._running:
            jax.profiler.stop_trace()
            self._running = False
            logging.info("Wrote an XProf trace to %s", self._logdir)
