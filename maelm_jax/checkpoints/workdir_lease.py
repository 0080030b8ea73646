"""One run per workdir: a lease file that a second launch on the same workdir is refused by.

Two runs writing one workdir (an operator relaunching a job that still runs) write the same
checkpoint steps, double every metrics row and die. So process 0 of a run creates
`WORKDIR/maelm_lease.json` naming its owner (host, pid, start time, run id) before anything
else is written, rewrites it every HEARTBEAT_SECONDS while the run lives, and deletes it at
the end. A run that finds the file held is refused with the owner's name.

A lease is stale, and is taken over, when its heartbeat is older than STALE_SECONDS (the
owner's host died or lost the storage) or when its owner ran on this host and its pid is no
longer alive: a run killed with `kill -9` never blocks its own restart.

Two launches at once must end with one owner. On a local or NFS path the lease is written
whole to a temporary file and hard-linked into place (link fails if the name exists), so no
reader ever finds it empty or half written and mistakes it for a torn lease to delete; where
the file system has no hard links, O_CREAT|O_EXCL creates it. A stale lease is deleted only
by the launch holding the takeover lock (`.maelm_lease.json.takeover`, created the same
exclusive way), and only if it still is the lease judged stale: launches taking over the same
stale lease delete it once, and a fresh lease is never moved, not even for a moment a third
launch could create its own in. (Renaming the stale lease aside and putting back what turned
out to be a fresh one had that moment: of four launches racing for a stale lease, two won
on a loaded machine.) A takeover lock older than TAKEOVER_SECONDS is a crashed launch's and
is deleted. On an object store
(gs://) etils.epath has no create-if-absent, so the file is written and read back, and of two
launches racing within the same second the last writer wins and the other is refused once it
reads back someone else's id.
"""

import dataclasses
import json
import os
import socket
import threading
import time
import uuid

from absl import logging
from etils import epath

from maelm_jax.config.run_config import ConfigError

LEASE_FILENAME = "maelm_lease.json"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0
TAKEOVER_SECONDS = 10.0  # a takeover holds its lock for milliseconds
# Where versions before 2026-11-26 packed each process's share of the corpus and trained on
# it; nothing reads or writes it any more (a run maps the corpus prepared once).
OLD_DATA_CACHE = "data_cache"


class WorkdirBusyError(ConfigError):
    """Another live run holds the workdir."""


@dataclasses.dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: float  # time.time() at acquisition
    run_id: str
    heartbeat: float  # time.time() of the last refresh

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        age = time.time() - self.heartbeat
        return (
            f"host {self.host}, pid {self.pid}, started {started}, run {self.run_id}, "
            f"last heartbeat {age:.0f}s ago"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def stale_reason(owner: Owner, stale_seconds: float = STALE_SECONDS) -> str | None:
    """Why `owner`'s lease no longer protects a live run, or None if it may still."""
    age = time.time() - owner.heartbeat
    if age > stale_seconds:
        return f"its heartbeat is {age:.0f}s old (> {stale_seconds:.0f}s)"
    if owner.host == socket.gethostname() and not _pid_alive(owner.pid):
        return f"pid {owner.pid} no longer runs on this host"
    return None


def _is_local(path: epath.Path) -> bool:
    return "://" not in os.fspath(path)


def _sibling(path: epath.Path, what: str) -> epath.Path:
    return path.parent / f".{path.name}.{what}-{uuid.uuid4().hex}"


def _create_in_place(path: epath.Path, text: str) -> bool:
    try:
        fd = os.open(os.fspath(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def _create_exclusive(path: epath.Path, text: str) -> bool:
    """Writes `text` to `path` unless it exists; True if this call created it."""
    if _is_local(path):
        tmp = _sibling(path, "new")
        tmp.write_text(text)
        try:
            os.link(tmp, path)  # atomic, and the lease appears whole
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links on this file system
            return _create_in_place(path, text)
        finally:
            tmp.unlink(missing_ok=True)
    if path.exists():
        return False
    path.write_text(text)
    return path.read_text() == text


def _take_lock(lock: epath.Path) -> bool:
    """True if this launch now holds `lock`; a lock older than TAKEOVER_SECONDS is a crashed
    launch's and is deleted first."""
    for _ in range(2):
        if _create_exclusive(lock, uuid.uuid4().hex):
            return True
        try:
            age = time.time() - os.stat(lock).st_mtime
        except FileNotFoundError:
            continue  # released just now
        if age <= TAKEOVER_SECONDS:
            return False
        logging.warning("Deleting the takeover lock %s of a crashed launch", lock)
        lock.unlink(missing_ok=True)
    return False


def _remove_stale(path: epath.Path, stale: Owner | None) -> None:
    """Removes the lease judged stale (`stale`; None: unreadable) unless, read again under
    the takeover lock, it is another lease by now (a launch that took it over first). Where
    another launch holds the lock, waits a moment for its lease to appear instead."""
    if not _is_local(path):
        path.unlink(missing_ok=True)
        return
    lock = path.parent / f".{path.name}.takeover"
    if not _take_lock(lock):
        time.sleep(0.1)
        return
    try:
        current = read_owner(path)
        if stale is None:
            still_stale = current is None
        else:
            still_stale = current is not None and current.run_id == stale.run_id
        if still_stale:
            path.unlink(missing_ok=True)
    finally:
        lock.unlink(missing_ok=True)


def _write(path: epath.Path, text: str) -> None:
    """Replaces the lease's content without a moment where a reader finds it half written."""
    if _is_local(path):
        tmp = _sibling(path, "beat")
        tmp.write_text(text)
        tmp.replace(path)
    else:
        path.write_text(text)


def read_owner(path: epath.Path) -> Owner | None:
    """The lease's owner; None if the file is gone or unreadable (a torn write)."""
    try:
        return Owner(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


class Lease:
    """This run's hold on a workdir, kept alive by a daemon heartbeat thread."""

    def __init__(self, path: epath.Path, owner: Owner, heartbeat_seconds: float):
        self.path = path
        self.owner = owner
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(heartbeat_seconds,), name="workdir-lease", daemon=True
        )
        self._thread.start()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            current = read_owner(self.path)
            if current is None or current.run_id != self.owner.run_id:
                logging.error("Lost the workdir lease %s to %s", self.path, current)
                return
            self.owner = dataclasses.replace(self.owner, heartbeat=time.time())
            try:
                _write(self.path, json.dumps(dataclasses.asdict(self.owner)))
            except OSError as e:
                logging.warning("Could not refresh the workdir lease %s: %s", self.path, e)

    def release(self) -> None:
        """Stops the heartbeat and deletes the lease if it is still this run's."""
        self._stop.set()
        current = read_owner(self.path)
        if current is not None and current.run_id == self.owner.run_id:
            self.path.unlink(missing_ok=True)


def acquire(
    workdir,
    *,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    stale_seconds: float = STALE_SECONDS,
) -> Lease:
    """Takes the workdir's lease (taking over a stale one), or raises WorkdirBusyError
    naming the workdir and its running owner."""
    path = epath.Path(workdir) / LEASE_FILENAME
    now = time.time()
    owner = Owner(socket.gethostname(), os.getpid(), now, uuid.uuid4().hex[:12], now)
    text = json.dumps(dataclasses.asdict(owner))
    for _ in range(3):
        if _create_exclusive(path, text):
            logging.info("Holding the workdir lease %s (run %s)", path, owner.run_id)
            return Lease(path, owner, heartbeat_seconds)
        current = read_owner(path)
        if current is None:  # being written right now, or just released
            time.sleep(0.2)
            current = read_owner(path)
            if current is None:
                _remove_stale(path, None)
                continue
        reason = stale_reason(current, stale_seconds)
        if reason is None:
            raise WorkdirBusyError(
                f"workdir {os.fspath(workdir)!r} is in use by another run ({current.describe()}); "
                f"wait for it to end or stop it, or give another --workdir (the lease is "
                f"{os.fspath(path)}, stale after {stale_seconds:.0f}s without a heartbeat)"
            )
        logging.warning("Taking over the workdir lease of %s: %s", current.describe(), reason)
        _remove_stale(path, current)
    raise WorkdirBusyError(f"workdir {os.fspath(workdir)!r}: could not take its lease {path}")


def check_workdir(workdir) -> None:
    """ConfigError unless `workdir` is (or can be made) a directory this run can write and
    resume in; a workdir refused is left as it was."""
    path = epath.Path(workdir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"workdir={os.fspath(workdir)!r} is a file; give a directory")
    _refuse_old_data_cache(path)
    probe = path / f".maelm_write_probe.{uuid.uuid4().hex}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"workdir={os.fspath(workdir)!r} is not a writable directory ({e.strerror or e})"
        ) from None


def _refuse_old_data_cache(workdir: epath.Path) -> None:
    """A workdir begun by a version before 2026-11-26 trained on its own data cache, which
    this version cannot read: resuming there on the prepared corpus would quietly change
    its batches, so the run stops and says what to do (deleting the cache accepts that)."""
    cache = workdir / OLD_DATA_CACHE
    if cache.exists():
        raise ConfigError(
            f"{os.fspath(cache)} is the per-workdir data cache of a version before "
            f"2026-11-26, which this version no longer reads: give a new --workdir, or delete "
            f"{os.fspath(cache)} to resume this run on the prepared corpus (its batches will "
            "differ from those it began with)"
        )
