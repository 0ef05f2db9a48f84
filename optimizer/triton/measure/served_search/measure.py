"""Measuring one loaded variant: an in-process warm-up through tritonclient, then perf_analyzer level by level.

The objective decides which concurrencies a variant is measured at (objective.py); each level is one perf_analyzer
run of stability-based windows (three windows within 25%; a level that does not settle in six is the mean of three
more, flagged rough), short in the coarse pass and long when a close call is settled. Nothing is loaded while a level
is measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from optimizer.errors import ValidationError
from optimizer.records.capacity import RateLevel
from optimizer.records.served_search import LoadLevel, ServedVariant
from optimizer.records.tune_result import TuneResult
from optimizer.triton.config.spec import config_signature
from optimizer.triton.runtime.perf_analyzer import ConcurrencyRange, PerfSettings, run_perf_analyzer
from optimizer.triton.runtime.perf_analyzer_input import traffic_requests, write_input_data
from optimizer.triton.measure.served_search.objective import Objective

MIN_WINDOW_MS = 500
"""Half-second windows: perf_analyzer's three stable windows are a large share of a variant's cost, and at a fast
model's throughput a half second already holds WINDOW_REQUESTS requests, so longer windows buy no steadier figure.
Settling uses twice the window."""
MAX_WINDOW_MS = 4000
WINDOW_REQUESTS = 40
"""A window holds about this many requests of the start variant (at least 0.5 s, at most 4 s)."""
WARMUP_PER_SLOT = 4
"""Each variant is warmed with this many requests per concurrent slot, discarded: without it the first window after a
load pays the instances' first requests (thread pools, allocators, a stand-in's first call)."""


@dataclass(frozen=True)
class Bench:
    """Where and with what a variant is measured: the server's HTTP URL, the request mix and perf_analyzer's settings."""

    url: str
    input_data: Path  # perf_analyzer's --input-data (the profiled sample's rows)
    rows: list[dict[str, np.ndarray]]  # the same rows as arrays, batch-1 requests for the warm-up
    workdir: Path
    window_ms: int = MIN_WINDOW_MS
    timeout_s: float = 120.0
    protocol: str = "http"
    arrivals: str = "poisson"  # how open-loop requests arrive (--arrivals), unless the traffic is a trace
    trace_ms: tuple[float, ...] | None = None  # the traffic's timestamps (ms), in the order of rate_input's entries
    rate_input: Path | None = None  # perf_analyzer's input data for open-loop runs of a trace (its requests in its order)

    def window_for(self, throughput: float | None) -> int:
        """Windows that hold about WINDOW_REQUESTS requests at this throughput."""
        if not throughput:
            return self.window_ms
        return int(min(MAX_WINDOW_MS, max(MIN_WINDOW_MS, 1000.0 * WINDOW_REQUESTS / throughput)))

    # -- what the search asks of the server: the one seam a test replaces with a made-up server --------------------------
    def measure(self, model: str, concurrency: int, window_ms: int) -> LoadLevel:
        """One perf_analyzer run at one concurrency (measure_level)."""
        return measure_level(self, model, concurrency, window_ms)

    def measure_rate(self, model: str, offered: float) -> RateLevel:
        """One open-loop run at `offered` requests per second: the trace's gaps scaled to it, else --arrivals."""
        from optimizer.triton.runtime.perf_analyzer_rate import (RateSettings, arrival_gaps_us, measure_rate, rate_window_ms, trace_gaps_us,
                                                                 write_intervals)

        gaps = trace_gaps_us(self.trace_ms, offered) if self.trace_ms else arrival_gaps_us(offered, self.arrivals)
        intervals = write_intervals(self.workdir / "perf_analyzer" / f"intervals_{offered:g}.txt", gaps)
        data = self.rate_input if self.trace_ms and self.rate_input else self.input_data
        return measure_rate(model, self.url, data, intervals, self.workdir / "perf_analyzer",
                            RateSettings(protocol=self.protocol, window_ms=rate_window_ms(offered), timeout_s=self.timeout_s + 60))

    def drain(self, seconds: float) -> None:
        """Wait for the server to work off what an open-loop run left queued (capacity.drain_s)."""
        time.sleep(seconds)

    def warm(self, model: str, concurrency: int, requests: int) -> None:
        """Warm a loaded variant through tritonclient (warm_up)."""
        warm_up(self, model, concurrency, requests)

    def wrong_answers(self, result: TuneResult, model: str, renamed: dict[str, str], fronted: bool) -> str:
        """"" when `model` answers the export's samples within its tolerances (answers.wrong_answers)."""
        from optimizer.triton.measure.served_search.answers import wrong_answers

        return wrong_answers(result, self.protocol, self.url, self.timeout_s, model, renamed, fronted)

    def padded_answers(self, model: str, pairs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]], tolerances: dict,
                       cosine: float | None) -> str:
        """"" when `model` answers each request as it answers it padded (padding.answers_agree)."""
        from optimizer.triton.measure.client import served_config
        from optimizer.triton.measure.answers import answers_agree
        from optimizer.triton.runtime.server import open_client

        client = open_client(self.protocol, self.url, self.timeout_s)
        try:
            return answers_agree(client, model, served_config(client, model), pairs, tolerances, cosine)
        finally:
            client.close()

    def watch(self) -> Any:
        """A context manager that reads other processes' CPU while a level is measured (task/load_watch.LoadWatch)."""
        from optimizer.task.load_watch import LoadWatch

        return LoadWatch()

    def wait_for_quiet(self, limit: float, seconds: float) -> float | None:
        """Wait up to `seconds` for others' load to fall to `limit` cores; what it last saw (task/load_watch)."""
        from optimizer.task.load_watch import wait_for_quiet

        return wait_for_quiet(limit, seconds)

    @staticmethod
    def now() -> float:
        """The clock the search's budget runs on."""
        return time.monotonic()


def warm_up(bench: Bench, model: str, concurrency: int, requests: int) -> None:
    """Send `requests` batch-1 requests, `concurrency` at a time, through tritonclient and discard the answers."""
    from concurrent.futures import ThreadPoolExecutor

    from optimizer.triton.runtime.server import open_client

    if bench.protocol == "http":
        import tritonclient.http as module
    else:
        import tritonclient.grpc as module
    from tritonclient.utils import np_to_triton_dtype

    slots = max(1, min(concurrency, 64))

    def send(count: int) -> None:
        client = open_client(bench.protocol, bench.url, bench.timeout_s)
        try:
            for i in range(count):
                inputs = []
                for name, arr in bench.rows[i % len(bench.rows)].items():
                    tensor = module.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
                    tensor.set_data_from_numpy(arr)
                    inputs.append(tensor)
                client.infer(model, inputs)
        finally:
            client.close()

    with ThreadPoolExecutor(slots) as pool:
        for done in [pool.submit(send, max(1, requests // slots)) for _ in range(slots)]:
            done.result()


def measure_level(bench: Bench, model: str, concurrency: int, window_ms: int) -> LoadLevel:
    """One perf_analyzer run at one concurrency; ValidationError when it measured nothing."""
    settings = PerfSettings(concurrency=ConcurrencyRange(concurrency, concurrency), protocol=bench.protocol, measurement_interval_ms=window_ms,
                            stability_percentage=25, max_trials=6, timeout_s=bench.timeout_s, retry_alone=False)
    row = run_perf_analyzer(model, bench.url, bench.input_data, bench.workdir / "perf_analyzer", settings).best
    if row is None:
        raise ValidationError("perf_analyzer measured nothing")
    return LoadLevel(row.concurrency, row.throughput, row.p50_ms, row.p90_ms, row.p95_ms, row.p99_ms,
                     round(row.server_batch, 3) if row.server_batch else None)


def sweep(variant: ServedVariant, objective: Objective, seed: int, measure: Callable[[int], LoadLevel],
          explore_down: bool = True, stop: Callable[[list[LoadLevel]], str] | None = None,
          now: Callable[[], float] = time.monotonic) -> ServedVariant:
    """Measure the variant at the levels the objective asks for, starting at `seed`, and score it.

    `explore_down` False keeps a sweep from stepping below its start (the coarse pass: only the peak decides there).
    `stop` says why the sweep should end with the curve so far ("" to go on: out of the running, out of time): the
    variant's reason says so. A load that fails after the first ends the sweep the same way, and the loads already
    measured still count: a perf_analyzer timeout at a heavy load says nothing against the lighter ones."""
    t0 = now()
    level: int | None = objective.first_level(seed)
    order: list[LoadLevel] = []
    while level is not None:
        try:
            order.append(measure(level))
        except ValidationError as err:  # a later load failed (perf_analyzer timed out): the loads measured still count
            if not order:
                raise
            variant.reason = f"stopped climbing at concurrency {level}: {err}"
            break
        level = objective.next_level(order)
        if level is not None and stop is not None and (why := stop(order)):
            variant.reason, level = why, None
        if level is not None and not explore_down and level < order[0].concurrency and objective.latency_budget_ms is None:
            level = None
    variant.curve = sorted(order, key=lambda lv: lv.concurrency)
    scored, meets = objective.score(variant.curve)
    variant.score_at(scored)
    variant.meets_budget = meets if objective.latency_budget_ms is not None else None
    variant.seconds = round(variant.seconds + now() - t0, 2)
    return variant


def settle_level(a: ServedVariant, b: ServedVariant, objective: Objective) -> int:
    """The one load two close variants are compared at: the target load, else the larger of their scored levels (where
    both serve their peak)."""
    return objective.concurrency or max(a.concurrency or 1, b.concurrency or 1)


def mean_level(levels: list[LoadLevel]) -> LoadLevel:
    """Repeated measurements of one load as one: the mean of each figure (of others' load, the most)."""
    def avg(xs: list[float | None]) -> float | None:
        vals = [x for x in xs if x is not None]
        return sum(vals) / len(vals) if vals else None

    others = [lv.others_busy for lv in levels if lv.others_busy is not None]
    return LoadLevel(levels[0].concurrency, *(avg([getattr(lv, f) for lv in levels]) for f in ("throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "server_batch")),
                     others_busy=max(others) if others else None)


def in_config_names(result: TuneResult, feeds: list[dict]) -> list[dict]:
    """Requests keyed by forward() names, keyed by the config's tensor names instead (a positional backend's INPUT__<i>)."""
    _, renamed = config_signature(result.selected_candidate.artifact)
    back = {original: config_name for config_name, original in renamed.items()}
    return [{back.get(k, k): v for k, v in feed.items()} for feed in feeds]


def request_mix(result: TuneResult, workdir: Path, public_names: bool = False, padding: dict | None = None,
                name: str = "perf_analyzer_input.json") -> tuple[Path, str, list[dict]]:
    """perf_analyzer's input: the run's traffic (model/traffic.py), each request with its own shape, in their ratios
    (padded to `padding`'s bucket edges when given), in the config's tensor names (or, through an ensemble front, the
    forward() names clients send); the words for the report; and the same requests as arrays for the warm-ups."""
    feeds, words = traffic_requests(result, padding)
    sig, _ = config_signature(result.selected_candidate.artifact)
    if not public_names:
        feeds = in_config_names(result, feeds)
    path = write_input_data(workdir / name, feeds, sig.batching)
    if sig.batching:
        # a per-sample scalar ([batch] here) is sent as [1, 1]: its config says dims [1] with an empty reshape
        rows = [{k: v[i:i + 1].reshape(1, 1) if v.ndim == 1 else v[i:i + 1] for k, v in feed.items()}
                for feed in feeds for i in range(next(iter(feed.values())).shape[0])]
    else:
        rows = list(feeds)
    return path, words, rows
