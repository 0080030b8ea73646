"""Where metrics go: the log, TensorBoard (`tensorboard_events`) and `metrics.jsonl`.

`metrics.jsonl` holds one JSON object per write, `{"step": N, "train/loss": ..., ...}`, so a
script can read a run without TensorBoard. A resumed run appends; steps re-run after a crash
appear again, and readers should keep the last line per step. Only process 0 writes files.
"""

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath

from maelm_jax.training.appended_file import AppendedFile
from maelm_jax.training.tensorboard_events import TensorBoardWriter

METRICS_FILENAME = "metrics.jsonl"


class LoggingWriter:
    """`[step] key=value, ...` in the log, keys sorted: every process's own console."""

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        items = sorted(scalars.items())
        values = [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in items]
        logging.info("[%d] %s", step, ", ".join(values))

    def close(self) -> None:
        pass


class JsonlWriter:
    """Scalars as JSON lines, one per write (non-finite values as strings)."""

    def __init__(self, path: str | os.PathLike):
        self._file = AppendedFile(path)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        row = {"step": int(step)}
        for key, value in scalars.items():
            value = float(np.asarray(value))
            row[key] = value if math.isfinite(value) else str(value)
        self._file.write((json.dumps(row) + "\n").encode())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Writers:
    """Every write goes to each writer in turn."""

    def __init__(self, writers: list):
        self._writers = writers

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        for writer in self._writers:
            writer.write_scalars(step, scalars)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()


def create_writer(workdir: str | os.PathLike) -> Writers:
    """Log + TensorBoard + metrics.jsonl on process 0; other processes only log to their own
    console (so a host's losses can be compared) and write no files."""
    if jax.process_index() != 0:
        return Writers([LoggingWriter()])
    return Writers(
        [
            LoggingWriter(),
            TensorBoardWriter(workdir),
            JsonlWriter(epath.Path(workdir) / METRICS_FILENAME),
        ]
    )


def read_metrics(workdir: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """metrics.jsonl as {step: merged row}; a later line for a step overrides an earlier one."""
    rows: dict[int, dict[str, Any]] = {}
    path = epath.Path(workdir) / METRICS_FILENAME
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.setdefault(row["step"], {}).update(row)
    return rows
