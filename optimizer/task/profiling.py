"""Latency and throughput of a runner at one batch size, measured until stable, with machine contention recorded.

Timing lives here and only here (time.perf_counter_ns). A measurement runs timed windows until
the throughput of the last `stable_windows` windows has a coefficient of variation under
`cv_threshold`, or until `time_cap_s`; percentiles come from those last windows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from optimizer.machine import available_cores
from optimizer.records.measurements import BatchProfile
from optimizer.task.cpu_load import Reading, others_cores, own_ticks, read
from optimizer.task.load_watch import wait_for_quiet


QUIET_WAIT_S = 3.0
"""Before a retake, the longest wait for others' load on these cores to fall: 2 s on / 3 s off bursts end within it."""


@dataclass(frozen=True)
class ProfileSettings:
    """How long and how carefully to measure one batch size."""

    warmup_runs: int = 3
    window_s: float = 0.15
    min_runs_per_window: int = 3
    stable_windows: int = 3
    cv_threshold: float = 0.08
    time_cap_s: float = 3.0
    busy_share: float = 0.2  # a measurement whose reported windows other processes used more of the CPU than this is taken again
    retakes: int = 2  # at most this many times per batch size; the least disturbed measurement is kept
    quiet_wait_s: float = QUIET_WAIT_S  # before a retake, the longest wait for that load to fall


class ContentionMeter:
    """Share of the CPU time of the cores this process may run on spent by other processes (cpu_load.py; Linux only).

    Only those cores count: a run pinned away from another job's busy core (task/core_share.py) is not disturbed by it.
    `mark` closes a stretch (a timed window); `share` judges the last stretches, the ones a measurement reports.
    """

    def __init__(self) -> None:
        self._cores = available_cores()
        self.marks = [self._read()]

    def _read(self) -> Reading | None:
        return read(self._cores, own_ticks, time.perf_counter)

    def mark(self) -> None:
        self.marks.append(self._read())

    def share(self, last: int = 0) -> float:
        """Others' share over the last `last` marked stretches (0: since the meter started); 0.0 when unreadable."""
        start, end = self.marks[-(last + 1)] if last and last < len(self.marks) else self.marks[0], self._read()
        if start is None or end is None or end.at <= start.at:
            return 0.0
        return float(min(max(others_cores(start, end) / len(self._cores), 0.0), 1.0))


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


STEADY_LOAD = 0.05
"""A retake whose others' CPU share is within this of the first take's saw a steady load (a spinning core reads about the
same share on both takes): taking it again only multiplies the time; a load that comes and goes drops by more."""


class _Load:
    """Whether a wait for others' load to fall has timed out in this process: the load stays, so later retakes do not
    wait for it (each candidate measures in its own process, so this is one candidate's)."""

    stays = False


def measure_settled(run: Callable[[], Any], batch_size: int, settings: ProfileSettings = ProfileSettings()) -> BatchProfile:
    """`measure`, taken again (a bounded number of times) while other processes used more than `busy_share` of the
    CPU in the windows it reports: background load that comes and goes must not decide a batch size. A retake waits
    for that load to fall first (QUIET_WAIT_S at most, once per process for a load that stays). Keeps the least
    disturbed one.

    Why the wait: a retake right after a burst meets the same burst and reads it as a steady load, so the disturbed
    figures stand and can decide the batch search and the backend (benchmarks/noisy_choice.py)."""
    best = measure(run, batch_size, settings)
    quiet = settings.busy_share * len(available_cores())  # in cores, as the load watch reads them
    tries = 0
    while best.others_cpu_share > settings.busy_share and tries < settings.retakes:
        tries += 1
        if _Load.stays:
            time.sleep(0.2 * tries)
        else:
            seen = wait_for_quiet(quiet, settings.quiet_wait_s)
            _Load.stays = seen is not None and seen > quiet
        again = measure(run, batch_size, settings)
        steady = best.others_cpu_share - again.others_cpu_share < STEADY_LOAD
        if again.others_cpu_share < best.others_cpu_share:
            best = again
        if steady:  # the load did not move: it is another job's, not a passing one, and a third take would see it too
            break
    best.retakes = tries
    return best


def measure(run: Callable[[], Any], batch_size: int, settings: ProfileSettings = ProfileSettings()) -> BatchProfile:
    """Profile `run` (one inference of `batch_size` samples): warm up, then timed windows until stable."""
    for _ in range(settings.warmup_runs):
        run()
    windows: list[list[int]] = []
    throughputs: list[float] = []
    meter = ContentionMeter()
    t_start = time.perf_counter_ns()
    cap_ns = int(settings.time_cap_s * 1e9)
    window_ns = int(settings.window_s * 1e9)
    cv = float("inf")
    stable = False
    while True:
        lat: list[int] = []
        w0 = time.perf_counter_ns()
        while len(lat) < settings.min_runs_per_window or time.perf_counter_ns() - w0 < window_ns:
            t0 = time.perf_counter_ns()
            run()
            lat.append(time.perf_counter_ns() - t0)
        windows.append(lat)
        meter.mark()
        throughputs.append(batch_size * len(lat) / (sum(lat) / 1e9))
        if len(throughputs) >= settings.stable_windows:
            recent = np.array(throughputs[-settings.stable_windows :])
            cv = float(recent.std() / recent.mean()) if recent.mean() > 0 else float("inf")
            if cv <= settings.cv_threshold:
                stable = True
                break
        if time.perf_counter_ns() - t_start >= cap_ns:
            break
    used = windows[-settings.stable_windows :]
    samples = np.array([x for w in used for x in w], dtype=np.float64) / 1e6
    mean_ms = float(samples.mean())
    return BatchProfile(
        batch_size=batch_size,
        p50_ms=float(np.percentile(samples, 50)),
        p90_ms=float(np.percentile(samples, 90)),
        p95_ms=float(np.percentile(samples, 95)),
        p99_ms=float(np.percentile(samples, 99)),
        mean_ms=mean_ms,
        throughput=batch_size * 1000.0 / mean_ms,
        runs=int(samples.size),
        windows=len(windows),
        stable=stable,
        cv=cv if np.isfinite(cv) else -1.0,
        others_cpu_share=meter.share(len(used)),
        peak_rss_mb=peak_rss_mb(),
    )
