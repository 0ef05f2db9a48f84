"""The served search: which variants it measures and how it scores them (pure), the search run against a made-up
server, why it skips, and a real search end to end."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.model.samples import save_feeds
from optimizer.model.signature import Signature
from optimizer.model.traffic import Traffic
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch, ServedVariant
from optimizer.triton.config.model_config import parse
from optimizer.triton.repository.publish import PublishOptions, prepare_config
from optimizer.triton.measure.served_search import SearchRequest, served_search
from optimizer.triton.measure.served_search import clock as clock_module
from optimizer.triton.measure.served_search import measure as search_module
from optimizer.triton.measure.served_search import run as run_module
from optimizer.triton.measure.served_search.servers import Rig, Where
from optimizer.triton.measure.served_search.objective import Objective, robust_ratios
from optimizer.triton.measure.served_search.points import SearchSpace, better, close, coarse_grid, fill_delay_us, layouts, max_batches, refinements, seed_concurrency
from optimizer.triton.measure.prediction import predict_throughput
from tests.conftest import run_cli
from tests.triton_records import make_result, tensor

START = OperatingPoint(8, (8,), 200, 1, 2)


def level(c: int, throughput: float, p95: float | None = None) -> LoadLevel:
    lat = p95 if p95 is not None else 1000.0 * c / throughput
    return LoadLevel(c, throughput, lat * 0.6, lat * 0.9, lat, lat * 1.2)


def variant(point: OperatingPoint, throughput: float, p95: float = 10.0, c: int = 8) -> ServedVariant:
    v = ServedVariant(point, "x", curve=[level(c, throughput, p95)], seconds=1.0)
    v.score_at(v.curve[0])
    return v


def space(**kw) -> SearchSpace:
    base = dict(peak=8, largest_fit=64, fixed_max=None, cores=2, gpu=False, concurrency=0, rules_delay_us=200)
    return SearchSpace(**{**base, **kw})


# -- the space ----------------------------------------------------------------------------------------------


def test_cpu_layouts_never_use_more_threads_than_cores():
    assert layouts(space()) == [(1, 2), (2, 1)]
    assert layouts(space(cores=16)) == [(1, 16), (2, 8), (4, 4), (8, 2)]
    assert all(n * t <= 6 for n, t in layouts(space(cores=6)))
    assert layouts(space(cores=16, gpu=True)) == [(1, None), (2, None)]


def test_beside_other_load_a_cpu_search_measures_only_the_starts_layout_and_still_searches_the_batcher():
    start = OperatingPoint(8, (8,), 200, 1, 16)
    held = SearchSpace.of(None, start, 16, gpu=False, concurrency=64, beside_load=True)
    grid = coarse_grid(held)
    assert {(p.instances, p.threads) for p in grid} == {(1, 16)}
    assert len({p.max_batch_size for p in grid}) > 1
    assert all((p.instances, p.threads) == (1, 16) for p in refinements(grid[0], held, set(grid)))
    assert len(layouts(SearchSpace.of(None, start, 16, gpu=False, concurrency=64))) == 4  # a quiet machine compares them
    gpu_start = OperatingPoint(8, (8,), 200, 1, None)
    assert layouts(SearchSpace.of(None, gpu_start, 16, gpu=True, beside_load=True)) == [(1, None), (2, None)]  # busy CPU cores, not the GPU


def test_a_max_1_start_keeps_the_in_process_peak_and_the_rules_delay_in_the_space():
    """A padding backend's rules may start at max 1 (no batching, so no delay or preferred size in its config); the
    refinement still tries the rules' preferred size and delay around a batching variant (the issue's coarse pass)."""
    from optimizer.records.measurements import MaxBatchDecision

    decision = MaxBatchDecision([], 1, 1, 2, "peak", peak=2, largest_fit=4)
    start = OperatingPoint(1, (), 0, 1, 2)
    sp = SearchSpace.of(decision, start, 2, gpu=False, rules_delay_us=130)
    assert (sp.peak, sp.rules_delay_us, sp.largest_fit) == (2, 130, 4)
    around = refinements(OperatingPoint(4, (), 0, 1, 2), sp, {start})
    assert OperatingPoint(4, (2,), 0, 1, 2) in around and OperatingPoint(4, (), 130, 1, 2) in around
    assert OperatingPoint(4, (2,), 130, 1, 2) in around
    fixed = SearchSpace.of(MaxBatchDecision([], 1, 1, 2, "user_cap", peak=2, largest_fit=4), start, 2, gpu=False, user_max=1, rules_delay_us=130)
    assert (fixed.peak, fixed.largest_fit) == (1, 1), "a --max-batch-size 1 stays the whole space"
    padded = SearchSpace.of(MaxBatchDecision([], 8, 1, 2, "peak", peak=2, largest_fit=16), OperatingPoint(8, (), 100, 1, 2), 2, gpu=False, pads=True)
    assert padded.peak == 2, "a padding backend's start carries no preferred size below its max: the in-process peak stays in the space"


def test_the_coarse_pass_covers_layouts_by_the_peak_2x_4x_and_the_largest_fit_without_delay_or_preferred_sizes():
    grid = coarse_grid(space(concurrency=64))
    assert {(p.max_batch_size, p.instances) for p in grid} == {(b, n) for b in (8, 16, 32, 64) for n in (1, 2)}
    assert all(p.queue_delay_us == 0 and p.preferred == () for p in grid)  # Model Analyzer's batcher defaults
    assert [p.max_batch_size for p in grid[:2]] == [8, 8]  # every layout at the peak before other sizes
    no_load = [p.max_batch_size for p in coarse_grid(space(peak=256, largest_fit=256))]
    assert no_load == [1, 1, 4, 4, 16, 16, 64, 64, 256, 256]  # no load: the start measured the peak's row, smaller maxima first


def test_a_users_max_is_never_changed_and_the_largest_fit_never_exceeded():
    assert max_batches(space(fixed_max=6)) == [6]
    assert max(max_batches(space(peak=32, largest_fit=48))) == 48
    assert max_batches(space(peak=4, concurrency=8)) == [2, 4, 8]  # batch-1 requests at concurrency 8 never form more
    assert max_batches(space(batching=False)) == [0]
    assert max_batches(space(peak=64, largest_fit=64, concurrency=64)) == [8, 16, 32, 64]  # the peak at a cap: smaller maxima fill the pass


def test_with_no_load_the_coarse_pass_has_a_max_each_load_of_the_ladder_fills():
    """A padding backend computes max_batch_size rows whatever arrives: a peak of 256 alone would leave the ladder's
    concurrency 4 nothing it can fill."""
    assert max_batches(space(peak=256, largest_fit=256)) == [1, 4, 16, 64, 256]  # max 1 for the lone client
    assert max_batches(space(peak=2, largest_fit=8)) == [1, 2, 4, 8]  # never above the largest fit
    assert max_batches(space(peak=4, largest_fit=8)) == [1, 4, 8]
    assert max_batches(space(peak=8, largest_fit=64)) == [1, 4, 8, 16, 64]  # the peak and 2x stay
    assert max_batches(space(peak=8, largest_fit=64, loads=(4, 16))) == [4, 8, 16, 64]  # a range's own loads
    assert max_batches(space(peak=1, largest_fit=1)) == [1]


def test_refinement_tries_the_rules_delay_and_preferred_size_and_a_max_between_measured_ones():
    best = OperatingPoint(16, (), 0, 2, 1)
    measured = {OperatingPoint(b, (), 0, 2, 1) for b in (8, 16, 64)}
    out = refinements(best, space(), measured)
    assert OperatingPoint(16, (), 200, 2, 1) in out  # the rules' queue delay
    assert OperatingPoint(16, (8,), 0, 2, 1) in out and OperatingPoint(16, (8,), 200, 2, 1) in out  # the rules' preferred size
    assert OperatingPoint(32, (), 0, 2, 1) in out  # 16 -> 64 is a 4x gap
    assert out.index(OperatingPoint(32, (), 0, 2, 1)) < out.index(OperatingPoint(16, (), 200, 2, 1))  # the likelier gain first
    filled = refinements(best, space(), measured, fill_delay=1500)
    assert filled[0] == OperatingPoint(16, (), 1500, 2, 1)
    assert not any(p in measured for p in out)
    assert all(p.max_batch_size == 6 for p in refinements(OperatingPoint(6, (), 0, 1, 2), space(fixed_max=6), set()))
    assert all(max(p.preferred, default=0) <= 4 for p in refinements(OperatingPoint(4, (), 0, 1, 2), space(concurrency=4), set()))
    halved = refinements(OperatingPoint(256, (256,), 1, 1, 2), space(peak=256, largest_fit=256), {OperatingPoint(64, (), 0, 1, 2)})
    assert OperatingPoint(128, (), 1, 1, 2) in halved  # a preferred size above the new max is dropped, never published
    assert all(max(p.preferred, default=0) <= p.max_batch_size for p in halved)


def test_a_fill_delay_is_tried_only_where_the_lightest_load_left_batches_unfilled():
    """A backend that pads to max_batch_size wants the light load's requests to meet: a delay about a quarter of their
    latency where that load cannot fill the max (each batch waits it out), three quarters where it can (it costs nothing
    while batches fill, and outlasts one execution when the clients split in two groups), bounded; never where the
    batches already filled, and never for a variant that cannot batch."""
    point = OperatingPoint(8, (), 0, 1, 2)

    def measured(batch: float | None, p50: float = 4.0, at: int = 4) -> ServedVariant:
        lone = [LoadLevel(1, 200.0, 2, 2, 2, 2, 1.0)] if at > 1 else []  # a lone client first, as the ladder measures it
        return ServedVariant(point, "coarse", curve=[*lone, LoadLevel(at, 500.0, p50, p50, p50, p50, batch), LoadLevel(16, 900.0, 9, 9, 9, 9, 4.0)])

    assert fill_delay_us(measured(1.9), space()) == 1000  # 4 ms at the lightest load, 4 in flight for max 8: 1000 us
    assert OperatingPoint(8, (), 1000, 1, 2) in refinements(point, space(), set(), fill_delay_us(measured(1.9), space()))
    assert fill_delay_us(measured(1.9, at=8), space()) == 3000  # 8 in flight can fill max 8: three quarters of 4 ms
    assert fill_delay_us(replace(measured(1.9, at=16), point=replace(point, instances=2)), space()) == 3000  # 8 an instance
    assert fill_delay_us(replace(measured(1.9, at=8), point=replace(point, instances=2)), space()) == 1000  # 4 an instance
    assert fill_delay_us(measured(3.8), space()) is None  # the batch already filled
    lone = ServedVariant(point, "coarse", curve=[LoadLevel(1, 200.0, 2, 2, 2, 2, 1.0)])
    assert fill_delay_us(lone, space()) is None  # one request at a time can form nothing larger
    assert fill_delay_us(measured(1.2, p50=400.0), space()) == 20000  # bounded
    assert fill_delay_us(measured(1.2, p50=0.1), space()) == 400  # never shorter than twice the rules' delay (200 us here)
    # with a target load, none for a max that holds every request of it: at one client fewer each batch waits it out
    assert fill_delay_us(measured(1.9, at=8), space(concurrency=8)) is None
    assert fill_delay_us(measured(1.9, at=16), space(concurrency=16)) == 3000  # 16 clients hold two batches of 8
    assert fill_delay_us(measured(None), space()) is None  # no batch figure: nothing to go on
    assert fill_delay_us(replace(measured(1.5), point=OperatingPoint(1, (), 0, 1, 2)), space()) is None


def test_the_seed_is_two_peak_batches_in_flight_per_instance():
    assert seed_concurrency(START) == 16
    assert seed_concurrency(OperatingPoint(0, (), 0, 1, None)) == 2
    assert seed_concurrency(OperatingPoint(4096, (4096,), 0, 1, None)) == 64


# -- the objective ------------------------------------------------------------------------------------------


def _sweep(objective: Objective, served, seed: int) -> list[int]:
    curve: list[LoadLevel] = []
    c: int | None = objective.first_level(seed)
    while c is not None:
        curve.append(served(c))
        c = objective.next_level(curve)
    return [lv.concurrency for lv in curve]


def _saturating(c: int) -> LoadLevel:
    return level(c, min(100.0 * c, 800.0))  # one request at a time 100/s, saturated at 8 in flight


def test_a_given_load_is_measured_there_only():
    assert _sweep(Objective(concurrency=12), _saturating, 64) == [12]


def test_with_no_load_every_variant_climbs_one_ladder_until_throughput_stops_growing():
    assert _sweep(Objective(), _saturating, 2) == [1, 4, 16, 64]  # from a lone client; 16 served more than 4, 64 no more than 16
    assert _sweep(Objective(), _saturating, 64) == [1, 4, 16, 64]  # the seed does not move the ladder: curves compare load by load
    assert _sweep(Objective(), lambda c: level(c, 10.0 * c), 2) == [1, 4, 16, 64, 256]  # still growing: up to the cap
    assert _sweep(Objective(), lambda c: level(c, 100.0), 2) == [1, 4, 16]  # a lone client and two steps up, always
    knee, meets = Objective().score([_saturating(c) for c in (2, 4, 8, 16)])
    assert knee is not None and knee.concurrency == 8 and meets  # the smallest load that serves the peak


def test_with_no_load_the_variant_closest_to_the_best_at_every_load_wins_over_the_highest_peak():
    # the shape of a padding backend's curves: a large max (padded to it) peaks higher at 64 but serves
    # far less at 4 and 16; a small max is never far from the best
    padded = [level(4, 200.0), level(16, 500.0), level(64, 1075.0)]
    small = [level(4, 700.0), level(16, 950.0), level(64, 960.0)]
    ratios = robust_ratios({"padded": padded, "small": small})
    assert ratios["padded"] == (pytest.approx(200.0 / 700.0), 4)
    assert ratios["small"] == (pytest.approx(960.0 / 1075.0), 64)
    # a curve that stopped early is taken as flat past its last load, so stopping on a plateau is no penalty
    flat = robust_ratios({"stopped": [level(4, 700.0), level(16, 1000.0)], "climbed": [level(4, 690.0), level(16, 1000.0), level(64, 1010.0)]})
    assert flat["stopped"][0] == pytest.approx(1000.0 / 1010.0)


def test_a_latency_budget_takes_the_most_throughput_at_any_load_within_it():
    budget = Objective(latency_budget_ms=15.0)  # 8 in flight answer in 10 ms, 16 in 20 ms
    assert _sweep(budget, _saturating, 32) == [32, 16, 8]  # halved until it met the budget
    best, meets = budget.score([_saturating(c) for c in (8, 16, 32)])
    assert best is not None and best.concurrency == 8 and meets
    _, meets = Objective(latency_budget_ms=1.0).score([_saturating(c) for c in (1, 2)])
    assert not meets


def test_the_percentile_asked_for_is_the_one_used():
    lv = LoadLevel(8, 100.0, 5.0, 30.0, 80.0, 90.0)
    assert Objective(latency_budget_ms=40.0, percentile=90).score([lv])[1]
    assert not Objective(latency_budget_ms=40.0, percentile=95).score([lv])[1]


# -- what counts as better ----------------------------------------------------------------------------


def test_noise_does_not_decide_but_a_clear_gain_or_a_much_lower_latency_does():
    base = variant(START, 100.0, p95=50.0)
    assert not better(variant(START, 102.0, p95=50.0), base, None)  # within the 3 % noise
    assert better(variant(START, 104.0, p95=50.0), base, None)
    assert better(variant(START, 99.0, p95=30.0), base, None)  # as fast, answers much sooner
    assert not better(variant(START, 99.0, p95=30.0), base, None, top=110.0)  # but not below what another variant served
    assert close(variant(START, 100.0), variant(START, 109.0)) and not close(variant(START, 100.0), variant(START, 112.0))


def test_a_latency_budget_comes_before_throughput():
    fast_but_slow_to_answer = variant(START, 200.0, p95=80.0)
    within = variant(START, 120.0, p95=40.0)
    assert better(within, fast_but_slow_to_answer, 50.0)
    assert not better(fast_but_slow_to_answer, within, 50.0)
    assert better(variant(START, 150.0, p95=45.0), within, 50.0)


# -- the prediction validate checks ---------------------------------------------------------------------------


def test_the_prediction_interpolates_latency_between_measured_loads_and_stays_flat_past_the_last():
    curve = [_saturating(c) for c in (1, 4, 16)]
    assert predict_throughput(curve, 2) == pytest.approx(200.0)  # latency 10 ms at 1 and 4 in flight: 2 in flight, 200/s
    assert predict_throughput(curve, 8) == pytest.approx(800.0, rel=0.25)
    assert predict_throughput(curve, 64) == pytest.approx(800.0)
    anchored = predict_throughput(curve[1:], 2, single_request_ms=10.0)
    assert anchored == pytest.approx(200.0)  # below the first measured load: one request's latency anchors it
    assert predict_throughput([], 4) is None


def _batching_server(c: int, max_batch: int = 4, delay_ms: float = 0.5) -> LoadLevel:
    """A made-up served config: 1 ms a lone request, +0.1 ms per request in flight, and below the max batch (where
    closed-loop batches cannot fill) every request waits the queue delay too."""
    latency = 1.0 + 0.1 * (c - 1) + (delay_ms if c < max_batch else 0.0)
    return level(c, c * 1000.0 / latency)


def test_below_the_first_measured_load_the_prediction_extrapolates_latency_and_adds_the_batchers_wait():
    curve = [_batching_server(c) for c in (4, 16)]
    point = OperatingPoint(4, (), 500, 2, 1)
    for c in (1, 2, 3, 8, 12):
        assert predict_throughput(curve, c, 0.2, point) == pytest.approx(_batching_server(c).throughput, rel=1e-6)
    # the loads measured fill their batches, so their line has no wait in it: without the batcher a lone request
    # would be predicted 1.5x too fast (1 ms instead of 1.5)
    assert predict_throughput(curve, 1, 0.2) == pytest.approx(1.5 * _batching_server(1).throughput, rel=1e-6)
    # a preferred size the requests in flight can form leaves at once: no wait at 2 with preferred [2]
    assert predict_throughput(curve, 2, 0.2, OperatingPoint(4, (2,), 500, 2, 1)) == pytest.approx(2000.0 / 1.1)
    assert predict_throughput(curve, 1, 0.2, OperatingPoint(4, (), 0, 2, 1)) == pytest.approx(1000.0)  # no delay, no wait


def _padding_server(c: int, max_batch: int = 4, full_ms: float = 6.6) -> LoadLevel:
    """A made-up openvino-like config, one instance: every execution computes a full max batch (6.6 ms) whatever arrives,
    so c requests in flight above the max take ceil(c / max) executions."""
    return level(c, c * 1000.0 / (-(-c // max_batch) * full_ms))


def test_a_padding_backend_is_predicted_to_pay_for_full_executions_between_multiples_of_its_max():
    curve = [_padding_server(c) for c in (4, 16)]
    point = OperatingPoint(4, (), 0, 1, 2)
    for c in (5, 6, 7, 9, 12):
        assert predict_throughput(curve, c, None, point, pads=True) == pytest.approx(_padding_server(c).throughput, rel=1e-6)
    # read as a backend that computes only what arrives, 5 in flight would be predicted 1.6x what the padded one serves
    assert predict_throughput(curve, 5, None, point) == pytest.approx(1.6 * _padding_server(5).throughput, rel=1e-6)


def test_a_queue_delay_that_outlasts_an_execution_fills_a_padding_backends_batches_between_multiples_of_its_max():
    """A request left over waits for the others to come back when the delay outlasts one full execution (6.6 ms here):
    every batch is full and c in flight serve the full-batch rate; a shorter delay lets it go alone, padded."""
    curve = [_padding_server(c) for c in (4, 16)]
    full_rate = _padding_server(4).throughput
    for c in (5, 6, 7, 9, 12):
        assert predict_throughput(curve, c, None, OperatingPoint(4, (), 9000, 1, 2), pads=True) == pytest.approx(full_rate, rel=1e-6)
        assert predict_throughput(curve, c, None, OperatingPoint(4, (), 3000, 1, 2), pads=True) == pytest.approx(_padding_server(c).throughput, rel=1e-6)


def test_the_extrapolated_latency_stays_within_littles_bounds():
    steep = [level(4, 4000.0), level(16, 2000.0)]  # latency 1 ms at 4, 8 ms at 16: the line would reach below zero at 1
    assert predict_throughput(steep, 1) == pytest.approx(4000.0)  # never more than the throughput measured at 4
    flat = [level(4, 400.0), level(16, 1600.0)]  # 10 ms at every load: one request is no slower than four
    assert predict_throughput(flat, 1) == pytest.approx(100.0)


# -- the search against a made-up server ------------------------------------------------------------------------


class _Loader:
    """Stands in for the repository API: loads always succeed, every load and unload is recorded, and each private name's
    config is read back into the operating point it was rendered for."""

    url = "made-up:0"

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.points: dict[str, OperatingPoint] = {}
        self.max_loaded = 0
        self.loads: list[set[str]] = []  # the names of each load call, in order
        self.unloads: list[tuple[set[str], bool]] = []  # the names of each unload call and whether it waited, in order

    def __enter__(self) -> _Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.loaded.clear()

    def add_source(self, candidate: str, **source) -> None:
        pass

    def load(self, configs: dict[str, str], files=None, candidate: str = "") -> dict[str, str]:
        self.loads.append(set(configs))
        for name, text in configs.items():
            config = parse(text)
            key = next((k for k in ("intra_op_thread_count", "INFERENCE_NUM_THREADS") if k in config.parameters), None)
            threads = config.parameters[key].string_value if key else ""
            self.points[name] = OperatingPoint(config.max_batch_size, tuple(config.dynamic_batching.preferred_batch_size),
                                               config.dynamic_batching.max_queue_delay_microseconds,
                                               sum(g.count or 1 for g in config.instance_group) or 1, int(threads) if threads.isdigit() else None,
                                               candidate)
        self.loaded |= set(configs)
        self.max_loaded = max(self.max_loaded, len(self.loaded))
        return {}

    def unload(self, names, wait: bool = True) -> None:
        self.loaded -= set(names)
        self.unloads.append((set(names), wait))

    def runtime(self, name: str) -> str:
        return ""


class _QuietWatch:
    """No other process's load reaches a measurement."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def peak_within(self, last_s):
        return 0.0


@dataclass(frozen=True)
class _Bench(search_module.Bench):
    """A made-up server's measurements: `served(point, concurrency)` for the point a private name was loaded with."""

    served: Any = None
    loader: Any = None
    wrong: str = ""
    watcher: Any = _QuietWatch
    quiet: Any = None  # wait_for_quiet(limit, seconds) -> what it saw
    clock: Any = None  # the search's clock (None: the real one)

    def measure(self, model, concurrency, window_ms):
        if "padded" in Path(self.input_data).name:  # the padding trial's bench: the traffic padded to bucket edges
            return self.served(self.loader.points[model], concurrency, padded=True)
        return self.served(self.loader.points[model], concurrency)

    def warm(self, model, concurrency, requests):
        return None

    def wrong_answers(self, result, model, renamed, fronted):
        return self.wrong

    def padded_answers(self, model, pairs, tolerances, cosine):
        return ""

    def watch(self):
        return self.watcher()

    def wait_for_quiet(self, limit, seconds):
        return self.quiet(limit, seconds) if self.quiet is not None else 0.0

    def now(self):
        return self.clock() if self.clock is not None else time.monotonic()


class _Rig(Rig):
    """served_search() against a made-up server: no tritonserver, no perf_analyzer; the order, the scoring, the configs
    and the publishing choice are the real ones."""

    def __init__(self, bench_kw: dict, baseline: float | None) -> None:
        self.loader_ = _Loader()
        self.bench_kw, self.baseline = bench_kw, baseline

    @contextmanager
    def server(self, result, options, request, search, text, extra, on_event):
        share = None if self.baseline is None else type("Share", (), {"others_busy": self.baseline, "reduced": False})()
        yield Where("a made-up server", self.loader_.url, lambda: None, share=share)

    def loader(self, where, request):
        return self.loader_

    def bench(self, where, input_data, rows, request):
        return _Bench(where.url, input_data, rows, request.workdir, loader=self.loader_, **self.bench_kw)

    def cores(self):
        return 2


class _Run:
    """What a test reads of a finished search: the published variant and each variant's worst score."""

    def __init__(self, search: ServedSearch) -> None:
        self.search = search
        self.best = search.chosen_variant
        self.robust = {v.point: (v.worst, v.worst_at) for v in search.variants if v.worst is not None}


def _run(monkeypatch, tmp_path: Path, served, request: SearchRequest, decision_largest: int = 64, budget_s: float = 600.0, wrong: str = "",
         baseline: float | None = None, start_max: int = 8, pads: bool = False, watch=None, quiet=None, clock=None,
         lengths: list[int] | None = None, other_kind: bool = False):
    """Run the public served_search() against `served(point, concurrency) -> LoadLevel`: a result whose in-process
    rules start at max `start_max` (its peak) and whose largest batch that fit is `decision_largest`; the repository API
    and perf_analyzer are replaced (_Rig), the order, the scoring and the publishing choice are the real ones."""
    platform = "openvino" if pads else "onnxruntime_onnx"
    params = {"INFERENCE_NUM_THREADS": "2", "ENABLE_BATCH_PADDING": "YES"} if pads else {"intra_op_thread_count": 2}
    m = request.user_max or min(start_max, decision_largest)  # the rules' start: the user's max, else the peak within what fit
    run_dir = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    inputs = (tensor("tokens", "int64", "1-64"),) if lengths else (tensor("image", "float32", "3x8x8"),)
    result = make_result(run_dir, platform, inputs=inputs, max_batch=m, knee=m, triton_settings={"parameters": params})
    result.selected_candidate.decision.largest_fit = request.user_max or decision_largest
    if other_kind:  # a passed candidate of the other kind (onnxruntime beside openvino), slower in-process
        other = make_result(run_dir / "other", "onnxruntime_onnx", inputs=inputs, max_batch=8, knee=8,
                            triton_settings={"parameters": {"intra_op_thread_count": 2}}).selected_candidate
        other.decision.largest_fit = decision_largest
        other.decision.profiles = [replace(p, throughput=p.throughput / 2) for p in other.decision.profiles]
        result.candidates.append(other)
    if lengths:  # a traffic of these token lengths, one request each
        traffic = Traffic(tuple({"tokens": np.arange(n, dtype=np.int64)[None]} for n in lengths), "file", "--traffic t.json")
        save_feeds(run_dir / "samples" / "traffic.npz", list(traffic.requests))
        result.reference = replace(result.reference, traffic=str(run_dir / "samples" / "traffic.npz"))
        result.traffic = traffic.summary(Signature.from_json(result.signature)).to_json()
    rig = _Rig({"served": served, "wrong": wrong, "watcher": watch or _QuietWatch, "quiet": quiet, "clock": clock}, baseline)
    request = replace(request, budget_s=budget_s, use_cache=False, workdir=tmp_path / "search")
    search = served_search(result, PublishOptions(tmp_path / "repo", "m"), request, rig=rig)
    return _Run(search), search, rig.loader_, search.stopped or search.reason


def _two_instances_and_batch_16(point: OperatingPoint, c: int) -> LoadLevel:
    """A made-up server: two instances serve 20% more, batches up to 16 help, a queue delay costs 2%."""
    cap = {1: 100.0, 2: 180.0, 4: 300.0, 8: 420.0, 16: 500.0, 32: 480.0, 64: 450.0}
    peak = cap[min(cap, key=lambda b: abs(b - max(1, point.max_batch_size)))] * (1.2 if point.instances == 2 else 1.0)
    peak *= 0.98 if point.queue_delay_us else 1.0
    return level(c, min(peak, 60.0 * c))


def test_the_search_covers_the_grid_and_publishes_the_best_point_it_measured(monkeypatch, tmp_path: Path):
    run, search, loader, stopped = _run(monkeypatch, tmp_path, _two_instances_and_batch_16, SearchRequest(tmp_path))
    assert "every variant" in stopped
    assert run.best.point.instances == 2 and run.best.point.max_batch_size == 16
    measured = {v.point for v in search.variants if v.status == "measured"}
    assert run.best.point in measured
    assert len(measured) >= 12 and not loader.loaded  # every variant was unloaded
    assert loader.max_loaded <= run_module.LOAD_GROUP
    chosen = next(v for v in search.variants if v.point == run.best.point)
    assert chosen.level(1) is not None  # the anchor of validate's prediction: the ladder measures a lone client


@pytest.mark.parametrize("filled", [True, False])
def test_with_time_left_a_variant_no_refinement_could_lift_to_the_best_is_not_refined(monkeypatch, tmp_path: Path, filled):
    """At the load, two instances serve 0.55x one with two threads: with batches that filled, no refinement can lift them to
    the best and none is measured; where their batches did not fill, a fill delay could (FILL_LIFT) and theirs is
    measured."""

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        rate = 330.0 if point.instances == 2 else 600.0 * (1.01 if point.queue_delay_us else 1.0)
        formed = min(point.max_batch_size, c // point.instances) if filled or point.instances == 1 else 1
        lat = 1000.0 * c / rate
        return LoadLevel(c, rate, lat * 0.6, lat * 0.9, lat, lat * 1.2, server_batch=float(formed))

    run, search, _, stopped = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path, concurrency=16))
    assert "every variant" in stopped and run.best.point.instances == 1
    refined = [v.point for v in search.variants if v.stage == "refine"]
    assert any(p.instances == 1 for p in refined)
    two = [p for p in refined if p.instances == 2]
    if filled:
        assert not two
    else:  # only the likeliest lift, the fill delay, of each unfilled variant
        assert two and all(p.queue_delay_us > 200 for p in two)


def test_a_close_call_is_measured_again_interleaved_and_the_faster_kept(monkeypatch, tmp_path: Path):
    calls: list[tuple[OperatingPoint, int]] = []

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        calls.append((point, c))
        # the single-instance 32 "wins" the coarse pass by luck (+4%); measured again it serves 5% less than 2x1t at 16 (the load: 32 in flight)
        lucky = point.instances == 1 and point.max_batch_size == 32 and point.queue_delay_us == 0 and not point.preferred
        settling = len([1 for p, _ in calls if p == point]) > 1  # the coarse pass measured it once, at the load
        base = 500.0 if point.instances == 2 and point.max_batch_size == 16 and not point.preferred and not point.queue_delay_us else 300.0
        tp = 520.0 if lucky and not settling else (475.0 if lucky else base)
        return level(c, min(tp, 60.0 * c))

    run, search, loader, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path, concurrency=32))
    settle = [v for v in search.variants if v.stage == "settle"]
    assert len(settle) == 2 and "A B B A" in search.settled
    assert run.best.point == OperatingPoint(16, (), 0, 2, 1)
    # the kept one answers its lone request still loaded from the settling (no load of its own), then nothing is left
    assert calls[-1] == (run.best.point, 1) and any(v.stage == "base" for v in search.variants)
    assert len(loader.loads[-1]) == 2 and not loader.loaded
    loser, waited = loader.unloads[-2]  # the settling's other variant went, waited for, before the kept one was measured
    assert len(loser) == 1 and loser < loader.loads[-1] and waited
    assert all(not w for names, w in loader.unloads[:-2] if len(names) > 1)  # a group's unloading is left to the next load


def _burst_watch(burst: dict, cores: float = 1.0) -> type:
    """A stand-in for LoadWatch: others' load during the measurement it wraps is `cores` when `served` set burst["now"]
    (the burst landed in it), else none."""

    class Watch:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.peak, burst["now"] = (cores if burst["now"] else 0.0), False

        def peak_within(self, last_s):
            return self.peak

    return Watch


def test_a_measurement_other_load_reached_is_taken_again_once_it_falls_back(monkeypatch, tmp_path: Path):
    """A burst from another process lands in the first measurement of the best variant: it is measured again after
    waiting for the load to fall back, the undisturbed figure counts, and the search says how many it repeated."""
    burst = {"now": False, "landed": 0}
    waits: list[float] = []

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        if not burst["landed"] and point.instances == 2 and point.max_batch_size == 16:  # the burst halves the variant it lands in
            burst.update(now=True, landed=1)
            return level(c, _two_instances_and_batch_16(point, c).throughput / 2)
        return _two_instances_and_batch_16(point, c)

    run, search, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), baseline=0.05, watch=_burst_watch(burst),
                             quiet=lambda limit, wait_s: waits.append(limit) or 0.0)
    assert burst["landed"] and search.remeasured == 1 and waits == [pytest.approx(0.35)]
    assert run.best.point.instances == 2 and run.best.point.max_batch_size == 16  # the burst did not cost it the choice
    levels = [lv for v in search.variants for lv in v.curve]
    assert levels and all(lv.others_busy == 0.0 for lv in levels)  # every level that counts was measured undisturbed


def test_time_spent_measuring_again_is_added_to_the_budget_so_bursts_do_not_cut_the_search_short(monkeypatch, tmp_path: Path):
    """On a clock that only measurements move (1 s a level), a budget the quiet search spends before its refinement is
    done; bursts that reach a few levels cost their repeats and waits, which move the deadline back, so the busy search
    measures what the quiet one did and publishes the same point: repeats that ate into the budget would leave the busy
    search without the refinements (a queue delay) the quiet one found."""
    now = [0.0]

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        now[0] += 1.0
        return _two_instances_and_batch_16(point, c)

    class Watch:  # bursts reach four levels early in the search (takes 3, 5, 7, 9); each repeat is quiet
        takes = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            Watch.takes += 1
            self.peak = 1.0 if Watch.takes in (3, 5, 7, 9) else 0.0

        def peak_within(self, last_s):
            return self.peak

    def wait(limit, wait_s):
        now[0] += 2.0  # the burst ends 2 s into the wait
        return 0.0

    _, quiet, _, quiet_stopped = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), budget_s=60.0, baseline=0.0,
                                      watch=_steady_watch(0.0), quiet=wait, clock=lambda: now[0])
    assert "ran out" in quiet_stopped  # the budget bounds this search: what it measured depends on the time it had
    quiet_took = now[0]
    now[0] = 0.0
    _, busy, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), budget_s=60.0, baseline=0.0, watch=Watch, quiet=wait,
                         clock=lambda: now[0])
    assert busy.remeasured == 4 and busy.retried_s == pytest.approx(4 * (1.0 + 2.0))  # each repeat: the wait and the level
    assert busy.retried_s <= clock_module.REMEASURE_SHARE * 60.0
    measured = lambda s: sorted((repr(v.point), v.stage) for v in s.variants if v.status == "measured")
    assert measured(busy) == measured(quiet) and busy.chosen == quiet.chosen
    assert now[0] == pytest.approx(quiet_took + busy.retried_s)  # the search took its budget plus the repeats, no more


def test_a_disturbed_level_too_slow_to_matter_even_undisturbed_is_not_taken_again(monkeypatch, tmp_path: Path):
    """Bursts reach the first measurement at concurrency 16 of two coarse variants: max 4 on one instance (read at 60/s,
    so under 240/s even if the burst had slowed it BURST_SLOWDOWN times, far below the 412/s the start served there) and
    max 16 on two (read at half its 600/s, which could be the best). Only the second is measured again: the repeats'
    time goes where it can change the choice."""
    hit = {OperatingPoint(4, (), 0, 1, 2): True, OperatingPoint(16, (), 0, 2, 1): True}
    burst = {"now": False}

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        if c == 16 and hit.pop(point, False):
            burst["now"] = True
            return level(c, 60.0 if point.instances == 1 else 300.0)
        return _two_instances_and_batch_16(point, c)

    waits: list[float] = []
    run, search, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), baseline=0.0, watch=_burst_watch(burst),
                             quiet=lambda limit, wait_s: waits.append(limit) or 0.0)
    assert not hit and search.remeasured == 1 and len(waits) == 1  # both bursts landed; one level was measured again
    slow = next(v for v in search.variants if v.point == OperatingPoint(4, (), 0, 1, 2))
    assert slow.level(16).others_busy == 1.0 and slow.level(16).throughput == 60.0  # kept as measured: a lower bound
    assert run.best.point == OperatingPoint(16, (), 0, 2, 1) and run.best.level(16).others_busy == 0.0


def _steady_watch(cores: float) -> type:
    """A stand-in for LoadWatch that sees other processes use `cores` during every measurement."""

    class Watch:
        peak = cores

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def peak_within(self, last_s):
            return self.peak

    return Watch


def test_a_steady_load_seen_as_the_search_began_is_the_baseline_not_a_disturbance(monkeypatch, tmp_path: Path):
    _, search, _, _ = _run(monkeypatch, tmp_path, _two_instances_and_batch_16, SearchRequest(tmp_path), baseline=1.0,
                           watch=_steady_watch(1.1),  # a spinner the probe saw (1.0 core) keeps running
                           quiet=lambda *a: pytest.fail("waited for a load that was there from the start"))
    assert search.remeasured == 0


def test_a_load_that_arrives_and_stays_is_waited_for_once_then_measured_beside(monkeypatch, tmp_path: Path):
    waits: list[float] = []
    run, search, _, _ = _run(monkeypatch, tmp_path, _two_instances_and_batch_16, SearchRequest(tmp_path), baseline=0.0,
                             watch=_steady_watch(1.0),  # a job started after the probe and runs to the end
                             quiet=lambda limit, wait_s: waits.append(limit) or 1.0)
    assert len(waits) == 1 and search.remeasured == 0  # measuring again beside it would give the same figures: the load
    # became the baseline (no second wait, though every later level saw it too)
    assert len({v.point for v in search.variants if v.status == "measured"}) >= 12  # the budget went to variants


def _padded_to_max(point: OperatingPoint, c: int) -> LoadLevel:
    """A made-up padding backend (as the openvino backend does): every execution computes max_batch_size rows, 1 ms a
    row on one instance, so a batch the load cannot fill wastes the rest."""
    rows = max(1, point.max_batch_size)
    formed = min(rows, c)  # c requests in flight form batches of up to c
    return level(c, 1000.0 * formed / rows)


def test_with_no_load_the_search_publishes_a_max_that_holds_up_at_light_loads_too(monkeypatch, tmp_path: Path):
    run, search, _, _ = _run(monkeypatch, tmp_path, _padded_to_max, SearchRequest(tmp_path), decision_largest=8)
    measured = [v for v in search.variants if v.status == "measured" and v.stage != "base"]
    assert {lv.concurrency for v in measured for lv in v.curve} <= {1, 4, 16, 64, 256}  # one ladder for every variant
    assert {v.point.max_batch_size for v in measured} >= {4, 8}
    # a max up to 4 fills at the ladder's lightest load; 8 pads there, and its sustained peak (the same 1000/s) hides it
    assert run.best.point.max_batch_size <= 4 and run.best.point in {v.point for v in measured}
    worst, _ = run.robust[run.best.point]
    assert worst >= 0.95 and run.robust[next(v.point for v in measured if v.point.max_batch_size == 8)][0] <= 0.55
    assert "A B B A" in search.settled  # maxima 1, 2 and 4 tie: the two best were measured again at every load
    assert any(v.stage == "settle" and v.point == run.best.point for v in search.variants)


def test_with_no_load_the_settling_picks_between_the_two_it_measured_again(monkeypatch, tmp_path: Path):
    """Maxima 2 and 4 read 8% high in their first window; measured again they tie with max 1, measured once. The settling
    takes the luck out of the two best only, so the choice stays between them."""
    counts: dict[tuple[OperatingPoint, int], int] = {}

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        counts[(point, c)] = counts.get((point, c), 0) + 1
        fair = _padded_to_max(point, c)
        return level(c, fair.throughput * 1.08) if point.max_batch_size in (2, 4) and counts[(point, c)] == 1 else fair

    run, search, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), decision_largest=8)
    settled = {v.point for v in search.variants if v.stage == "settle"}
    assert len(settled) == 2 and run.best.point in settled, search.settled


def test_with_no_load_a_variant_out_of_the_running_stops_climbing_the_ladder(monkeypatch, tmp_path: Path):
    """Two single-thread instances serve a fifth of one two-thread instance here: their ladder stops at its first load
    (more loads could only lower their worst ratio), saying why, and the time goes to variants that can still win."""
    def served(point: OperatingPoint, c: int) -> LoadLevel:
        return level(c, min(100.0 * c, 1000.0) * (0.2 if point.instances == 2 else 1.0))

    run, search, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), decision_largest=8)
    split = [v for v in search.variants if v.status == "measured" and v.point.instances == 2]
    assert split and all(len(v.curve) == 1 and "out of the running" in v.reason for v in split)
    assert all(len(v.curve) >= 2 for v in search.variants if v.status == "measured" and v.point.instances == 1 and v.stage in ("start", "coarse"))
    assert run.best.point.instances == 1


def test_time_left_after_the_best_two_goes_to_the_others_that_could_still_win(monkeypatch, tmp_path: Path):
    """A small space (the largest fit 8: maxima 2, 4, 8 x two layouts) runs out of refinements around the best two long
    before the budget: the third best (0.71x the best at its worst load) is refined too; maxima 2 (0.43x at best) and max
    4 on one instance (0.60x), which no refinement is taken to lift 1.5x (REFINE_LIFT), are not."""
    run, search, _, stopped = _run(monkeypatch, tmp_path, _two_instances_and_batch_16, SearchRequest(tmp_path), decision_largest=8)
    measured = [v for v in search.variants if v.status == "measured" and v.stage in ("start", "coarse", "refine")]
    assert "every variant" in stopped
    coarse = sorted((v for v in measured if v.stage == "coarse"), key=lambda v: -run.robust[v.point][0])
    third = coarse[2].point
    assert (third.max_batch_size, third.instances) == (4, 2) and run.robust[third][0] * run_module.REFINE_LIFT >= 1.0
    refined = [v.point for v in measured if v.stage == "refine"]
    assert any((p.max_batch_size, p.instances, p.threads) == (4, third.instances, third.threads) for p in refined)  # around the third best
    out = [v.point for v in coarse[3:]]
    assert out and all(run.robust[p][0] * run_module.REFINE_LIFT < 1.0 for p in out)
    assert not any((p.max_batch_size, p.instances, p.threads) == (o.max_batch_size, o.instances, o.threads) for p in refined for o in out)
    assert run.best.point in {v.point for v in measured}


def _fills_with_a_delay(point: OperatingPoint, c: int) -> LoadLevel:
    """A made-up server where batches up to 4 fill at every load, while a larger max without a delay of at least 400 us
    runs batches of 1 at concurrency 4 (c // 4 above it); 1 to 8 rows per execution serve 1000 to 2300/s."""
    fills = point.queue_delay_us >= 400 or point.max_batch_size <= 4
    formed = min(max(1, point.max_batch_size), c if fills else (1 if c <= 4 else c // 4))
    rate = {1: 1000.0, 2: 1800.0, 4: 2200.0, 8: 2300.0}[formed] * (0.9 if point.instances == 2 else 1.0)
    lat = 1000.0 * c / rate
    return LoadLevel(c, rate, lat * 0.6, lat * 0.9, lat, lat * 1.2, server_batch=float(formed))


def _one_second_a_level(monkeypatch, server):
    """A clock only measurements move (1 s a level) on a quiet machine, so a budget is a count of levels: `server` wrapped."""
    now = [0.0]

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        now[0] += 1.0
        return server(point, c)

    return served, {"clock": lambda: now[0], "watch": _steady_watch(0.0)}


def test_with_no_load_the_refinement_first_tries_the_delay_that_fills_a_max_failing_only_at_the_light_load(monkeypatch, tmp_path: Path):
    """On a clock that only measurements move (1 s a level), a budget that leaves two refinements before the settling.
    Max 4 and 8 without a delay are worst at concurrency 4 (1000/s beside max 2's 1800/s), so both max-2 layouts rank
    above them; their fill delay is what lifts them to the best at every load, and it is tried first.
    Why: ranked by the light load a delay would fix, the larger maxima would wait behind max 2's refinements, and a
    budget that ends first would publish max 2."""
    served, kw = _one_second_a_level(monkeypatch, _fills_with_a_delay)
    run, search, _, stopped = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), decision_largest=8, budget_s=30.0, baseline=0.0, **kw)
    assert "ran out" in stopped  # the budget bounds the search: which refinements it measured is the order's doing
    first = next(v for v in search.variants if v.stage == "refine")
    assert first.point.max_batch_size > 2 and first.point.queue_delay_us >= 400 and first.level(4).server_batch == 4
    assert run.best.point.max_batch_size > 2 and run.best.point.queue_delay_us >= 400
    assert run.robust[run.best.point][0] >= 0.95  # the best at every load; max 2 served 0.78x at concurrency 64


@pytest.mark.parametrize("cores,repeats", [(1.0, 0.0), (0.2, clock_module.REMEASURE_SHARE)])
def test_with_no_load_a_level_a_burst_reached_does_not_keep_a_variant_from_its_refinement(monkeypatch, tmp_path: Path, cores, repeats):
    """As above, and bursts halve the larger maxima's first measurement at concurrency 16 on one two-thread instance,
    with no time left to measure them again (REMEASURE_SHARE 0), or read at 0.2 cores (below the repeats' threshold: a
    burst near saturation gets only its share of the cores): those levels are lower bounds, so the delay that fills
    max 8 is still tried first and published, not a two-instance variant that no burst reached."""
    now = [0.0]
    burst = {"now": False}
    hit: set[OperatingPoint] = set()

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        now[0] += 1.0
        lv = _fills_with_a_delay(point, c)
        if c == 16 and point.instances == 1 and point.max_batch_size >= 4 and point.queue_delay_us < 400 and point not in hit:
            hit.add(point)
            burst["now"] = True
            return replace(lv, throughput=lv.throughput / 2)
        return lv

    monkeypatch.setattr(clock_module, "REMEASURE_SHARE", repeats)
    run, search, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), decision_largest=8, budget_s=45.0, baseline=0.0,
                             watch=_burst_watch(burst, cores), clock=lambda: now[0])
    assert len(hit) == 3 and search.remeasured == 0  # the start, max 4 and max 8: each kept at its halved figure
    first = next(v for v in search.variants if v.stage == "refine")
    assert (first.point.instances, first.point.max_batch_size) == (1, 8) and first.point.queue_delay_us >= 400
    assert run.best.point.instances == 1 and run.best.point.max_batch_size == 8 and run.best.point.queue_delay_us >= 400


def test_with_no_load_a_search_out_of_time_in_the_coarse_pass_measures_the_likeliest_gain_before_settling(monkeypatch, tmp_path: Path):
    """As above, with 10 s kept for settling and a budget that ends the coarse pass before its last maxima: the start
    (max 8, a 200 us delay that does not fill a batch at concurrency 4) could serve the most, so its fill delay is
    measured with the time kept for settling, and published, instead of settling two variants that both serve less."""
    monkeypatch.setattr(run_module.SearchRun, "_settle_reserve", lambda self: 10.0)
    served, kw = _one_second_a_level(monkeypatch, _fills_with_a_delay)
    run, search, _, stopped = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), decision_largest=8, budget_s=25.0, baseline=0.0, **kw)
    assert "ran out" in stopped
    order = [v.stage for v in search.variants]
    gain = next(v for v in search.variants if v.stage == "refine")
    assert order.index("refine") < len(order) - 1 - order[::-1].index("coarse")  # measured before the coarse pass ended
    assert gain.point == replace(search.start, queue_delay_us=gain.point.queue_delay_us) and gain.point.queue_delay_us >= 400
    assert run.best.point == gain.point


def _padding_with_a_batching_gain(point: OperatingPoint, c: int) -> LoadLevel:
    """A made-up padding backend whose full batches serve much more up to 8 rows, as a transformer's can: a max above the
    load computes rows nobody sent."""
    rows = max(1, point.max_batch_size)
    full = {1: 500.0, 2: 700.0, 4: 900.0, 8: 1500.0, 16: 1600.0, 32: 1650.0}[rows]
    formed = min(c, rows)
    return LoadLevel(c, full * formed / rows, 1.0, 1.0, 1.0, 1.0, server_batch=float(formed))


@pytest.mark.parametrize("pads", [True, False])
def test_with_no_load_a_padding_backend_measures_maxima_up_to_8_before_larger_ones(monkeypatch, tmp_path: Path, pads):
    """On a clock only measurements move (1 s a level) and a budget too short for every variant: a padding backend's
    coarse pass measures maxima up to 8 first (16 and 32, which pad the ladder's load of 4 4-8x, wait for the time left
    after the refinement; this budget ends before them) and publishes max 8. Measured first, 16 and 32 would spend the
    budget on variants that lose at the light loads, and max 8's refinement would go untried."""
    served, kw = _one_second_a_level(monkeypatch, _padding_with_a_batching_gain)
    run, search, _, stopped = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), decision_largest=32, budget_s=55.0,
                                   baseline=0.0, start_max=1, pads=pads, **kw)
    coarse = [v.point.max_batch_size for v in search.variants if v.stage == "coarse"]
    if pads:
        assert 8 in coarse[:6] and not {16, 32} & set(coarse[:6]), coarse  # 2, 4 and 8 in both layouts first
        assert run.best.point.max_batch_size == 8, run.best.point  # worst 0.83x the best at a load, max 4 0.55x
    else:  # the other backends keep the usual order: the large maxima before any refinement
        first_refine = next(i for i, v in enumerate(search.variants) if v.stage == "refine")
        assert {16, 32} <= {v.point.max_batch_size for v in search.variants[:first_refine]}


def test_the_time_budget_ends_the_search_with_the_best_measured(monkeypatch, tmp_path: Path):
    run, search, _, stopped = _run(monkeypatch, tmp_path, _two_instances_and_batch_16, SearchRequest(tmp_path, budget_s=0.0), budget_s=-1.0)
    assert "time budget" in stopped
    assert run.best.point in {v.point for v in search.variants if v.status == "measured"}


def test_the_time_budget_ends_a_sweep_between_loads(monkeypatch, tmp_path: Path):
    """A variant whose loads are slow to measure stops climbing when the budget is spent, says so, and still counts with
    the loads it measured: the budget bounds the search, not only the start of each variant."""
    def slow(point: OperatingPoint, c: int) -> LoadLevel:
        time.sleep(0.1)
        return level(c, min(100.0 * c, 5000.0))

    run, search, _, stopped = _run(monkeypatch, tmp_path, slow, SearchRequest(tmp_path), budget_s=0.25)
    start = search.variants[0]
    assert start.stage == "start" and 1 <= len(start.curve) < 4  # the ladder 4, 16, 64, 256 would have been measured
    assert "the time budget ran out" in start.reason and run.best is not None and "time budget" in stopped


def test_a_load_that_fails_after_the_first_ends_the_sweep_and_the_measured_loads_count(monkeypatch, tmp_path: Path):
    from optimizer.errors import ValidationError

    def times_out_above_16(point: OperatingPoint, c: int) -> LoadLevel:
        if c > 16:
            raise ValidationError("perf_analyzer did not finish within 120 s; narrow --concurrency.")
        return level(c, min(100.0 * c, 5000.0))

    run, search, _, _ = _run(monkeypatch, tmp_path, times_out_above_16, SearchRequest(tmp_path))
    start = search.variants[0]
    assert start.status == "measured" and [lv.concurrency for lv in start.curve] == [1, 4, 16]
    assert "stopped climbing at concurrency 64: perf_analyzer did not finish" in start.reason and run.best is not None


def test_a_server_that_answers_wrong_is_not_measured(monkeypatch, tmp_path: Path):
    run, search, loader, _ = _run(monkeypatch, tmp_path, _two_instances_and_batch_16, SearchRequest(tmp_path),
                                  wrong="output 'output__0' at batch=1: max abs error 3.2")
    assert [v.status for v in search.variants] == ["failed"] and "its answers are wrong" in search.variants[0].reason
    assert run.best is None and not loader.loaded


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 64), st.sampled_from([None, 3, 6, 32]), st.sampled_from([None, 4, 16]), st.integers(0, 10_000))
def test_every_published_point_was_measured_within_every_cap(largest, user_max, concurrency, salt):
    import random

    from _pytest.monkeypatch import MonkeyPatch

    rng = random.Random(salt)
    noise: dict[tuple, float] = {}

    def served(point: OperatingPoint, c: int) -> LoadLevel:
        key = (point, c)
        noise.setdefault(key, rng.uniform(50, 500))
        return level(c, noise[key])

    import tempfile

    with tempfile.TemporaryDirectory() as tmp, MonkeyPatch.context() as mp:
        request = SearchRequest(Path(tmp), concurrency=concurrency, user_max=user_max)
        run, search, _, _ = _run(mp, Path(tmp), served, request, decision_largest=largest)
    chosen = run.best.point
    assert chosen in {v.point for v in search.variants if v.status == "measured" and v.stage != "base"}
    searched = [v.point.max_batch_size for v in search.variants if v.stage != "start"]
    assert all(b == user_max for b in searched) if user_max else all(1 <= b <= largest for b in searched)
    assert all(1 < b <= v.point.max_batch_size for v in search.variants for b in v.point.preferred)  # a config Triton loads


# -- skips -----------------------------------------------------------------------------------------------


def test_a_tensorrt_plan_is_not_searched_and_keeps_the_rules(tmp_path: Path):
    result = make_result(tmp_path / "run", "tensorrt_plan", device="cuda:0", metadata={"engine_max_batch": 8})
    options = PublishOptions(tmp_path / "repo", "m")
    search = served_search(result, options, SearchRequest(tmp_path / "work", cache_dir=tmp_path / "cache"))
    assert search.status == "skipped" and "TensorRT" in search.reason
    assert search.chosen == search.start and not search.variants
    assert not (tmp_path / "repo").exists()  # the user's repository is never touched by the search


def test_the_chosen_point_is_what_the_config_says(tmp_path: Path):
    result = make_result(tmp_path / "run", "onnxruntime_onnx", triton_settings={"parameters": {"intra_op_thread_count": 2}})
    point = OperatingPoint(4, (4,), 0, 2, 1)
    text, _, spec = prepare_config(result, PublishOptions(tmp_path / "repo", "m", operating_point=point))
    config = parse(text)
    assert config.max_batch_size == 4 and list(config.dynamic_batching.preferred_batch_size) == [4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 0
    assert config.instance_group[0].count == 2 and config.parameters["intra_op_thread_count"].string_value == "1"
    assert "served search" in spec.batching.explanation


def test_a_search_record_round_trips():
    search = ServedSearch("searched", concurrency=8, start=START, chosen=START, variants=[variant(START, 10.0)], stand_in=True)
    again = ServedSearch.from_json(json.loads(json.dumps(search.to_json())))
    assert again == search and again.chosen_variant is not None


# -- for real --------------------------------------------------------------------------------------------


def _searched_at_the_given_load_and_validated(run_dir: Path, stdout: str, config, concurrency: int) -> tuple[ServedSearch, dict]:
    """An export with --concurrency and --validate: each variant was measured at that load only, the published `config`
    is the chosen variant, and validate tested a prediction at loads the search did not measure apart from repeating the
    ones it did. Returns the search and validation.json for the backend's own checks."""
    reports = run_dir / "aitune-reports" / "mlp"
    search = ServedSearch.from_json(json.loads((reports / "report.json").read_text())["published"]["served_search"])
    assert search.status == "searched", search.reason
    assert search.objective == "concurrency" and search.stand_in
    assert search.variants[0].stage == "start"
    measured = [v for v in search.variants if v.status == "measured"]
    assert len(measured) >= 2 and all(v.curve and v.throughput and v.p95_ms for v in measured)
    assert all(v.concurrency == concurrency for v in measured if v.stage != "base")  # the load given, and only it
    chosen = search.chosen_variant
    assert chosen is not None and chosen.point == search.chosen and chosen.differs == {} and search.concurrency == chosen.concurrency
    assert (config.max_batch_size, config.instance_group[0].count) == (search.chosen.max_batch_size, search.chosen.instances)
    assert list(config.dynamic_batching.preferred_batch_size) == list(search.chosen.preferred)
    assert config.dynamic_batching.max_queue_delay_microseconds == search.chosen.queue_delay_us
    assert f"served search for the most throughput at concurrency {concurrency}" in stdout
    tried = len({v.point for v in search.variants if v.stage not in ("settle", "base")})
    assert f"({tried} variant{'s' if tried != 1 else ''}" in stdout  # configs, not rows: the anchor is measured again
    report_md = (reports / "report.md").read_text()
    assert f"Chosen for the most throughput at concurrency {concurrency}" in report_md and (reports / "served_search.png").is_file()
    validation = json.loads((reports / "validation.json").read_text())
    assert validation["status"] == "passed", validation["reason"]
    assert validation["predictions"] and validation["repeatability"]  # both kinds of load were swept
    assert search.protocol == "grpc" and validation["perf"]["settings"]["protocol"] == "grpc"  # like with like
    assert not any("measured over" in n for n in validation["notes"])
    searched = {lv.concurrency for v in search.variants if v.point == search.chosen for lv in v.curve}
    assert all(p["concurrency"] not in searched for p in validation["predictions"])
    assert all(rp["concurrency"] in searched for rp in validation["repeatability"])
    assert validation["throughput_ratio"] is not None and "served / predicted at loads the served search did not measure" in stdout
    return search, validation


@pytest.mark.long  # the same chain as the torch-aoti case below, through the onnxruntime stand-in; make test-long runs it
def test_export_searches_in_the_server_and_publishes_what_it_measured(in_tmp: Path):
    """The load given, through the onnxruntime stand-in (see _searched_at_the_given_load_and_validated). (The
    sweep of the no-load objective is tested against a made-up server above: on the test MLP its high concurrencies
    can run perf_analyzer past its time limit on a small machine.)"""
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled", "--concurrency", "8",
                "--serve-search-seconds", "40", "--validate", cwd=in_tmp, serve_search=True)
    assert r.returncode == 0, r.stderr
    config = parse((in_tmp / "model_repository" / "mlp" / "config.pbtxt").read_text())
    search, _ = _searched_at_the_given_load_and_validated(in_tmp, r.stdout, config, 8)
    assert "stand-in" in search.served_by


@pytest.mark.slow
@pytest.mark.long  # over a minute (a compile, a search and a validate sweep); CI covers its parts: the search at a given load
# (test_core_share.py, test_remote_search.py), the pytorch stand-in serving torch-aoti (test_cpu_backends.py), validate
# (test_validate.py) and the prediction against the searched curve (the made-up server's tests above)
def test_torch_aoti_is_searched_at_the_load_given_and_validated_locally_through_the_pytorch_stand_in(in_tmp: Path):
    """The load given, through the pytorch stand-in (Triton 2.51 has no torch_aoti; see
    _searched_at_the_given_load_and_validated)."""
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "torch-aoti", "--eager-gate", "disabled", "--max-batch-size", "8",
                "--concurrency", "4", "--serve-search-seconds", "25", "--validate", "--validate-concurrency", "2:4:2", cwd=in_tmp,
                serve_search=True)  # validate at 2, a prediction (the search measures 4, and 1 for the prediction's anchor when time is left), and at 4, a repeat
    assert r.returncode == 0, r.stderr
    config = parse((in_tmp / "model_repository" / "mlp__positional" / "config.pbtxt").read_text())  # behind the ensemble mlp
    assert config.platform == "torch_aoti"  # the published config is for Triton 26.03+, unchanged by the local translation
    assert config.max_batch_size <= 8
    search, validation = _searched_at_the_given_load_and_validated(in_tmp, r.stdout, config, 4)
    assert "no platform 'torch_aoti'" in search.served_by
    assert validation["stand_in"] and all(a["passed"] and a["compared_with"] == "reference" for a in validation["answers"])
    assert any("no platform 'torch_aoti'" in n for n in validation["notes"])
    assert "[stand-in backend]" in r.stdout


def test_bad_serving_options_are_one_line_and_exit_2(in_tmp: Path):
    for args, words in ((("--concurrency", "0"), "--concurrency 0 must be from 1"),
                        (("--serve-search-seconds", "0"), "--serve-search-seconds 0 must be positive"),
                        (("--serve-search", "maybe"), "maybe")):
        r = run_cli("export", "tests.fixtures.models:mlp", *args, cwd=in_tmp, serve_search=True)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert not (in_tmp / "model_repository").exists()



# -- the cache ---------------------------------------------------------------------------------------------------


def test_a_cached_search_is_reused_only_for_the_same_key_and_a_corrupt_entry_is_ignored(tmp_path: Path, caplog):
    from optimizer.triton.measure.served_search.cache import ServedSearchCache, search_key

    result = make_result(tmp_path / "run", "onnxruntime_onnx", triton_settings={"parameters": {"intra_op_thread_count": 2}})
    start = prepare_config(result, PublishOptions(tmp_path / "repo", "m"))[0]
    key = search_key(result, start, SearchRequest(tmp_path), "home-a", "names")
    assert key == search_key(result, start, SearchRequest(tmp_path), "home-a", "names")
    others = {search_key(result, start, SearchRequest(tmp_path, concurrency=8), "home-a", "names"),
              search_key(result, start, SearchRequest(tmp_path, budget_s=30.0), "home-a", "names"),
              search_key(result, start, SearchRequest(tmp_path), "home-b", "names"),
              search_key(result, start.replace("max_batch_size", "max_batch_size ", 1), SearchRequest(tmp_path), "home-a", "names")}
    assert key not in others and len(others) == 4  # the load, the budget, the server build and the rules' config all count
    result.selected_candidate.decision.largest_fit *= 4  # a wider in-process space (larger batches fit) too
    assert search_key(result, start, SearchRequest(tmp_path), "home-a", "names") != key
    cache = ServedSearchCache(tmp_path / "cache")
    chosen = variant(START, 321.0)
    search = ServedSearch("searched", start=START, chosen=START, variants=[chosen])
    cache.store(key, search)
    again = cache.load(key)
    assert again is not None and again.chosen == START and again.cached_from and again.chosen_variant.throughput == 321.0
    assert cache.load("0" * 32) is None
    busy = ServedSearch("searched", start=START, chosen=START, variants=[chosen], measured_on={"cores": [1], "available": [0, 1], "others_busy": 1.0})
    cache.store("busy", busy)
    assert cache.load("busy") is None  # measured on the free cores of a busy machine: never stored
    (tmp_path / "cache" / "served_search" / f"{key}.json").write_text("{not json")
    assert cache.load(key) is None and "ignoring the served-search cache entry" in caplog.text


def test_validate_says_when_its_sweep_crosses_protocols_with_the_search(tmp_path: Path):
    """The search measures the bundled server over gRPC; a validate over HTTP compares across protocols and says so,
    one over gRPC does not."""
    from optimizer.triton.runtime.perf_analyzer import PerfRow
    from optimizer.triton.measure.validation.expectation import ExportReference
    from optimizer.triton.measure.validation.record import ValidationRecord
    from optimizer.triton.measure.validation.run import _compare_with_curve

    reference = ExportReference(tmp_path, tmp_path, tmp_path, [], "c", 100.0, 4, served_curve=[level(4, 400.0), level(16, 800.0)],
                                served_protocol="grpc")
    rows = [PerfRow(c, t, 1.0, 1.0, 1.0, 1.0) for c, t in ((2, 210.0), (4, 390.0))]
    notes = {}
    for protocol in ("http", "grpc"):
        record = ValidationRecord("m", "r", "s", "p", "b", perf={"settings": {"protocol": protocol}})
        _compare_with_curve(record, reference, rows)
        assert record.predictions and record.repeatability
        notes[protocol] = [n for n in record.notes if "measured over grpc and this sweep over http" in n]
    assert notes["http"] and not notes["grpc"]


def test_validate_says_how_a_padding_backends_loads_between_multiples_of_its_max_were_predicted(tmp_path: Path):
    """Full executions where the queue delay is shorter than one (6.6 ms here); full batches where it outlasts one."""
    from optimizer.triton.runtime.perf_analyzer import PerfRow
    from optimizer.triton.measure.validation.expectation import ExportReference
    from optimizer.triton.measure.validation.record import ValidationRecord
    from optimizer.triton.measure.validation.run import _compare_with_curve

    rows = [PerfRow(c, t, 1.0, 1.0, 1.0, 1.0) for c, t in ((6, 500.0), (8, 600.0))]
    said = {}
    for delay in (3000, 9000):
        reference = ExportReference(tmp_path, tmp_path, tmp_path, [], "c", 100.0, 4, served_curve=[_padding_server(c) for c in (4, 16)],
                                    served_point=OperatingPoint(4, (), delay, 1, 2), served_pads=True)
        record = ValidationRecord("m", "r", "s", "p", "b", perf={"settings": {"protocol": "grpc"}})
        _compare_with_curve(record, reference, rows)
        said[delay] = record.predicted_how
    assert "pays for full executions" in said[3000] and "batches fill between multiples of the max" not in said[3000]
    assert "batches fill between multiples of the max" in said[9000] and "pays for full executions" not in said[9000]


def test_a_fill_delay_near_one_measured_for_the_same_config_is_not_measured_again():
    """Each variant proposes a share of its own p50 as its fill delay (2700, 2800, 3000 us for one config here): within
    SAME_DELAY of a measured one it is that variant, measured already."""
    point = OperatingPoint(4, (), 0, 1, 2)
    slow = ServedVariant(point, "coarse", curve=[LoadLevel(4, 500.0, 11.2, 12.0, 12.5, 13.0, server_batch=1.0)])
    fill = fill_delay_us(slow, space(peak=4, largest_fit=8, rules_delay_us=130))
    assert fill == 8400  # concurrency 4 can fill max 4: three quarters of 11.2 ms
    assert replace(point, queue_delay_us=8400) in refinements(point, space(peak=4, largest_fit=8, rules_delay_us=130), {point}, fill)
    measured = {point, replace(point, queue_delay_us=9000)}
    assert all(p.queue_delay_us not in (8400, 9000) for p in refinements(point, space(peak=4, largest_fit=8, rules_delay_us=130), measured, fill))
    # another config's delay, or a delay clearly apart, is not the same variant
    assert replace(point, queue_delay_us=8400) in refinements(point, space(peak=4, largest_fit=8, rules_delay_us=130),
                                                              {point, replace(point, queue_delay_us=9000, instances=2), replace(point, queue_delay_us=5400)}, fill)


def test_a_padding_backend_is_never_refined_with_a_preferred_size_below_its_max():
    """openvino computes max_batch_size rows for every batch: a batch sent at preferred [4] under max 8 costs a batch of 8,
    so such a refinement does the work of a full batch for half of one."""
    best = OperatingPoint(8, (), 0, 1, 2)
    padded = refinements(best, space(peak=4, pads=True, concurrency=16), {best})
    assert padded and all(not p.preferred for p in padded)  # the rules' delay is still tried
    assert any(p.preferred == (4,) for p in refinements(best, space(peak=4, concurrency=16), {best}))  # a backend that does not pad




# -- same-shape batching and client padding ---------------------------------------------------------------------------


@pytest.mark.parametrize("gain,advised", [(1.5, True), (1.04, False)])
def test_padding_is_advised_only_when_the_padded_traffic_scores_clearly_better(monkeypatch, tmp_path: Path, gain, advised):
    """A traffic of mixed lengths: the two best variants are measured again with every request padded to the bucket edges;
    padding is advised (and the published variant is the one measured padded) only when that scores 10% better."""
    def served(point: OperatingPoint, c: int, padded: bool = False) -> LoadLevel:
        base = _two_instances_and_batch_16(point, c)
        return level(c, base.throughput * (gain if padded else 1.0))

    _, search, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path, concurrency=16), lengths=[1, 3, 5, 9, 17, 33, 60, 7, 2])
    padding = search.client_padding
    assert padding["answers_agree"] and padding["edges"] == [1, 2, 4, 8, 16, 32, 64] and padding["advised"] is advised, padding
    padded = [v for v in search.variants if v.stage == "padded"]
    assert len(padded) == 2 and all(v.traffic == "padded" and v.status == "measured" for v in padded)
    assert search.padded is advised and search.chosen_variant.traffic == ("padded" if advised else "")
    assert search.chosen in {v.point for v in padded} if advised else search.chosen_variant.stage != "padded"
    assert ("scores 1.50x" if advised else "under the 10% it must gain") in padding["why"]


def test_the_padding_trial_keeps_time_for_a_dear_variant():
    from optimizer.triton.measure.served_search.padding import padding_reserve

    clock = clock_module.BudgetClock(90.0, 90.0, now=lambda: 0.0)
    assert padding_reserve(clock, 90.0) == pytest.approx(18.0)  # a fifth, before anything was measured
    clock.record_cost(False, 30.0)
    assert padding_reserve(clock, 90.0) == pytest.approx(33.0)  # the dearest variant's time, with a margin
    clock.record_cost(False, 80.0)
    assert padding_reserve(clock, 90.0) == pytest.approx(36.0)  # never more than two fifths
    with clock.holding_back(lambda: 36.0):
        assert clock.fits(4) == 0 and clock.passed(60.0)  # 54 s left for the search: not one 80 s variant
    assert not clock.passed(60.0)


def test_the_other_kind_of_backend_enters_the_search_and_wins_on_served_measurements(monkeypatch, tmp_path: Path):
    """The in-process pick pads every execution to max_batch_size (openvino); a slower onnxruntime candidate computes only
    the rows that came. It enters the same server, and where it serves the load better it is what the search chooses, in
    the layout that serves it best (its own coarse pass)."""
    def served(point: OperatingPoint, c: int) -> LoadLevel:
        if point.candidate:  # onnxruntime: ahead at every load, and two single-thread instances serve it best
            return level(c, min(1100.0 * c, 1800.0 if point.instances == 2 else 1200.0))
        return _padded_to_max(point, c)

    _, search, _, _ = _run(monkeypatch, tmp_path, served, SearchRequest(tmp_path), decision_largest=8, pads=True, other_kind=True)
    assert "onnxruntime[cpu] (which computes only the rows that came) entered the search" in search.kinds
    assert search.candidate == "onnxruntime[cpu]" and search.chosen.candidate == "onnxruntime[cpu]"
    assert search.chosen.instances == 2, search.chosen  # found by the other kind's own coarse pass
    assert {v.point.candidate for v in search.variants} == {"", "onnxruntime[cpu]"}


def test_the_servers_cost_per_request_is_never_negative(tmp_path: Path):
    """The prediction splits the served time per request into in-process time and the server's own cost; two instances
    in parallel can serve faster than the one in-process runner (1 ms a request here), which is no negative cost (a lone
    request's prediction, in-process time plus this cost, would undercut the in-process time)."""
    from optimizer.triton.measure.served_search.search import _predict

    result = make_result(tmp_path, "onnxruntime_onnx")
    costs = {}
    for throughput in (500.0, 2000.0):
        search = ServedSearch("searched", concurrency=8, start=START, chosen=START, variants=[variant(START, throughput)])
        _predict(search, result)
        assert search.predicted_throughput == throughput and search.in_process_throughput == pytest.approx(1000.0)
        costs[throughput] = search.per_request_ms
    assert costs == {500.0: pytest.approx(1.0), 2000.0: 0.0}
