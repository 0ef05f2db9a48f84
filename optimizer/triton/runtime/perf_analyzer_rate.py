"""perf_analyzer 2.51 open-loop: requests sent on a schedule whatever the answers' pace (its --request-intervals).

The schedule is ours, written as the intervals file perf_analyzer loops through: Poisson arrivals, evenly spaced ones,
or a recorded trace's own gaps (scaled to a rate when asked). Why not its --request-distribution poisson: 2.51's
generator offered about 5% less than the rate it was given on these machines, so "throughput below the offered rate"
could not be told from requests piling up. Poisson arrivals here hold exactly the rate's count in each second, placed
at random within it (a Poisson process given its count per second): a window offers the rate it names, and the
bursts within a second are Poisson's.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from optimizer.errors import ValidationError
from optimizer.records.capacity import RateLevel
from optimizer.triton.runtime.perf_analyzer import UNCHECKED_STABILITY, _stop, _tail, find_perf_analyzer, perf_analyzer_environment
from optimizer.triton.runtime.perf_analyzer_console import perf_analyzer_error

log = logging.getLogger(__name__)

ARRIVAL_BLOCK_S = 1.0
"""Poisson arrivals are drawn a second at a time with exactly the rate's count in each (see the module's docstring)."""
SCHEDULE_S = 60.0
"""The length of a generated schedule; perf_analyzer loops it (a run is a few windows, far shorter)."""
RATE_WINDOW_MS = 2000
RATE_WINDOWS = 3
"""A rate is measured over three windows of at least 2 s (rate_window_ms) with no stability check (perf_analyzer merges them): under bursty arrivals
the windows of a loaded server never agree within a tight tolerance on two cores, and three windows hold hundreds of
requests at the rates a served model holds, enough for a p95."""
MIN_WINDOW_REQUESTS = 120
MAX_RATE_WINDOW_MS = 8000
"""A low rate gets longer windows, so each holds about this many requests: the requests still in flight at a window's
edges make a short window of few requests read a few percent below the rate it was offered."""


def rate_window_ms(rate: float, shortest: int = RATE_WINDOW_MS) -> int:
    """Windows for `rate` requests per second: at least `shortest`, long enough for MIN_WINDOW_REQUESTS, at most MAX_RATE_WINDOW_MS."""
    return int(min(MAX_RATE_WINDOW_MS, max(shortest, 1000.0 * MIN_WINDOW_REQUESTS / max(rate, 1e-3))))


STALL_GRACE_S = 30.0
"""What a run may take beyond its windows: start-up, and the answers to requests a saturated server still holds."""
_COUNT = re.compile(r"Inference count:\s*(\d+)\s*\n\s*Execution count:\s*(\d+)")


def arrival_gaps_us(rate: float, arrivals: str, seconds: float = SCHEDULE_S, seed: int = 0) -> list[int]:
    """Gaps between requests in microseconds for `rate` requests per second: "poisson" or "constant"."""
    if not rate > 0:
        raise ValueError(f"rate {rate} must be positive")
    if arrivals == "constant":
        n = max(1, round(rate * seconds))
        return [max(1, round(1e6 / rate))] * n
    rng = np.random.default_rng(seed)
    times: list[float] = []
    carry = 0.0
    blocks = max(1, round(seconds / ARRIVAL_BLOCK_S))
    for b in range(blocks):
        # the count of each second, exactly the rate's (fractions carried over), placed uniformly at random in it
        carry += rate * ARRIVAL_BLOCK_S
        count = int(carry + 1e-9)
        carry -= count
        times.extend(b * ARRIVAL_BLOCK_S + np.sort(rng.uniform(0.0, ARRIVAL_BLOCK_S, count)))
    if not times:
        return [max(1, round(1e6 / rate))]
    stamps = np.asarray(times)
    gaps = np.diff(np.concatenate([[0.0], stamps, [blocks * ARRIVAL_BLOCK_S]]))  # the last gap closes the loop
    gaps[-1] += gaps[0]
    return [max(1, round(g * 1e6)) for g in gaps[1:]]


def trace_gaps_us(timestamps_ms: Sequence[float], rate: float | None = None) -> list[int]:
    """A trace's gaps in microseconds, in its order (the last request's gap is the mean one, as perf_analyzer loops it);
    scaled so the mean rate is `rate` when given, keeping its bursts."""
    stamps = np.asarray(timestamps_ms, dtype=float)
    gaps = np.diff(stamps) if len(stamps) > 1 else np.asarray([1000.0])
    mean = float(gaps.mean()) if gaps.size and gaps.mean() > 0 else 1000.0
    gaps = np.concatenate([gaps, [mean]])
    if rate is not None:
        gaps = gaps * (1000.0 / rate) / mean
    return [max(1, round(g * 1000.0)) for g in gaps]


def mean_rate(gaps_us: Sequence[int]) -> float:
    """Requests per second a schedule offers."""
    return len(gaps_us) * 1e6 / max(1, sum(gaps_us))


def write_intervals(path: Path, gaps_us: Sequence[int]) -> Path:
    """perf_analyzer's --request-intervals file: one gap in microseconds a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(str(int(g)) for g in gaps_us) + "\n")
    return path


@dataclass(frozen=True)
class RateSettings:
    """How one offered rate is measured."""

    protocol: str = "grpc"
    window_ms: int = RATE_WINDOW_MS
    windows: int = RATE_WINDOWS
    max_threads: int = 16
    timeout_s: float = 300.0

    @property
    def limit_s(self) -> float:
        """How long one run may take before it is called stalled."""
        return min(self.timeout_s, STALL_GRACE_S + 2 * self.windows * self.window_ms / 1000)


def rate_command(binary: Path, model: str, url: str, input_data: Path, intervals: Path, csv_path: Path, settings: RateSettings) -> list[str]:
    """The exact command line (kept in the record, so a user can run it again by hand)."""
    return [str(binary), "-m", model, "-u", url, "-i", settings.protocol, "-a", "--max-threads", str(settings.max_threads),
            "--request-intervals", str(intervals), "--input-data", str(input_data),
            "--measurement-mode", "time_windows", "-p", str(settings.window_ms),
            "-s", str(UNCHECKED_STABILITY), "-r", str(settings.windows), "-f", str(csv_path)]


def measure_rate(model: str, url: str, input_data: Path, intervals: Path, workdir: Path, settings: RateSettings) -> RateLevel:
    """One open-loop run on the schedule `intervals`; ValidationError with perf_analyzer's words when it measured nothing."""
    binary = find_perf_analyzer()
    workdir.mkdir(parents=True, exist_ok=True)
    offered = mean_rate([int(x) for x in intervals.read_text().split()])
    csv_path = workdir / f"perf_analyzer_{model}_rate.csv"
    csv_path.unlink(missing_ok=True)
    command = rate_command(binary, model, url, input_data, intervals, csv_path, settings)
    log.info("running %s", " ".join(command))
    t0 = time.monotonic()
    proc = subprocess.Popen(command, env=perf_analyzer_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=settings.limit_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise ValidationError(f"perf_analyzer made no progress at {offered:.4g} requests/s over {settings.protocol} (no result within "
                              f"{settings.limit_s:.0f} s); check that the server still answers.") from None
    except BaseException:  # Ctrl-C: never leave perf_analyzer running
        _stop(proc)
        raise
    level = parse_rate_csv(csv_path.read_text() if csv_path.is_file() else "", offered)
    if level is None:
        reason = perf_analyzer_error(output) or f"exit status {proc.returncode}"
        raise ValidationError(f"perf_analyzer measured nothing at {offered:.4g} requests/s: {reason}; its output ends: {_tail(output, 3)}")
    counts = _COUNT.search(output)
    if counts and int(counts.group(2)):
        level.server_batch = round(int(counts.group(1)) / int(counts.group(2)), 3)
    log.info("%.4g requests/s offered: %.1f/s served, p95 %.2f ms (%.1f s)", offered, level.throughput, level.p95_ms, time.monotonic() - t0)
    return level


def parse_rate_csv(text: str, offered: float) -> RateLevel | None:
    """The one row of a request-rate run's CSV (its first column is the rate, not a concurrency); None when it has none."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    header = lines[0].split(",")
    row = dict(zip(header, lines[1].split(",")))
    try:
        ms = {k: float(row[f"{k} latency"]) / 1000.0 for k in ("p50", "p90", "p95", "p99")}
        throughput = float(row["Inferences/Second"])
    except (KeyError, ValueError):
        raise ValidationError(f"perf_analyzer's request-rate CSV is not as expected (header: {lines[0]}); expected perf_analyzer 2.x.") from None
    if not math.isfinite(throughput):
        return None
    return RateLevel(round(offered, 3), throughput, ms["p50"], ms["p90"], ms["p95"], ms["p99"])
