"""TensorBoard scalars written without TensorFlow.

TensorFlow's summary writer (what clu's default writer wraps) costs about 5 s of import in
every process that trains, for a file of a few scalar records. The file is the same here:
TFRecord-framed `Event` protos (tensorboard's own protos and framing), each scalar a
float32 tensor under the "scalars" plugin, exactly what `tf.summary.scalar` writes, so
TensorBoard and `event_accumulator` read it as before.
"""

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from maelm_jax.training.appended_file import AppendedFile

_SCALAR = scalar_metadata.create_summary_metadata(display_name=None, description=None)


class TensorBoardWriter:
    """One event file per writer (a resumed run starts a new one, as TensorFlow's did)."""

    def __init__(self, logdir: str | os.PathLike):
        epath.Path(logdir).mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}.{os.getpid()}.v2"
        self._file = AppendedFile(os.path.join(os.fspath(logdir), name))
        self._records = RecordWriter(self._file)
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self._file.flush()

    def _write(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        values = [
            summary_pb2.Summary.Value(
                tag=key,
                metadata=_SCALAR,
                tensor=tensor_util.make_tensor_proto(np.float32(np.asarray(value))),
            )
            for key, value in scalars.items()
        ]
        summary = summary_pb2.Summary(value=values)
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
