"""How many CPUs this process may use: what its thread pools (packing, tokenizing, reading
shards) size themselves by.

`os.cpu_count()` is the machine's, not the process's: a GPU pod or container limited to 8
of a host's 200 cores by a cgroup CPU quota, or pinned to some cores by affinity (taskset,
SLURM), would start 200 threads that share 8 cores. The quota is read from cgroup v2's
`cpu.max` or v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
"""

import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_quota(root: str = CGROUP_ROOT) -> int | None:
    """CPUs the cgroup's quota allows (rounded up), None where there is no quota."""
    v2 = _read(os.path.join(root, "cpu.max"))  # "max 100000" or "200000 100000"
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return max(1, math.ceil(int(quota) / int(period)))
        return None
    quota = _read(os.path.join(root, "cpu", "cpu.cfs_quota_us"))
    period = _read(os.path.join(root, "cpu", "cpu.cfs_period_us"))
    if quota and period and int(quota) > 0:
        return max(1, math.ceil(int(quota) / int(period)))
    return None


def usable_cpus(root: str = CGROUP_ROOT) -> int:
    """The CPUs this process is allowed (affinity) and may keep busy (cgroup quota)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS (macOS)
        allowed = os.cpu_count() or 1
    quota = cgroup_quota(root)
    return max(1, min(allowed, quota) if quota else allowed)
