"""The workdir lease with real processes: a live owner blocks, a killed one does not, and of
launches racing for one workdir exactly one wins."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
from tiny_configs import REPO_ROOT

from maelm_jax.checkpoints import workdir_lease
from maelm_jax.checkpoints.workdir_lease import WorkdirBusyError

HOLDER = """
import sys, time
from maelm_jax.checkpoints import workdir_lease
workdir_lease.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def test_a_live_owner_blocks_and_after_kill_9_the_rerun_takes_over(tmp_path, caplog):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirBusyError) as busy:
            workdir_lease.acquire(tmp_path)
        assert f"workdir '{tmp_path}' is in use by another run" in str(busy.value)
        assert f"pid {holder.pid}," in str(busy.value)
    finally:
        holder.kill()  # kill -9: no chance to release
        holder.wait()
    assert (tmp_path / workdir_lease.LEASE_FILENAME).exists()
    with caplog.at_level("WARNING"):
        lease = workdir_lease.acquire(tmp_path)
    assert f"pid {holder.pid} no longer runs on this host" in caplog.text
    assert workdir_lease.read_owner(lease.path).run_id == lease.owner.run_id
    lease.release()
    assert not lease.path.exists()


def _plant(workdir, heartbeat_age):
    """A lease of a run on another host (whose pid this host cannot check)."""
    now = time.time()
    owner = workdir_lease.Owner("other-host", 1, now - 3600, "elsewhere", now - heartbeat_age)
    (workdir / workdir_lease.LEASE_FILENAME).write_text(json.dumps(dataclasses.asdict(owner)))


def test_another_hosts_lease_blocks_until_its_heartbeat_is_stale(tmp_path):
    _plant(tmp_path, heartbeat_age=5)
    with pytest.raises(WorkdirBusyError, match=r"host other-host, pid 1, .* run elsewhere"):
        workdir_lease.acquire(tmp_path, stale_seconds=60)
    _plant(tmp_path, heartbeat_age=61)
    lease = workdir_lease.acquire(tmp_path, stale_seconds=60)
    assert workdir_lease.read_owner(lease.path).run_id == lease.owner.run_id
    lease.release()


def test_the_heartbeat_keeps_a_long_run_from_going_stale(tmp_path):
    lease = workdir_lease.acquire(tmp_path, heartbeat_seconds=0.05)
    first = workdir_lease.read_owner(lease.path).heartbeat
    time.sleep(0.5)
    owner = workdir_lease.read_owner(lease.path)
    assert owner.run_id == lease.owner.run_id and owner.heartbeat > first
    lease.release()
    assert not lease.path.exists()


RACER = """
import sys
from maelm_jax.checkpoints import workdir_lease
print("ready", flush=True)
sys.stdin.readline()  # "go": every racer asks at the same moment
try:
    lease = workdir_lease.acquire(sys.argv[1])
    print("held", flush=True)
except workdir_lease.WorkdirBusyError:
    print("refused", flush=True)
sys.stdin.readline()  # holds the lease until every racer has answered
"""


@pytest.mark.parametrize("before", ["no lease", "a stale lease"])
def test_of_launches_racing_for_one_workdir_exactly_one_wins(tmp_path, before):
    """Also when all of them take over the same stale lease: one that removed it late must
    not remove the winner's fresh lease and take the workdir too."""
    if before == "a stale lease":
        _plant(tmp_path, heartbeat_age=workdir_lease.STALE_SECONDS + 60)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        assert [r.stdout.readline() for r in racers] == ["ready\n"] * 4
        for racer in racers:
            racer.stdin.write("go\n")
            racer.stdin.flush()
        answers = [r.stdout.readline().strip() for r in racers]
        owner = workdir_lease.read_owner(tmp_path / workdir_lease.LEASE_FILENAME)
    finally:
        for racer in racers:
            racer.kill()
            racer.wait()
    assert sorted(answers) == ["held", "refused", "refused", "refused"], answers
    assert owner.pid == racers[answers.index("held")].pid
    assert [p.name for p in tmp_path.iterdir()] == [workdir_lease.LEASE_FILENAME]  # no leftovers


def test_taking_over_never_removes_a_fresh_lease_that_replaced_the_stale_one(tmp_path):
    """The race the test above can only hit by chance: launch A judged the lease stale, but
    launch B took it over first; A's removal must leave B's lease in place."""
    _plant(tmp_path, heartbeat_age=workdir_lease.STALE_SECONDS + 60)
    path = tmp_path / workdir_lease.LEASE_FILENAME
    stale = workdir_lease.read_owner(path)
    fresh = workdir_lease.acquire(tmp_path)  # B: takes it over
    workdir_lease._remove_stale(path, stale)  # A, late
    assert workdir_lease.read_owner(path).run_id == fresh.owner.run_id
    fresh.release()
    _plant(tmp_path, heartbeat_age=workdir_lease.STALE_SECONDS + 60)
    workdir_lease._remove_stale(path, stale)  # the stale lease itself goes
    assert list(tmp_path.iterdir()) == []


def test_a_takeover_lock_defers_to_its_holder_until_it_is_a_crashed_launchs(tmp_path):
    """Only the holder of the takeover lock deletes a stale lease; a lock older than any
    takeover takes is a crashed launch's and must not block the workdir for good."""
    _plant(tmp_path, heartbeat_age=workdir_lease.STALE_SECONDS + 60)
    lock = tmp_path / f".{workdir_lease.LEASE_FILENAME}.takeover"
    lock.write_text("another launch, taking over right now")
    with pytest.raises(WorkdirBusyError, match="could not take its lease"):
        workdir_lease.acquire(tmp_path)
    assert workdir_lease.read_owner(tmp_path / workdir_lease.LEASE_FILENAME).run_id == "elsewhere"
    crashed = time.time() - workdir_lease.TAKEOVER_SECONDS - 5
    os.utime(lock, (crashed, crashed))
    lease = workdir_lease.acquire(tmp_path)
    assert workdir_lease.read_owner(lease.path).run_id == lease.owner.run_id
    assert not lock.exists()
    lease.release()
