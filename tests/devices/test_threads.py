"""pipeline/devices/threads.py on cgroup folders written by hand: what the kernel shows a container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.devices.threads import available_cores, cgroup_cpu_limit, plan_threads


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def no_self(tmp_path) -> Path:
    """A /proc/self/cgroup naming the root (a container with its own cgroup namespace)."""
    path = tmp_path / "self-cgroup"
    path.write_text("0::/\n")
    return path


def test_cgroup_v2_quota_in_cpus(tmp_path, no_self):
    root = tmp_path / "fs"
    write(root, "cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(root, no_self) == 1.5
    assert available_cores(root, no_self, affinity=4) == 1  # rounded down: 2 threads would be throttled
    write(root, "cpu.max", "400000 100000\n")
    assert available_cores(root, no_self, affinity=16) == 4
    assert available_cores(root, no_self, affinity=2) == 2  # the affinity mask is the smaller


def test_cgroup_v2_without_quota(tmp_path, no_self):
    root = tmp_path / "fs"
    write(root, "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(root, no_self) is None
    assert available_cores(root, no_self, affinity=3) == 3


def test_cgroup_v1_quota_and_unlimited(tmp_path, no_self):
    root = tmp_path / "fs"
    write(root, "cpu,cpuacct/cpu.cfs_quota_us", "250000\n")
    write(root, "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(root, no_self) == 2.5
    assert available_cores(root, no_self, affinity=8) == 2
    write(root, "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(root, no_self) is None


def test_a_quota_on_this_process_path_or_a_parent_counts(tmp_path):
    """Without a cgroup namespace /sys/fs/cgroup is the host's: the quota sits on the process's own path."""
    root, own = tmp_path / "fs", tmp_path / "self-cgroup"
    own.write_text("0::/kubepods/pod1/box\n")
    write(root, "kubepods/pod1/cpu.max", "300000 100000\n")
    write(root, "kubepods/pod1/box/cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(root, own) == 3.0
    write(root, "kubepods/pod1/box/cpu.max", "200000 100000\n")
    assert cgroup_cpu_limit(root, own) == 2.0  # the smallest along the path
    own.write_text("4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")  # cgroup v1 lines
    write(root, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "100000\n")
    write(root, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert available_cores(root, own, affinity=8) == 1


def test_unreadable_or_garbled_files_mean_no_quota(tmp_path, no_self):
    root = tmp_path / "fs"
    assert cgroup_cpu_limit(root, no_self) is None  # no folder at all
    write(root, "cpu.max", "garbage\n")
    write(root, "cpu/cpu.cfs_quota_us", "lots\n")
    write(root, "cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(root, tmp_path / "missing") is None
    assert available_cores(root, no_self, affinity=2) == 2


def test_a_tiny_quota_still_gives_one_core(tmp_path, no_self):
    write(tmp_path / "fs", "cpu.max", "20000 100000\n")
    assert available_cores(tmp_path / "fs", no_self, affinity=8) == 1


def test_this_machine():
    """The real files: never more than the affinity mask, at least one."""
    cores = available_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))


def test_plan_leaves_decode_workers_their_cores():
    assert plan_threads(2) == plan_threads(2, decode_workers=None)
    small = plan_threads(2)
    assert (small.compute_threads, small.decode_workers) == (2, 0)  # 2 cores: decode in the compute process
    big = plan_threads(8)
    assert (big.compute_threads, big.decode_workers) == (6, 2)
    assert big.compute_threads + big.decode_workers == big.cores
    assert plan_threads(4).describe() == "4 core(s): 3 compute thread(s), 1 decode worker(s)"
    asked = plan_threads(2, decode_workers=1)
    assert (asked.compute_threads, asked.decode_workers) == (1, 1)
    assert plan_threads(2, decode_workers=5).compute_threads == 1  # never 0 threads
    assert plan_threads(4, threads=4).compute_threads == 4  # the caller's explicit choice is kept


def test_plan_rejects_impossible_values():
    with pytest.raises(ValueError, match="cores=0"):
        plan_threads(0)
    with pytest.raises(ValueError, match="decode_workers=-1"):
        plan_threads(4, decode_workers=-1)
    with pytest.raises(ValueError, match="threads=0"):
        plan_threads(4, threads=0)
