"""Other processes' CPU, read from /proc: the one reader of the machine's busy ticks (/proc/stat) and of our own
process's (/proc/self/stat) or process tree's ticks.

Others' load over a stretch is the busy ticks of the cores watched less our own ticks in it. core_share's probe
reads it per core before measuring begins; the in-process ContentionMeter (profiling.py) and the served LoadWatch
(load_watch.py) read it while measuring. Off Linux every reader answers None and callers treat the machine as quiet.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import NamedTuple


def clock_ticks() -> int:
    """Clock ticks per second, the unit of every count here."""
    return os.sysconf("SC_CLK_TCK")


def read_cpu_busy() -> dict[int, int] | None:
    """Busy clock ticks per CPU since boot (all but idle and iowait), from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
        return {int(p[0][3:]): sum(map(int, p[1:])) - int(p[4]) - (int(p[5]) if len(p) > 5 else 0) for p in lines}
    except (OSError, ValueError, IndexError):
        return None


def own_ticks() -> int | None:
    """utime + stime of this process, in clock ticks."""
    try:
        with open("/proc/self/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])
    except (OSError, ValueError, IndexError):
        return None


def tree_ticks() -> int | None:
    """CPU of this process and every descendant, in clock ticks: live children's own, and finished ones' through their
    parents' children times (perf_analyzer runs come and go inside a measurement)."""
    try:
        import psutil

        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
    except Exception:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except Exception:  # it ended between listing and reading: its parent's children times count it once reaped
            continue
        total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return int(round(total * clock_ticks()))


class Reading(NamedTuple):
    """The counters at one moment: when (the caller's clock, in seconds), the watched cores' busy ticks, and ours."""

    at: float
    busy: int
    own: int


def read(cores: Iterable[int], own: Callable[[], int | None], clock: Callable[[], float]) -> Reading | None:
    """A Reading of `cores`, with `own` (own_ticks or tree_ticks) counting as ours; None when either cannot be read."""
    busy, mine = read_cpu_busy(), own()
    if busy is None or mine is None:
        return None
    return Reading(clock(), sum(busy.get(c, 0) for c in cores), mine)


def others_cores(start: Reading, end: Reading) -> float:
    """Cores' worth of CPU other processes used on the watched cores between two readings. Not clamped: tick rounding
    over a short stretch can make it slightly negative."""
    return ((end.busy - start.busy) - (end.own - start.own)) / ((end.at - start.at) * clock_ticks())
