"""Where metrics go: TensorBoard and the log (clu's default writer) plus `metrics.jsonl`.

`metrics.jsonl` holds one JSON object per write, `{"step": N, "train/loss": ..., ...}`, so a
script can read a run without TensorBoard. A resumed run appends; steps re-run after a crash
appear again, and readers should keep the last line per step. Only process 0 writes.
"""

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from clu import metric_writers
from etils import epath

METRICS_FILENAME = "metrics.jsonl"


class JsonlWriter(metric_writers.MetricWriter):
    """Scalars as JSON lines. Local files are appended to; object stores (gs://) cannot
    append, so there the whole file is rewritten on each flush (it stays small)."""

    def __init__(self, path: str | os.PathLike):
        self._path = epath.Path(path)
        self._remote = "://" in os.fspath(path)
        self._pending: list[str] = []
        self._existing = ""
        if self._remote and self._path.exists():
            self._existing = self._path.read_text()

    def write_scalars(self, step: int, scalars: Mapping[str, Any]):
        row = {"step": int(step)}
        for key, value in scalars.items():
            value = float(np.asarray(value))
            row[key] = value if math.isfinite(value) else str(value)
        self._pending.append(json.dumps(row))
        self.flush()

    def flush(self):
        if not self._pending:
            return
        lines = "".join(line + "\n" for line in self._pending)
        self._pending = []
        if self._remote:
            self._existing += lines
            self._path.write_text(self._existing)
        else:
            with open(self._path, "a") as f:
                f.write(lines)

    def close(self):
        self.flush()

    # Only scalars go to JSON; everything else is TensorBoard's.
    def write_summaries(self, step, values, metadata=None):
        pass

    def write_images(self, step, images):
        pass

    def write_videos(self, step, videos):
        pass

    def write_audios(self, step, audios, *, sample_rate):
        pass

    def write_texts(self, step, texts):
        pass

    def write_histograms(self, step, arrays, num_buckets=None):
        pass

    def write_hparams(self, hparams):
        pass


def create_writer(workdir: str | os.PathLike) -> metric_writers.MetricWriter:
    """TensorBoard + log + metrics.jsonl on process 0; other processes only log to their own
    console (so a host's losses can be compared) and write no files."""
    if jax.process_index() != 0:
        return metric_writers.LoggingWriter()
    default = metric_writers.create_default_writer(os.fspath(workdir), asynchronous=False)
    return metric_writers.MultiWriter(
        [default, JsonlWriter(epath.Path(workdir) / METRICS_FILENAME)]
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
