"""How many CPUs this process may use: what ``--workers auto`` starts.

``os.cpu_count()`` is the host's count; in a container or under ``taskset`` the gateway
may use far fewer, and starting a worker per host core would only add contention. The
answer is the smaller of the affinity mask and the cgroup CPU quota (v2 ``cpu.max``,
v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), rounded up, at least 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["available_cpus", "cgroup_cpu_limit"]

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(v2 path, v1 cpu controller path) of this process, from /proc/self/cgroup's text."""
    v2: str | None = None
    v1: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Path = _CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """CPUs allowed by the cgroup quota (e.g. 1.5), or None when unlimited or unknown.

    Walks from this process's cgroup up to the root: a quota on a parent limits it too.
    """
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup")) or ""
    v2, v1 = _own_cgroup(proc_cgroup)
    limits: list[float] = []
    if v2 is not None:
        rel = Path(v2.lstrip("/"))
        for d in [rel, *rel.parents]:
            text = _read(root / d / "cpu.max")
            if text:
                quota, _, period = text.partition(" ")
                if quota != "max" and period:
                    limits.append(int(quota) / int(period))
    if not limits and v1 is not None:
        for base in (root / "cpu", root / "cpu,cpuacct"):
            rel = Path(v1.lstrip("/"))
            for d in [rel, *rel.parents]:
                quota_s, period_s = _read(base / d / "cpu.cfs_quota_us"), _read(base / d / "cpu.cfs_period_us")
                if quota_s and period_s and int(quota_s) > 0:
                    limits.append(int(quota_s) / int(period_s))
            if limits:
                break
    return min(limits) if limits else None


def available_cpus() -> int:
    """The CPUs this process may use: affinity mask, capped by the cgroup quota (rounded up)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        count = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)
