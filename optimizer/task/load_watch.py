"""Other processes' CPU while something is measured: so a measurement that load from elsewhere reached can be told.

core_share.probe looks once, before measuring begins. Real background load comes and goes (a build step, another
job's bursts): on a machine that was quiet at the probe, a 2 s burst that lands in one variant's window makes that
variant look slower than its neighbours, and the search would publish whichever variant the bursts missed
(benchmarks/noisy_choice.py and its record in benchmarks/results/). A watch reads
others' CPU (cpu_load.py) beside the measurement with this process tree as our own (the server, its backends' stubs and
perf_analyzer are children), so what remains is other processes' load. In-process measurement has the same guard
with its own process's CPU (task/profiling.py: ContentionMeter, measure_settled).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from optimizer.machine import available_cores
from optimizer.task.cpu_load import Reading, others_cores, read, tree_ticks

SAMPLE_S = 0.25
STRETCH_SAMPLES = 2
"""Others' load is judged over half-second stretches (two samples): short enough to see a burst inside a 2-3 s
measurement, long enough that tick rounding (100 Hz: a few ticks per core) stays under 0.1 core."""


class LoadWatch:
    """A context manager: samples others' CPU (in cores) every SAMPLE_S while its block runs.

    `peak` is the most others used over any half-second stretch; None where /proc/stat or the process tree cannot be
    read (off Linux), so callers treat the measurement as undisturbed, as before."""

    def __init__(self, sample_s: float = SAMPLE_S) -> None:
        self.sample_s = sample_s
        self.samples: list[float] = []
        self.times: list[float] = []  # when each sample's interval ended (time.monotonic())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cores = available_cores()
        self._last: Reading | None = None
        self._skipped = False  # the last sample was left to the next one (see _sample)

    def _read(self) -> Reading | None:
        return read(self._cores, tree_ticks, time.monotonic)

    def _sample(self) -> None:
        now = self._read()
        if now is None or self._last is None:
            self._last = now
            return
        if now.at - self._last.at < self.sample_s / 2:
            # too short to judge (the last sample as the block ends can come a millisecond after the thread's): a tick or
            # two of rounding over a millisecond read as up to 28 cores of others' load on two. Judged with the next.
            return
        if now.own < self._last.own and not self._skipped:
            # our tree's CPU went down: a descendant ended and its parent has not reaped it yet, so its ticks are in no
            # live process's account (read as up to 14.5 cores of "others" on two). Judge this interval with the next.
            self._skipped = True
            return
        self._skipped = False
        if now.own >= self._last.own:
            self.samples.append(max(0.0, others_cores(self._last, now)))
            self.times.append(now.at)
        self._last = now

    def _run(self) -> None:
        while not self._stop.wait(self.sample_s):
            self._sample()

    def __enter__(self) -> LoadWatch:
        self._last = self._read()
        if self._last is not None:
            self._thread = threading.Thread(target=self._run, name="load-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()

    @property
    def peak(self) -> float | None:
        """Others' most CPU, in cores, over any STRETCH_SAMPLES consecutive samples (None when nothing was read)."""
        return self.peak_within(0.0)

    def peak_within(self, last_s: float) -> float | None:
        """`peak` over the samples of the last `last_s` seconds only (0: all); None when nothing was read."""
        if not self.samples:
            return None
        since = self.times[-1] - last_s if last_s > 0 else float("-inf")
        samples = [x for x, t in zip(self.samples, self.times) if t - self.sample_s >= since] or self.samples[-1:]
        k = min(STRETCH_SAMPLES, len(samples))
        return round(max(sum(samples[i:i + k]) / k for i in range(len(samples) - k + 1)), 2)


def wait_for_quiet(limit: float, wait_s: float, step_s: float = 0.5) -> float | None:
    """Wait up to `wait_s` for others' load to fall to `limit` cores or below (half-second looks); the last load seen
    (None when it cannot be read)."""
    end = time.monotonic() + wait_s
    while True:
        with LoadWatch(sample_s=step_s / STRETCH_SAMPLES) as watch:
            time.sleep(step_s)
        if watch.peak is None or watch.peak <= limit or time.monotonic() >= end:
            return watch.peak
