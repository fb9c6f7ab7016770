"""How many cores this session really has, and how to share them between compute threads and decode workers.

`os.cpu_count()` is the host's count. A container on it may be allowed less: a CPU affinity mask (what
`os.sched_getaffinity` returns: taskset, cpuset cgroups, Kubernetes' static CPU manager) or a CFS bandwidth
quota (cgroup v2 `cpu.max`, cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`: docker --cpus, Kubernetes
limits). Threads beyond the quota do not run in parallel: the kernel throttles the whole group once it has
used its quota in a period (100 ms by default), and every thread then waits for the next period, which costs
more than the half core a rounded-up count would win. So the count is the affinity mask, capped by the quota
rounded down (at least 1). ONNX Runtime's default thread count is one per physical core of the host, torch's
the host's `os.cpu_count()`: both are set from this count instead.

Pure file reading, no torch import: the cgroup files are read from `cgroup_root` (default /sys/fs/cgroup),
so tests point it at a folder of hand-written files.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 mounts the cpu controller under one of these names (docker: cpu,cpuacct with a cpu symlink).
V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def _v2_limit(folder: Path) -> float | None:
    """cgroup v2 `cpu.max`: "QUOTA PERIOD" in microseconds, QUOTA "max" when unlimited."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" or float(period) <= 0 else float(quota) / float(period)


def _v1_limit(folder: Path) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`; a quota of -1 means unlimited."""
    try:
        quota = float((folder / "cpu.cfs_quota_us").read_text())
        period = float((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def _own_paths(self_cgroup: Path) -> list[str]:
    """This process's cgroup paths from /proc/self/cgroup ("0::/a/b" on v2, "4:cpu,cpuacct:/a/b" on v1),
    outermost first. Without a cgroup namespace the quota is set on this path, not on the root."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return []
    entries = [line.split(":", 2) for line in lines]
    return [e[2].strip("/") for e in entries if len(e) == 3 and (e[1] == "" or "cpu" in e[1].split(","))]


def cgroup_cpu_limit(
    cgroup_root: str | Path = CGROUP_ROOT, self_cgroup: str | Path = SELF_CGROUP
) -> float | None:
    """The CFS quota in CPUs (1.5 = one and a half cores' worth of time per period), the smallest found at the
    root and along this process's own cgroup path, for cgroup v2 and v1; None when there is no quota."""
    root = Path(cgroup_root)
    bases = [root, *(root / d for d in V1_CPU_DIRS)]
    folders = list(bases)
    for relative in _own_paths(Path(self_cgroup)):
        parts = Path(relative).parts
        for depth in range(1, len(parts) + 1):  # every ancestor: a parent's quota caps its children too
            folders += [base.joinpath(*parts[:depth]) for base in bases]
    limits = [limit for folder in folders for limit in (_v2_limit(folder), _v1_limit(folder)) if limit]
    return min(limits) if limits else None


def available_cores(
    cgroup_root: str | Path = CGROUP_ROOT, self_cgroup: str | Path = SELF_CGROUP, affinity: int | None = None
) -> int:
    """Cores this session can keep busy: the affinity mask (`affinity`, default this process's; else
    os.cpu_count()), capped by the cgroup CPU quota rounded down (a 1.5-CPU quota gives 1), at least 1."""
    cores = affinity
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not on Linux
            cores = os.cpu_count() or 1
    if (limit := cgroup_cpu_limit(cgroup_root, self_cgroup)) is not None:
        cores = min(cores, max(1, math.floor(limit + 1e-9)))
    return max(1, cores)


@dataclass(frozen=True)
class ThreadPlan:
    cores: int  # available_cores()
    compute_threads: int  # torch.set_num_threads / ONNX Runtime intra_op_num_threads
    decode_workers: int  # DataLoader worker processes decoding audio

    def describe(self) -> str:
        return (
            f"{self.cores} core(s): {self.compute_threads} compute thread(s), "
            f"{self.decode_workers} decode worker(s)"
        )


def plan_threads(cores: int, decode_workers: int | None = None, threads: int | None = None) -> ThreadPlan:
    """Share `cores` between compute threads and DataLoader decode workers so that together they never ask
    for more than `cores` (an oversubscribed core time-slices a compute thread, and every other thread of an
    operator waits for the slowest one).

    decode_workers None: none below 4 cores (decoding in the compute process between batches: on 2 cores one
    worker cost 10-30% of inference throughput on FSDD), else one per 4 cores (decoding
    a window costs a few percent of computing its ECAPA embedding). The compute threads get the rest.
    Explicit values are the caller's choice and kept as given.
    """
    if cores < 1:
        raise ValueError(f"cores={cores}: needs at least 1")
    decode_workers = cores // 4 if decode_workers is None else decode_workers  # 0 below 4 cores
    if decode_workers < 0:
        raise ValueError(f"decode_workers={decode_workers}: use 0 (decode in the compute process) or more")
    if threads is not None and threads < 1:
        raise ValueError(f"threads={threads}: use 1 or more, or None for the cores the workers leave")
    compute = threads if threads is not None else max(1, cores - decode_workers)
    return ThreadPlan(cores, compute, decode_workers)
