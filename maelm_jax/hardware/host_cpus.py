"""How many CPUs this process may use: what its thread pools (packing, tokenizing, reading
shards) size themselves by.

`os.cpu_count()` is the machine's, not the process's: a GPU pod or container limited to 8
of a host's 200 cores by a cgroup CPU quota, or pinned to some cores by affinity (taskset,
SLURM), would start 200 threads that share 8 cores. The quota is read from cgroup v2's
`cpu.max` or v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`, in the process's own cgroup
(`/proc/self/cgroup`) and every parent up to the mount: a systemd slice or a SLURM job step
sets it below the mount's root, and the smallest quota on the way up is the one that binds.
"""

import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cpus(quota: str | None, period: str | None) -> int | None:
    """CPUs a quota allows, rounded up ("150000", "100000" -> 2); None for no quota ("max",
    v1's -1)."""
    if not quota or not period or quota == "max" or int(quota) <= 0:
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def _own_cgroups(proc_cgroup: str) -> tuple[str, str]:
    """The process's cgroup v2 path and its v1 cpu controller's path, "/" where
    `/proc/self/cgroup` has none (or is unreadable, as off Linux): the mount's root."""
    v2 = v1 = "/"
    for line in (_read(proc_cgroup) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _up_to(mount: str, path: str) -> list[str]:
    """`mount/path` and each parent folder up to `mount` itself. A path that is not under
    the mount (a container without a cgroup namespace sees the host's path while its mount
    is its own cgroup) has no folders there: its reads find nothing, and the mount's root
    is still read."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_quota(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> int | None:
    """CPUs the tightest cgroup quota over this process allows (rounded up), None where no
    cgroup on its way up to the mount has one."""
    v2_path, v1_path = _own_cgroups(proc_cgroup)
    found = []
    for folder in _up_to(root, v2_path):  # cpu.max: "max 100000" or "200000 100000"
        quota, _, period = (_read(os.path.join(folder, "cpu.max")) or "").partition(" ")
        found.append(_cpus(quota, period))
    for folder in _up_to(os.path.join(root, "cpu"), v1_path):
        quota = _read(os.path.join(folder, "cpu.cfs_quota_us"))
        found.append(_cpus(quota, _read(os.path.join(folder, "cpu.cfs_period_us"))))
    found = [n for n in found if n is not None]
    return min(found) if found else None


def usable_cpus(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> int:
    """The CPUs this process is allowed (affinity) and may keep busy (cgroup quota)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS (macOS)
        allowed = os.cpu_count() or 1
    quota = cgroup_quota(root, proc_cgroup)
    return max(1, min(allowed, quota) if quota else allowed)
