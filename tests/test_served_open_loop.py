"""Open-loop measurement: the capacity search on its rate grid, the arrival schedules, and the served search's open-loop
stage against a made-up server (the order, the scoring and the choice are the real ones)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest

from optimizer.errors import SettingsError
from optimizer.records.capacity import Capacity, RateLevel
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedVariant
from optimizer.settings import ExportSettings
from optimizer.triton.measure.capacity import find_capacity, refine, rung, rung_of
from optimizer.triton.measure.served_search import SearchRequest
from optimizer.triton.measure.served_search.open_loop import LOAD_S, OpenLoopStage, finalists, open_loop_reserve, run_cost_s
from optimizer.triton.measure.served_search.points import SearchSpace
from optimizer.triton.runtime.perf_analyzer_rate import arrival_gaps_us, mean_rate, parse_rate_csv, trace_gaps_us
from test_served_search import _Bench, _Rig, _run


def rate_level(offered: float, throughput: float, p95: float) -> RateLevel:
    return RateLevel(offered, throughput, p95 * 0.5, p95 * 0.9, p95, p95 * 1.3)


def server_holding(capacity: float, calls: list[float] | None = None):
    """A config that holds `capacity` requests/s at p95 5 ms; above it requests queue (p95 80 ms) and it serves 1.1x."""

    def measure(offered: float) -> RateLevel:
        if calls is not None:
            calls.append(offered)
        return rate_level(offered, min(offered, 1.1 * capacity), 5.0 if offered <= capacity else 80.0)

    return measure


# -- the capacity search -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [3.0, 47.0, 260.0, 1900.0])
@pytest.mark.parametrize("seed_share", [0.3, 1.0, 4.0])
def test_the_capacity_is_the_highest_rung_held_with_a_failed_rung_right_above(capacity, seed_share):
    calls: list[float] = []
    waits: list[float] = []
    cap = find_capacity(server_holding(capacity, calls), 20.0, 95, "poisson", capacity * seed_share, max_runs=8, run_cost_s=7.5, drain=waits.append)
    assert cap.rate_per_s is not None and cap.rate_per_s <= capacity < cap.rate_per_s * 2 ** 0.25 * 1.01
    assert cap.bounded and cap.runs == len(calls) <= 8
    assert all(lv.held == (lv.offered <= capacity) for lv in cap.curve)  # every run judged against the budget and the rate
    assert calls.count(rung(rung_of(cap.rate_per_s) + 1)) == 2  # the failure that bounds it, confirmed
    assert len(waits) == sum(c > capacity for c in calls) and all(0 < w <= 10 for w in waits)  # the queue drains after each failure


def test_a_stall_slower_than_a_higher_rate_is_measured_again_though_the_server_fell_behind():
    """A config that holds 1250/s: its first run at 1220/s meets a stall (served 80%, p95 51 ms) after 1450/s failed at
    28 ms keeping up. Falling far behind bounds a capacity at once, unless it was slower than a higher rate."""
    steady = server_holding(1250.0)
    calls: list[float] = []

    def measure(offered: float) -> RateLevel:
        calls.append(offered)
        if offered == rung(rung_of(1220)) and calls.count(offered) == 1:
            return rate_level(offered, 0.8 * offered, 51.0)
        if offered > 1250:
            return rate_level(offered, offered, 28.0)
        return steady(offered)

    cap = find_capacity(measure, 20.0, 95, "poisson", 1450.0, max_runs=8, drain=lambda s: None)
    assert cap.rate_per_s == rung(rung_of(1220)) and cap.bounded
    assert calls.count(rung(rung_of(1220))) == 3 and cap.runs == len(calls)  # fail, hold, hold: held


def test_the_failure_that_would_bound_the_capacity_counts_only_when_most_of_its_runs_fail():
    """At 1450/s the config is a coin near saturation: its runs there go fail, hold, hold; 1720/s fails every time."""
    outcomes = {rung(rung_of(1450)): [False, True, True]}
    calls: list[float] = []

    def measure(offered: float) -> RateLevel:
        calls.append(offered)
        left = outcomes.get(offered)
        held = left.pop(0) if left else offered < 1450
        return rate_level(offered, offered, 12.0 if held else 30.0)

    cap = find_capacity(measure, 20.0, 95, "poisson", 1220.0, max_runs=8, drain=lambda s: None)
    assert cap.rate_per_s == rung(rung_of(1450)) and cap.bounded  # held in two of its three runs
    assert calls.count(rung(rung_of(1450))) == 3 and calls.count(rung(rung_of(1720))) == 2
    assert [lv.held for lv in cap.curve] == [True, True, False]


def test_a_rate_the_server_fell_far_behind_on_bounds_the_capacity_without_another_run():
    calls: list[float] = []

    def measure(offered: float) -> RateLevel:
        calls.append(offered)
        return rate_level(offered, offered if offered < 1300 else 1300.0, 6.0 if offered < 1300 else 400.0)

    cap = find_capacity(measure, 20.0, 95, "poisson", 1220.0, drain=lambda s: None)
    assert cap.rate_per_s == rung(rung_of(1220)) and len(calls) == len(set(calls))


@pytest.mark.parametrize("holds", [304.0, 600.0, 1000.0])
def test_a_challenger_stops_once_it_fails_the_leaders_capacity(holds):
    """A challenger starts a rung above the leader's capacity (609/s); one that fails there and at 609/s (or that the
    server fell far behind on, above it) cannot win, so its search stops instead of stepping down to what it does hold.
    One that holds more is searched to its capacity."""
    calls: list[float] = []
    lead = rung(rung_of(609.0))
    cap = find_capacity(server_holding(holds, calls), 20.0, 95, "poisson", rung(rung_of(lead) + 1), drain=lambda s: None, floor=lead)
    if holds < lead:
        assert calls == [rung(rung_of(lead) + 1), lead][:1 if holds < 0.9 * lead else 2] and cap.rate_per_s is None
    else:
        assert cap.rate_per_s is not None and cap.rate_per_s <= holds < cap.rate_per_s * 2 ** 0.25 * 1.01
        assert min(calls) >= lead


def test_a_rate_many_times_over_the_budget_steps_down_two_rungs_until_one_is_held():
    """Bursts queued in a config that keeps up with the rate: p95 300 ms against a 20 ms budget, one rung lower will not be
    within it. The search steps two rungs at a time until a rate is held, then brackets the rung it skipped."""
    calls: list[float] = []

    def measure(offered: float) -> RateLevel:
        calls.append(offered)
        return rate_level(offered, offered, 6.0 if offered <= 100 else (30.0 if offered <= 130 else 300.0))

    cap = find_capacity(measure, 20.0, 95, "poisson", 215.0, max_runs=8, drain=lambda s: None)
    k = rung_of(215.0)
    assert calls[:3] == [rung(k), rung(k - 2), rung(k - 4)]  # 215 and 152 many times over: two rungs down each
    assert cap.rate_per_s == rung(rung_of(100.0, down=True)) and cap.bounded
    assert len(calls) == len(set(calls)) + 1  # only the failure right above the capacity is measured again


def test_a_screening_run_at_the_seed_is_the_searchs_first_and_one_elsewhere_joins_its_curve():
    calls: list[float] = []
    measure = server_holding(600.0, calls)
    first = measure(rung(rung_of(431.0)))
    cap = find_capacity(measure, 20.0, 95, "poisson", 431.0, drain=lambda s: None, prior=first)
    assert rung(rung_of(431.0)) not in calls[1:] and cap.runs == len(calls) and cap.rate_per_s == rung(rung_of(600.0, down=True))
    calls.clear()
    below = measure(rung(rung_of(362.0)))
    cap = find_capacity(measure, 20.0, 95, "poisson", 724.0, drain=lambda s: None, prior=below, floor=609.0)
    assert calls[1:] == [724.0, 609.0] and cap.rate_per_s == 362.0 and cap.runs == 3  # what it held below the floor stands


@pytest.mark.parametrize("capacity", [47.0, 1300.0, 1400.0, 1900.0])
def test_the_claim_is_refined_to_the_half_rung_so_it_lies_within_9_percent_of_what_the_config_holds(capacity):
    """The grid brackets a capacity within 19%; the half rung between the highest rate held and the failure above it,
    measured by the same rules, brings the claim within 9% (from below: a claim is never above what was held)."""
    calls: list[float] = []
    measure = server_holding(capacity, calls)
    coarse = find_capacity(measure, 20.0, 95, "poisson", capacity, max_runs=8, drain=lambda s: None)
    searched = len(calls)
    fine = refine(measure, coarse, drain=lambda s: None)
    half = rung(rung_of(coarse.rate_per_s) + 0.5)
    assert calls[searched:] == [half] * (1 if half <= capacity else 2)  # held at once; a failure confirmed
    assert fine.rate_per_s <= capacity < fine.rate_per_s * 2 ** 0.125 * 1.01
    assert fine.rate_per_s == (half if half <= capacity else coarse.rate_per_s) and fine.bounded
    assert fine.runs == len(calls) and [lv.offered for lv in fine.curve] == sorted(lv.offered for lv in fine.curve)
    assert refine(measure, fine, drain=lambda s: None) is fine  # a refined claim is not refined again


def test_a_half_rung_that_fails_once_near_the_edge_is_taken_by_the_majority_of_its_runs():
    """The half rung 1330/s goes fail, hold, hold (a coin near saturation): the claim is 1330/s on three runs there."""
    outcomes = [False, True, True]

    def measure(offered: float) -> RateLevel:
        held = outcomes.pop(0)
        return rate_level(offered, offered, 12.0 if held else 30.0)

    coarse = Capacity(1220.0, 20.0, 95, "poisson", 4, [rate_level(1220.0, 1220.0, 12.0).judge(20.0, 95),
                                                      rate_level(1450.0, 1450.0, 30.0).judge(20.0, 95)])
    fine = refine(measure, coarse, drain=lambda s: None)
    assert fine.rate_per_s == 1330.0 and fine.runs == 7 and not outcomes
    assert [lv.offered for lv in fine.curve] == [1220.0, 1330.0, 1450.0] and fine.curve[1].held


def test_an_unbounded_capacity_or_none_at_all_is_not_refined():
    unbounded = Capacity(1220.0, 20.0, 95, "poisson", 3, [rate_level(1220.0, 1220.0, 12.0)], bounded=False)
    none_held = Capacity(None, 20.0, 95, "poisson", 2, [rate_level(3.0, 1.0, 90.0)])

    def measure(offered: float) -> RateLevel:
        raise AssertionError("nothing to refine, nothing to measure")

    assert refine(measure, unbounded) is unbounded and refine(measure, none_held) is none_held


def test_equal_capacities_go_to_the_lower_latency_at_the_rate_perf_analyzer_offered():
    """perf_analyzer reports 1220.003/s offered for the rung 1220/s: the tie-break still finds each config's run there."""
    from optimizer.triton.measure.served_search.open_loop import _beats

    def cap(p95: float) -> Capacity:
        return Capacity(1220.0, 20.0, 95, "poisson", 2, [rate_level(1220.003, 1219.0, p95), rate_level(1450.001, 1449.0, 40.0)])

    assert cap(12.0).held_level.offered == 1220.003
    assert _beats(cap(12.0), cap(18.0), 95) and not _beats(cap(18.0), cap(12.0), 95)


def test_a_rate_the_server_falls_behind_on_is_not_held_even_within_the_budget():
    level = rate_level(200.0, 180.0, 4.0).judge(20.0, 95)
    assert not level.held and "180.0/s of 200/s" in level.why
    assert rate_level(200.0, 197.0, 4.0).judge(20.0, 95).held


def test_rates_lie_on_one_grid_so_two_configs_compare_rung_for_rung():
    assert [rung(k) for k in (0, 4, 8)] == [1.0, 2.0, 4.0]
    assert all(rung(rung_of(r)) == pytest.approx(r, rel=0.1) for r in (3.3, 47.0, 260.0, 1234.0))
    assert rung(rung_of(rung(29))) == rung(29)


def test_replicas_are_the_rate_over_the_capacity_less_its_headroom():
    cap = Capacity(256.0, 20.0, 95, "poisson", 3, target_rate=1000.0, headroom=0.2)
    assert cap.replicas == math.ceil(1000 / (256 * 0.8)) == 5
    assert Capacity(256.0, 20.0, 95, "poisson", 3, target_rate=204.8, headroom=0.2).replicas == 1
    assert Capacity(None, 20.0, 95, "poisson", 3, target_rate=100.0).replicas is None
    assert "open-loop, Poisson arrivals, p95 <= 20 ms" in cap.describe()


# -- the schedules -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.7, 13.0, 250.0])
def test_poisson_arrivals_offer_exactly_the_rate_each_second_with_poisson_bursts(rate):
    gaps = arrival_gaps_us(rate, "poisson", seconds=60)
    assert mean_rate(gaps) == pytest.approx(rate, rel=0.02)
    stamps = np.cumsum(gaps) / 1e6
    # any three 2 s windows offer the rate, far closer than independent Poisson counts would (a run measures what it names)
    counts = np.array([np.count_nonzero((stamps >= t) & (stamps < t + 6.0)) for t in np.arange(0.0, 50.0, 0.37)])
    assert np.abs(counts - 6 * rate).max() <= rate + 1 and counts.std() < 0.5 * math.sqrt(6 * rate)
    if rate > 100:
        cv = np.std(gaps) / np.mean(gaps)
        assert 0.85 < cv < 1.15  # the gaps vary as exponential ones do (1 for Poisson, 0 evenly spaced)
    assert set(arrival_gaps_us(rate, "constant")) == {round(1e6 / rate)}


def test_a_trace_keeps_its_bursts_when_scaled_to_a_rate():
    stamps = [0, 1, 2, 3, 100, 101, 102, 103, 200]  # bursts of four, 100 ms apart
    gaps = trace_gaps_us(stamps, rate=80.0)
    assert mean_rate(gaps) == pytest.approx(80.0, rel=1e-3)
    assert gaps[0] == gaps[1] and gaps[3] > 50 * gaps[0]  # the shape of the schedule stays


def test_a_request_rate_csv_is_read_by_its_own_header():
    text = ("Request Rate,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,"
            "Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n199,197.423,5,227,1036,16,3305,164,1,4289,6575,6838,8468\n")
    level = parse_rate_csv(text, 200.0)
    assert level.offered == 200.0 and level.throughput == pytest.approx(197.423) and level.p95_ms == pytest.approx(6.838)


# -- the settings ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, words", [
    ({"rate": "0"}, "--rate '0' is not a positive number"),
    ({"rate": "-5"}, "--rate '-5' is not a positive number"),
    ({"rate": "fast"}, "--rate 'fast' is not a positive number"),
    ({"rate": "max"}, "--rate max asks for the highest rate held within a latency target; add --latency-budget-ms"),
    ({"rate": "100", "concurrency": "8"}, "both give the load"),
    ({"rate": "100", "headroom": 1.0}, "--headroom 1 must be from 0 to below 1"),
])
def test_a_rate_that_cannot_be_measured_is_one_line_naming_the_fix(values, words):
    with pytest.raises(SettingsError, match=words.replace("(", r"\(")):
        ExportSettings(**values).check_serving()


# -- the served search's open-loop stage against a made-up server ------------------------------------------------------


def _closed(point: OperatingPoint, c: int) -> LoadLevel:
    """Closed-loop, a config without batching (max 1, no delay) is fastest and quickest; batching ones trail it."""
    batching = point.max_batch_size > 1 and point.queue_delay_us > 0
    rate = 600.0 if point.max_batch_size == 1 else (560.0 if batching else 300.0)
    rate = min(rate, 250.0 * c)
    lat = 1000.0 * c / rate
    return LoadLevel(c, rate, lat * 0.6, lat * 0.9, lat, lat * 1.2)


def _open_capacity(point: OperatingPoint) -> float:
    """Open-loop, the batching configs absorb the bursts: they hold more."""
    if point.max_batch_size == 1:
        return 300.0
    return 400.0 if point.queue_delay_us > 0 else 150.0


@dataclass(frozen=True)
class _RateBench(_Bench):
    rates: Any = None  # list of (point, offered) measured

    def measure_rate(self, model, offered):
        point = self.loader.points[model]
        self.rates.append((point, offered))
        return server_holding(_open_capacity(point))(offered)

    def drain(self, seconds):
        assert 0 < seconds <= 10  # a made-up server has no queue to wait for


class _RateRig(_Rig):
    def bench(self, where, input_data, rows, request, trace_ms=None):
        return _RateBench(where.url, input_data, rows, request.workdir, loader=self.loader_, rates=self.rates, **self.bench_kw)


def _search(monkeypatch, tmp_path, request: SearchRequest):
    rates: list = []
    monkeypatch.setattr(_RateRig, "rates", rates, raising=False)
    monkeypatch.setattr("test_served_search._Rig", _RateRig)
    run, search, loader, stopped = _run(monkeypatch, tmp_path, _closed, request)
    return search, rates


def test_the_finalists_take_the_other_instance_layout_before_another_batching_of_the_same_one():
    """Closed-loop, four clients may rank one instance with two threads first throughout; open-loop, two single-thread
    instances serve bursts side by side. The best of the other layout is measured before a second batching of the first."""

    def variant(max_batch: int, delay: int, instances: int) -> ServedVariant:
        return ServedVariant(OperatingPoint(max_batch, (), delay, instances, 2 // instances), "coarse")

    ranked = [variant(1, 0, 1), variant(2, 0, 1), variant(4, 1000, 1), variant(16, 0, 1), variant(1, 0, 2), variant(4, 0, 2)]
    picked = finalists(ranked)
    assert [(v.point.max_batch_size, v.point.instances) for v in picked] == [(1, 1), (1, 2), (2, 1)]
    assert finalists(ranked[:4]) == ranked[:3]  # one layout only: the best batching differently, then the runner-up
    assert finalists([]) == []


class _OneLayoutPass:
    """A closed-loop pass that measured these variants; what the stage asks it to measure closed-loop is kept."""

    def __init__(self, ranked: list[ServedVariant]) -> None:
        self._ranked, self.spaces, self.asked = ranked, {}, []
        self.search = SimpleNamespace(variants=ranked)

    def ranked(self) -> list[ServedVariant]:
        return self._ranked

    def measure(self, points: list[OperatingPoint], stage: str) -> list[ServedVariant]:
        self.asked += points
        return []


@pytest.mark.parametrize("cores, layout, asked", [
    (2, None, [OperatingPoint(4, (), 1000, 2, 1)]),  # the best's batcher, two single-thread instances
    (8, None, [OperatingPoint(4, (), 1000, 8, 1)]),  # the layout farthest from one 8-thread instance
    (2, (1, 2), []),  # beside other processes' load one layout is searched (HELD_LAYOUT): nothing more
])
def test_the_best_batcher_is_measured_in_the_farthest_layout_before_the_finalists(cores, layout, asked):
    """--rate R without a budget: a pass may have measured one layout only, or the other layout with a smaller batcher
    only (max 1 in both, max 4 in one); the best's own batcher in the farthest layout is measured closed-loop, unless it
    was."""
    ranked = [ServedVariant(OperatingPoint(4, (), 1000, 1, cores), "start"), ServedVariant(OperatingPoint(1, (), 0, 1, cores), "coarse")]
    space = SearchSpace(peak=4, largest_fit=64, fixed_max=None, cores=cores, gpu=False, layout=layout)
    for measured in ([], [ServedVariant(OperatingPoint(1, (), 0, cores, 1), "coarse")]):  # no other layout; another batcher in it
        run = _OneLayoutPass([*ranked, *measured])
        OpenLoopStage(run, SimpleNamespace(percentile=95, latency_budget_ms=20.0), None, space)._other_layout()
        assert run.asked == asked
    if asked:
        measured_twin = _OneLayoutPass([*ranked, ServedVariant(asked[0], "coarse")])
        OpenLoopStage(measured_twin, SimpleNamespace(percentile=95, latency_budget_ms=20.0), None, space)._other_layout()
        assert measured_twin.asked == []  # measured already: nothing more


def test_with_a_rate_and_a_budget_the_config_that_holds_the_most_open_loop_is_published(monkeypatch, tmp_path: Path):
    search, rates = _search(monkeypatch, tmp_path, SearchRequest(tmp_path, latency_budget_ms=20.0, rate_max=True))
    assert search.objective == "rate" and "open-loop" in search.load
    assert search.chosen.max_batch_size > 1 and search.chosen.queue_delay_us > 0  # not the closed-loop best (max 1)
    cap = search.capacity
    assert cap["rate_per_s"] <= 400.0 < cap["rate_per_s"] * 2 ** 0.125 * 1.01  # the claim refined to the half rung: within 9%
    assert cap["latency_budget_ms"] == 20.0 and cap["arrivals"] == "poisson"
    assert len(search.open_loop) >= 2 and any(OperatingPoint.from_json(f["point"]).max_batch_size == 1 for f in search.open_loop)
    off_grid = [(p, offered) for p, offered in rates if offered != rung(rung_of(offered))]
    assert off_grid and {p for p, _ in off_grid} == {search.chosen}  # finalists compare on one grid; only the claim is refined
    assert all(offered == rung(rung_of(offered, down=True) + 0.5) for _, offered in off_grid)


def test_every_finalist_is_screened_at_one_rate_and_the_best_screened_is_searched_first(monkeypatch, tmp_path: Path):
    """The closed-loop best (max 1) keeps up open-loop but queues: p95 300 ms at every rate over 40/s, where the batching
    config is at 80 ms and holds 400/s. Searching the closed-loop best first spent five runs finding nothing; one run each
    at one rate ranks them, so the search goes to the batching config and the others cost a run or two."""

    def measure_rate(self, model, offered):
        point = self.loader.points[model]
        self.rates.append((point, offered))
        if point.max_batch_size == 1:
            return rate_level(offered, offered, 6.0 if offered <= 40 else 300.0)
        return server_holding(_open_capacity(point))(offered)

    monkeypatch.setattr(_RateBench, "measure_rate", measure_rate)
    search, rates = _search(monkeypatch, tmp_path, SearchRequest(tmp_path, latency_budget_ms=20.0, rate_max=True))
    assert search.chosen.max_batch_size > 1 and search.chosen.queue_delay_us > 0
    assert search.capacity["rate_per_s"] <= 400.0 < search.capacity["rate_per_s"] * 2 ** 0.125 * 1.01
    finalists_measured = list(dict.fromkeys(p for p, _ in rates))
    assert len(finalists_measured) >= 2 and len({next(r for p, r in rates if p == f) for f in finalists_measured}) == 1  # one screening rate
    assert sum(p.max_batch_size == 1 for p, _ in rates) <= 2  # its screen, and one run a rung above the leader's capacity
    assert {f["label"] for f in search.open_loop} == {f.label for f in finalists_measured}  # each finalist in the report


def test_the_other_batching_is_screened_in_the_layout_that_screened_better(monkeypatch, tmp_path: Path):
    """Two single-thread instances hold twice what one 2-thread instance does open-loop, whatever the batcher; the batching
    config holds the most. Closed-loop ranks max 1 in one instance first: the finalists are max 1 in both layouts, then
    the batching config in the layout that screened better (two instances), which the pass ranked below others."""

    def measure_rate(self, model, offered):
        point = self.loader.points[model]
        self.rates.append((point, offered))
        return server_holding(_open_capacity(point) * (2.0 if point.instances == 2 else 1.0))(offered)

    monkeypatch.setattr(_RateBench, "measure_rate", measure_rate)
    search, rates = _search(monkeypatch, tmp_path, SearchRequest(tmp_path, latency_budget_ms=20.0, rate_max=True))
    screened = list(dict.fromkeys(p for p, _ in rates))
    assert [(p.max_batch_size, p.instances) for p in screened[:2]] == [(1, 1), (1, 2)]  # the best's batcher in both layouts
    assert screened[2].max_batch_size > 1 and screened[2].queue_delay_us > 0 and screened[2].instances == 2
    assert search.chosen == screened[2] and search.capacity["rate_per_s"] <= 800.0 < search.capacity["rate_per_s"] * 2 ** 0.125 * 1.01


class _StartOnlyRun:
    """A served search whose closed-loop pass measured only its start (a batching config in one 2-thread instance): what
    the stage measures closed-loop joins the ranking; open-loop, `holds(point)` is each config's capacity."""

    def __init__(self, start: OperatingPoint, holds: Callable[[OperatingPoint], float], server_batch: float | None = None) -> None:
        self.variants = [self._measured(start, "start")]
        self.variants[0].server_batch = server_batch
        self.search, self.spaces, self.label, self.rates = SimpleNamespace(variants=self.variants), {}, "m", []
        self.clock = SimpleNamespace(passed=lambda seconds=0.0: False, variant_cost=lambda: 10.0)
        self.on_event = lambda event: None
        self.bench = SimpleNamespace(trace_ms=None, drain=lambda s: None, watch=self._watch, measure_rate=self._rate)
        self.measurer, self.holds = SimpleNamespace(loaded=self._loaded), holds

    @staticmethod
    def _measured(point: OperatingPoint, stage: str) -> ServedVariant:
        return ServedVariant(point, stage, status="measured", curve=[LoadLevel(4, 1000.0, 2.0, 3.0, 4.0, 5.0)], throughput=1000.0)

    def ranked(self) -> list[ServedVariant]:
        return [v for v in self.variants if v.status == "measured"]

    def measure(self, points: list[OperatingPoint], stage: str) -> list[ServedVariant]:
        self.variants += [self._measured(p, stage) for p in points]
        return self.variants[-len(points):]

    @contextmanager
    def _loaded(self, point: OperatingPoint):
        yield point

    @contextmanager
    def _watch(self):
        yield SimpleNamespace(peak_within=lambda seconds: 0.0)

    def _rate(self, point: OperatingPoint, offered: float) -> RateLevel:
        self.rates.append((point, offered))
        return server_holding(self.holds(point))(offered)


def test_a_pass_that_measured_no_other_batching_gets_no_batching_in_the_layout_that_screened_better():
    """The bundled transformer's pass measured only its start (max 64, 1x2t): the finalists are max 64 in both layouts and
    max 1 (no batching) in the layout that screened better, measured closed-loop first."""
    start = OperatingPoint(64, (64,), 41, 1, 2)
    run = _StartOnlyRun(start, lambda p: (400.0 if p.instances == 1 else 1000.0) * (1.3 if p.max_batch_size == 1 else 1.0))
    stage = OpenLoopStage(run, SimpleNamespace(percentile=95, latency_budget_ms=20.0, rate_objective=True, arrivals="poisson"), None,
                          SearchSpace(peak=4, largest_fit=64, fixed_max=None, cores=2, gpu=False))
    chosen, cap = stage._highest_capacity()
    assert [v.point for v in run.variants[1:]] == [replace(start, instances=2, threads=1), OperatingPoint(1, (), 0, 2, 1)]
    assert chosen.point == OperatingPoint(1, (), 0, 2, 1) and cap.rate_per_s <= 1300.0 < cap.rate_per_s * 2 ** 0.25 * 1.01


@pytest.mark.parametrize("start, server_batch, fixed_max, third", [
    (OperatingPoint(2, (2,), 51, 1, 2), 2.0, None, OperatingPoint(4, (), 51, 2, 1)),  # eight clients filled max 2: max 4
    (OperatingPoint(2, (2,), 51, 1, 2), 1.3, None, OperatingPoint(1, (), 0, 2, 1)),  # they did not: no batching
    (OperatingPoint(2, (2,), 51, 1, 2), 2.0, 2, OperatingPoint(1, (), 0, 2, 1)),  # the user fixed the max: never changed
    (OperatingPoint(1, (), 0, 1, 2), 1.0, None, OperatingPoint(4, (), 0, 2, 1)),  # max 1 alone: max 4 (BURST_QUEUE)
])
def test_a_batcher_the_clients_filled_is_screened_larger_in_the_layout_that_screened_better(start, server_batch, fixed_max, third):
    """The bundled CNN's pass measured max 2 (preferred 2, 51 us) in one 2-thread instance, its batches full at eight
    clients, or max 1 only, in both layouts, when the other kind's candidates took its time; open-loop max 4 in two
    single-thread instances held the most, and the pass never measured it. A batcher the clients filled grows for the
    third finalist (twice its max, at least 4), measured closed-loop first; one they did not fill does not."""
    run = _StartOnlyRun(start, lambda p: (500.0 if p.instances == 1 else 1000.0) * (1.3 if p.max_batch_size == 4 else 1.0),
                        server_batch=server_batch)
    stage = OpenLoopStage(run, SimpleNamespace(percentile=95, latency_budget_ms=20.0, rate_objective=True, arrivals="poisson"), None,
                          SearchSpace(peak=2, largest_fit=64, fixed_max=fixed_max, cores=2, gpu=False))
    chosen, cap = stage._highest_capacity()
    assert [v.point for v in run.variants[1:]] == [replace(start, instances=2, threads=1), third]
    assert chosen.point == (third if third.max_batch_size == 4 else replace(start, instances=2, threads=1))
    assert cap.rate_per_s <= run.holds(chosen.point) < cap.rate_per_s * 2 ** 0.25 * 1.01


class _TimedRun(_StartOnlyRun):
    """A _StartOnlyRun whose stage starts with `left` seconds: each open-loop run, load and closed-loop variant spends
    what the reserve plans for it."""

    def __init__(self, start: OperatingPoint, rate: Callable[[OperatingPoint, float], RateLevel], left: float) -> None:
        super().__init__(start, lambda p: 0.0, server_batch=float(start.max_batch_size))
        self.left, self.level_at = left, rate
        self.clock = SimpleNamespace(passed=lambda seconds=0.0: seconds > self.left, variant_cost=lambda: 10.0)

    def measure(self, points: list[OperatingPoint], stage: str) -> list[ServedVariant]:
        self.left -= 10.0 * len(points)
        return super().measure(points, stage)

    @contextmanager
    def _loaded(self, point: OperatingPoint):
        self.left -= LOAD_S
        yield point

    def _rate(self, point: OperatingPoint, offered: float) -> RateLevel:
        self.left -= run_cost_s()
        self.rates.append((point, offered))
        return self.level_at(point, offered)


def test_within_the_reserve_every_finalist_that_held_its_screen_gets_a_run_above_the_leaders_capacity():
    """The bundled CNN at 46cb4d3: max 4, the larger batcher, held its screen but more slowly than max 2 in either layout
    (larger batches cost at a low rate) and holds the most; the reserve paid for one challenger's run, max 2 in the other
    layout took it, and max 4 was never driven above the screening rate. With the time the reserve plans, each
    challenger that held its screen gets its run a rung above the leader's capacity, and max 4 is published."""
    start = OperatingPoint(2, (2,), 51, 1, 2)
    seed = rung(rung_of(OpenLoopStage(_StartOnlyRun(start, lambda p: 0.0), SimpleNamespace(percentile=95, latency_budget_ms=20.0),
                                      None, None).closed_seed(_StartOnlyRun._measured(start, "start"), 20.0)))
    holds = {(2, 2): 1.2 * seed, (2, 1): 1.1 * seed, (4, 2): 1.6 * seed}  # (max, instances) -> capacity
    screen_ms = {(2, 2): 5.0, (2, 1): 10.0, (4, 2): 15.0}

    def level_at(point: OperatingPoint, offered: float) -> RateLevel:
        key = (point.max_batch_size, point.instances)
        return rate_level(offered, min(offered, 1.1 * holds[key]), screen_ms[key] if offered <= holds[key] else 80.0)

    run = _TimedRun(start, level_at, open_loop_reserve(True, 10.0))
    stage = OpenLoopStage(run, SimpleNamespace(percentile=95, latency_budget_ms=20.0, rate_objective=True, arrivals="poisson"), None,
                          SearchSpace(peak=2, largest_fit=64, fixed_max=None, cores=2, gpu=False))
    chosen, cap = stage._highest_capacity()
    assert chosen.point == OperatingPoint(4, (), 51, 2, 1) and cap.rate_per_s > 1.2 * seed
    for challenger in (OperatingPoint(2, (2,), 51, 1, 2), OperatingPoint(4, (), 51, 2, 1)):  # its screen, then a rung above the leader's
        assert [offered for p, offered in run.rates if p == challenger][:2] == [seed, rung(rung_of(seed) + 2)]


def test_a_rate_becomes_replicas_in_the_record(monkeypatch, tmp_path: Path):
    search, _ = _search(monkeypatch, tmp_path, SearchRequest(tmp_path, latency_budget_ms=20.0, rate=1000.0, headroom=0.2))
    cap = search.capacity
    assert cap["target_rate"] == 1000.0 and cap["replicas"] == math.ceil(1000.0 / (cap["rate_per_s"] * 0.8))


def test_a_budget_alone_keeps_the_closed_loop_choice_and_states_its_capacity(monkeypatch, tmp_path: Path):
    search, rates = _search(monkeypatch, tmp_path, SearchRequest(tmp_path, latency_budget_ms=20.0))
    assert search.objective == "latency" and search.chosen.max_batch_size == 1
    assert search.capacity["rate_per_s"] <= 300.0 < search.capacity["rate_per_s"] * 2 ** 0.125 * 1.01
    assert {p for p, _ in rates} == {search.chosen}


def test_with_no_rate_or_budget_nothing_is_measured_open_loop(monkeypatch, tmp_path: Path):
    search, rates = _search(monkeypatch, tmp_path, SearchRequest(tmp_path))
    assert rates == [] and search.capacity is None and search.open_loop == []


# -- a real export, open-loop, through the onnxruntime stand-in --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.long  # over a minute (a search with open-loop runs of several seconds each); CI covers its parts: the stage
# against a made-up server (above), perf_analyzer's open-loop runs (validate --rate in test_validate_open_loop.py)
def test_an_export_with_a_rate_publishes_a_measured_capacity_and_the_replicas_it_needs(in_tmp: Path):
    import json

    from tests.conftest import run_cli

    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled", "--rate", "2000",
                "--latency-budget-ms", "40", "--serve-search-seconds", "80", cwd=in_tmp, serve_search=True)
    assert r.returncode == 0, r.stderr
    report = json.loads((in_tmp / "aitune-reports" / "mlp" / "report.json").read_text())
    cap = report["capacity"]
    assert cap["rate_per_s"] and cap["arrivals"] == "poisson" and cap["latency_budget_ms"] == 40 and cap["runs"] >= 2
    held = [lv for lv in cap["curve"] if abs(lv["offered"] - cap["rate_per_s"]) <= 0.01 * cap["rate_per_s"]]  # 1220.003 offered for 1220
    assert held and held[0]["held"] and held[0]["p95_ms"] <= 40 and held[0]["throughput"] >= 0.97 * cap["rate_per_s"]
    assert cap["replicas"] == math.ceil(2000 / (cap["rate_per_s"] * 0.8))
    assert report["published"]["served_search"]["objective"] == "rate"
    assert "capacity of" in r.stdout and "open-loop" in r.stdout
    md = (in_tmp / "aitune-reports" / "mlp" / "report.md").read_text()
    assert "## Capacity (open-loop)" in md and "(closed-loop)" in md and (in_tmp / "aitune-reports" / "mlp" / "capacity.png").is_file()
    manifest = (in_tmp / "aitune-reports" / "mlp" / "kserve" / "inferenceservice.yaml").read_text()
    assert f"minReplicas: {cap['replicas']}" in manifest and 'scaleMetric: "rps"' in manifest


def test_a_rate_without_a_budget_publishes_a_finalist_that_keeps_up_with_it(monkeypatch, tmp_path: Path):
    search, rates = _search(monkeypatch, tmp_path, SearchRequest(tmp_path, rate=350.0))
    assert search.objective == "rate" and "lowest p95 latency at 350" in search.load
    assert search.chosen.max_batch_size > 1 and search.chosen.queue_delay_us > 0  # the only finalist that keeps up with 350/s
    assert any(offered == 350.0 for _, offered in rates) and search.capacity["target_rate"] == 350.0


def test_the_report_states_the_capacity_the_replicas_and_that_its_figures_are_open_loop(tmp_path: Path):
    from optimizer.report.capacity_section import capacity_section
    from optimizer.report.plots import write_capacity_plot

    curve = [rate_level(256.0, 255.0, 6.0).judge(20.0, 95), rate_level(304.0, 280.0, 60.0).judge(20.0, 95)]
    cap = Capacity(256.0, 20.0, 95, "poisson", 2, curve, window_ms=2000, windows=3, target_rate=1000.0, headroom=0.2, point="max 4").to_json()
    text = capacity_section(cap, [], "capacity.png")
    assert text.startswith("## Capacity (open-loop)") and "256 requests/s held (open-loop, Poisson arrivals, p95 <= 20 ms" in text
    assert "Replicas for 1000 requests/s: 5" in text and "| 304 | 280.0 |" in text and "no: served 280.0/s of 304/s" in text
    assert write_capacity_plot(cap, tmp_path).is_file() and capacity_section(None) == ""
