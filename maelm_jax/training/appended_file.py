"""A log file that only grows, on a local disk or in an object store.

Local files are opened for append, so a resumed run adds to what its earlier runs wrote.
Object stores (gs://) cannot append: there the file is read once and rewritten whole on
each flush. Logs stay small (scalars every `log_every_steps`), so the rewrite is cheap.
"""

import os

from etils import epath


class AppendedFile:
    """`write` queues bytes; `flush` puts them after whatever the file already held."""

    def __init__(self, path: str | os.PathLike):
        self._path = epath.Path(path)
        self._remote = "://" in os.fspath(path)
        self._pending: list[bytes] = []
        self._existing = b""
        if self._remote and self._path.exists():
            self._existing = self._path.read_bytes()

    def write(self, data: bytes) -> None:
        self._pending.append(data)

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending = []
        if self._remote:
            self._existing += data
            self._path.write_bytes(self._existing)
        else:
            with open(self._path, "ab") as f:
                f.write(data)

    def close(self) -> None:
        self.flush()
