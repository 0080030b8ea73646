"""Throughput for the log line: steps/s, tokens/s, model TFLOP/s, MFU, the ETA, and the
share of time that eval and checkpoints took.

Model FLOPs are the analytic count of the running config (`flop_count`: what the model
needs, not what rematerialisation recomputes), so MFU compares methods fairly: 3ML does
fewer FLOPs per step and is not credited for the ones it skips. The clock starts once the
first `WARMUP_STEPS` steps have finished (the first compiles; the next may still wait on
the input pipeline or a second compile), so the rates describe the steady state; log
lines before that carry none.
"""

import contextlib
import dataclasses
import datetime
import time

import jax
import jax.numpy as jnp

from maelm_jax.config.run_config import RunConfig
from maelm_jax.hardware import accelerators
from maelm_jax.model import flop_count

WARMUP_STEPS = 2


class Throughput:
    """Fed one `step_done()` per finished step; `row()` gives the rates since the last row."""

    def __init__(
        self,
        flops_per_step: float,
        tokens_per_step: int,
        peak_flops: float | None,
        steps_left: int,
    ):
        self.flops_per_step = flops_per_step
        self.tokens_per_step = tokens_per_step
        self.peak_flops = peak_flops  # all devices together; None: no MFU
        self._steps_left = steps_left
        self._done = 0
        self._mark = None  # (steps done, time) where the current window began
        self._sections: dict[str, float] = {}  # seconds in `timed` sections this window

    @classmethod
    def for_run(cls, run: RunConfig, vocab_size: int, start_step: int) -> "Throughput":
        """For `run` with the tokenizer's `vocab_size`, on all of JAX's devices."""
        run = dataclasses.replace(run, model=run.model.for_vocab(vocab_size))
        flops = flop_count.step_flops(run, flop_count.num_params(run))
        per_device = run.loop.peak_flops_per_device or accelerators.peak_flops(
            jax.devices()[0].device_kind, jnp.dtype(run.model.dtype).name
        )
        peak = per_device * jax.device_count() if per_device else None
        tokens = run.batch_size * run.seq_len
        return cls(flops, tokens, peak, run.loop.num_train_steps - start_step)

    def step_done(self) -> None:
        self._done += 1
        if self._done == WARMUP_STEPS:
            self._mark = (self._done, time.perf_counter())
            self._sections = {}

    @contextlib.contextmanager
    def timed(self, section: str):
        """Time spent in `section` (eval, checkpoint) appears as `time_share/<section>`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self._sections[section] = self._sections.get(section, 0.0) + seconds

    def row(self) -> dict[str, float]:
        if self._mark is None:
            return {}
        now = time.perf_counter()
        steps, seconds = self._done - self._mark[0], now - self._mark[1]
        if steps == 0 or seconds <= 0:
            return {}
        self._mark = (self._done, now)
        flops_per_sec = steps * self.flops_per_step / seconds
        row = {
            "steps_per_sec": steps / seconds,
            "tokens_per_sec": steps * self.tokens_per_step / seconds,
            "model_tflops_per_sec": flops_per_sec / 1e12,
            "eta_seconds": max(self._steps_left - self._done, 0) * seconds / steps,
        }
        if self.peak_flops:
            row["mfu"] = flops_per_sec / self.peak_flops
        for section, spent in self._sections.items():
            row[f"time_share/{section}"] = min(spent / seconds, 1.0)
        self._sections = {}
        return row


def progress_line(step: int, last_step: int, row: dict[str, float]) -> str:
    """'step 1200/10000 (12%): 3.41 steps/s, ETA 0:43:01' for the log; no rate before the
    clock has started."""
    line = f"step {step}/{last_step} ({step / max(last_step, 1):.0%})"
    if "steps_per_sec" in row:
        eta = datetime.timedelta(seconds=round(row["eta_seconds"]))
        line += f": {row['steps_per_sec']:.3g} steps/s, ETA {eta}"
    return line
