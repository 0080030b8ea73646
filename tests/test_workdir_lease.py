"""The workdir lease with real processes: a live owner blocks, a killed one does not."""

import dataclasses
import json
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
