"""CPU time of processes, read from /proc (Linux): what the benchmarks charge to each component.

Why hand-written: two small /proc readers are all the benchmarks need (utime + stime of a
process, and of a process tree including reaped children, e.g. a postmaster's backends); psutil
is only a transitive dependency here. Figures only; on a system without /proc every reading is 0.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _fields(pid: int | str) -> list[str]:
    # The command name (field 2) may contain spaces and parentheses: split after its ")".
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (0 if it is gone)."""
    try:
        f = _fields(pid)
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / _TICK


def threads_cpu_s(pid: int) -> float:
    """On-CPU time of all of one process's live threads, in seconds, at nanosecond resolution
    (/proc/<pid>/task/*/schedstat): for short rounds, where utime + stime's clock ticks (10 ms)
    would be a visible part of the figure. 0 if the process is gone."""
    total_ns = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            total_ns += int((task / "schedstat").read_text().split()[0])
    return total_ns / 1e9


def tree_cpu_s(root: int) -> float:
    """CPU of `root`, of its children that ended (reaped: cutime + cstime) and of its live
    children (a postmaster's backends, a dev server's helpers); 0 if `root` is gone."""
    try:
        f = _fields(root)
    except OSError:
        return 0.0
    total = sum(int(x) for x in f[11:15]) / _TICK
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = _fields(entry.name)
        except OSError:
            continue
        if int(child[1]) == root:
            total += (int(child[11]) + int(child[12])) / _TICK
    return total


def snapshot(pids: Mapping[str, int]) -> dict[str, float]:
    """Each named process tree's CPU seconds so far."""
    return {name: tree_cpu_s(pid) for name, pid in pids.items()}


def per_item_ms(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """CPU milliseconds per item of each process between two snapshots, plus their `total`."""
    out = {k: round(1000 * (after.get(k, 0.0) - v) / max(1, n), 1) for k, v in before.items()}
    out["total"] = round(sum(out.values()), 1)
    return out
