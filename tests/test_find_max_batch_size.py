"""The max-batch search stops for each reason and explains itself (fake measurements, no timing)."""

from __future__ import annotations

import pytest

from optimizer.records.measurements import BatchPolicy, BatchProfile, MaxBatchDecision
from optimizer.task.find_max_batch_size import OutOfMemory, TimeBudgetExceeded, estimate_ceiling, every_load_max, find_max_batch_size, knee_of


def profile(batch: int, throughput: float, p95_ms: float | None = None, rss: float = 0.0) -> BatchProfile:
    latency = batch * 1000.0 / throughput
    return BatchProfile(batch, latency, latency, p95_ms or latency, latency, latency, throughput, 10, 3, True, 0.01, 0.0, rss)


class FakeModel:
    """throughput(batch) and the batch sizes that run out of memory; records what was measured."""

    def __init__(self, throughput, oom_above: int | None = None, p95=None):
        self.throughput, self.oom_above, self.p95 = throughput, oom_above, p95
        self.measured: list[int] = []

    def __call__(self, batch: int) -> BatchProfile:
        self.measured.append(batch)
        if self.oom_above is not None and batch > self.oom_above:
            raise OutOfMemory(f"batch {batch}: cannot allocate")
        return profile(batch, self.throughput(batch), self.p95(batch) if self.p95 else None)


def test_saturation_stops_two_steps_after_the_knee():
    fake = FakeModel(lambda b: {1: 100, 2: 190, 4: 195, 8: 203, 16: 204}[b])
    d = find_max_batch_size(fake, BatchPolicy())
    assert fake.measured == [1, 2, 4, 8]
    assert d.decided_by == "saturation" and d.max_batch_size == 8
    assert d.knee == 4 and d.best_batch == 8
    assert "throughput stopped growing" in d.explanation


def test_growth_resumes_when_throughput_climbs_again():
    fake = FakeModel(lambda b: {1: 100, 2: 102, 4: 130, 8: 131, 16: 132, 32: 133}[b])
    d = find_max_batch_size(fake, BatchPolicy())
    assert fake.measured == [1, 2, 4, 8, 16] and d.largest_fit == 16
    assert d.max_batch_size == d.peak == 4 and d.decided_by == "peak" and d.search_stop == "saturation"


def test_allocation_failure_is_refined_by_bisection():
    fake = FakeModel(lambda b: 100.0 * b, oom_above=45)
    d = find_max_batch_size(fake, BatchPolicy(search_cap=1024))
    assert d.decided_by == "memory"
    assert d.max_batch_size == 45 and d.ceiling == 45 and d.first_failure == 46
    assert fake.measured[:7] == [1, 2, 4, 8, 16, 32, 64]
    assert "allocation failed" in d.explanation and "46" in d.explanation


def test_latency_budget_is_refined_and_over_budget_sizes_are_kept_apart():
    fake = FakeModel(lambda b: 100.0 * b, p95=lambda b: 1.0 * b)
    d = find_max_batch_size(fake, BatchPolicy(latency_budget_ms=20.0, search_cap=512))
    assert d.decided_by == "latency_budget" and d.max_batch_size == 20
    assert all(p.p95_ms <= 20 for p in d.profiles)
    assert d.over_budget and all(p.p95_ms > 20 for p in d.over_budget)


def test_user_cap_is_measured_even_off_the_power_of_two_ladder():
    fake = FakeModel(lambda b: 100.0 * b)
    d = find_max_batch_size(fake, BatchPolicy(max_batch_size=12))
    assert fake.measured == [1, 2, 4, 8, 12] and d.decided_by == "user_cap" and d.max_batch_size == 12


def test_a_requested_size_is_verified_past_saturation():
    fake = FakeModel(lambda b: 100.0)
    d = find_max_batch_size(fake, BatchPolicy(max_batch_size=16))
    assert fake.measured == [1, 2, 4, 8, 16] and d.decided_by == "user_cap" and d.max_batch_size == 16


def test_search_cap_when_throughput_keeps_growing():
    fake = FakeModel(lambda b: 100.0 * b)
    d = find_max_batch_size(fake, BatchPolicy(search_cap=64))
    assert d.decided_by == "search_cap" and d.max_batch_size == 64


def test_time_budget_keeps_what_was_measured():
    def measure(b):
        if b > 4:
            raise TimeBudgetExceeded("the time budget ran out")
        return profile(b, 100.0 * b)

    d = find_max_batch_size(measure, BatchPolicy())
    assert d.decided_by == "time_budget" and d.max_batch_size == 4


def test_recorded_batch_sizes_only_for_jit():
    fake = FakeModel(lambda b: 100.0 * b)
    d = find_max_batch_size(fake, BatchPolicy(batch_sizes=(3, 1, 7)))
    assert fake.measured == [1, 3, 7] and d.decided_by == "recorded" and d.max_batch_size == 7


def test_batch_one_out_of_memory_leaves_no_deployable_size():
    fake = FakeModel(lambda b: 100.0, oom_above=0)
    d = find_max_batch_size(fake, BatchPolicy())
    assert d.profiles == [] and d.max_batch_size == 0 and d.decided_by == "memory"


def test_non_batching_models_measure_once():
    fake = FakeModel(lambda b: 50.0)
    d = find_max_batch_size(fake, BatchPolicy(), batching=False)
    assert fake.measured == [1] and d.max_batch_size == 0 and d.decided_by == "no_batching"


def test_knee_and_ceiling_estimate():
    profiles = [profile(1, 100), profile(2, 196), profile(4, 199)]
    assert knee_of(profiles, 0.05) == 2
    rss = [profile(1, 1, rss=300), profile(16, 1, rss=330), profile(64, 1, rss=426)]
    assert estimate_ceiling(rss, limit_mb=1300) == 64 + int((1300 - 426) / 2.0)


def test_decision_round_trips_through_json():
    from optimizer.records.measurements import MaxBatchDecision

    d = find_max_batch_size(FakeModel(lambda b: 100.0 * b, oom_above=5), BatchPolicy())
    again = MaxBatchDecision.from_json(d.to_json())
    assert again.to_json() == d.to_json()


def test_a_step_within_its_own_measured_spread_is_not_growth():
    """Batch 8 measured 7% above batch 4 but with windows 9% apart: that is noise, the search stops there."""
    spread = {1: 0.01, 2: 0.01, 4: 0.02, 8: 0.09, 16: 0.09}

    def measure(b):
        p = profile(b, {1: 100, 2: 190, 4: 200, 8: 214, 16: 215}[b])
        p.cv = spread[b]
        return p

    d = find_max_batch_size(measure, BatchPolicy())
    assert d.search_stop == "saturation" and d.largest_fit == 16
    assert d.max_batch_size == d.peak == 4  # 214 vs 200 is within batch 8's 9% spread: the smaller batch is the peak


def test_measurements_taken_while_others_used_the_cpu_are_taken_again(monkeypatch):
    from optimizer.task import profiling

    shares = iter([0.7, 0.6, 0.1])
    waits: list[float] = []
    monkeypatch.setattr(profiling, "measure", lambda run, batch, settings: _busy(batch, next(shares)))
    monkeypatch.setattr(profiling.time, "sleep", lambda s: None)
    monkeypatch.setattr(profiling, "wait_for_quiet", lambda limit, wait_s: waits.append(limit) or 0.0)
    monkeypatch.setattr(profiling._Load, "stays", False)
    p = profiling.measure_settled(lambda: None, 4, profiling.ProfileSettings(retakes=2))
    assert p.others_cpu_share == 0.1 and p.retakes == 2
    assert len(waits) == 2  # each retake waited for the load to fall first (a burst outlasts a short pause)
    shares = iter([0.9, 0.8, 0.85])
    p = profiling.measure_settled(lambda: None, 4, profiling.ProfileSettings(retakes=2))
    assert p.retakes == 2 and p.others_cpu_share == 0.8  # the budget is bounded: the least disturbed one is kept
    shares = iter([0.1])
    assert profiling.measure_settled(lambda: None, 4, profiling.ProfileSettings()).retakes == 0
    shares = iter([0.5, 0.48, 0.1])
    p = profiling.measure_settled(lambda: None, 4, profiling.ProfileSettings(retakes=2))
    assert p.retakes == 1 and p.others_cpu_share == 0.48  # a steady load (another job's core) is not waited out


def test_a_load_that_does_not_fall_is_waited_for_once_per_process(monkeypatch):
    """A wait that times out with the load still there means the load stays: later retakes do not wait 3 s again."""
    from optimizer.task import profiling

    shares = iter([0.7, 0.6, 0.5, 0.7, 0.6, 0.5])
    waits: list[float] = []
    monkeypatch.setattr(profiling, "measure", lambda run, batch, settings: _busy(batch, next(shares)))
    monkeypatch.setattr(profiling.time, "sleep", lambda s: None)
    monkeypatch.setattr(profiling, "wait_for_quiet", lambda limit, wait_s: waits.append(wait_s) or 1.0)
    monkeypatch.setattr(profiling._Load, "stays", False)
    assert profiling.measure_settled(lambda: None, 4, profiling.ProfileSettings(retakes=2, quiet_wait_s=3.0)).retakes == 2
    assert profiling.measure_settled(lambda: None, 8, profiling.ProfileSettings(retakes=2)).retakes == 2
    assert waits == [3.0]


def test_a_measurement_reports_the_load_in_the_windows_it_reports(monkeypatch):
    """Others' share is read over the windows whose latencies are reported, not the whole measurement: a burst that
    fills the last windows after quiet ones is seen whole (over the whole measurement it would be diluted below
    busy_share and never retaken)."""
    from optimizer.task import cpu_load, profiling

    clock = {"t": 0.0, "others": 0, "own": 0}
    tick = cpu_load.clock_ticks()

    def run():  # one inference: 10 ms of this process's one core; from the 41st, another process takes as long again
        clock["n"] = clock.get("n", 0) + 1
        burst = clock["n"] > 40
        clock["t"] += 0.02 if burst else 0.01
        clock["own"] += 0.01 * tick
        clock["others"] += 0.01 * tick if burst else 0

    monkeypatch.setattr(profiling, "available_cores", lambda: [0])
    monkeypatch.setattr(cpu_load, "read_cpu_busy", lambda: {0: int(clock["others"] + clock["own"])})
    monkeypatch.setattr(profiling, "own_ticks", lambda: int(clock["own"]))
    monkeypatch.setattr(profiling.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(profiling.time, "perf_counter_ns", lambda: int(clock["t"] * 1e9))
    p = profiling.measure(run, 1, profiling.ProfileSettings(warmup_runs=0, window_s=0.1, stable_windows=3, cv_threshold=-1.0,
                                                                        time_cap_s=0.8))
    assert p.windows == 8 and p.others_cpu_share == pytest.approx(0.5)  # over all 0.8 s it was 0.25: below busy_share


def _busy(batch: int, share: float) -> BatchProfile:
    p = profile(batch, 100.0)
    p.others_cpu_share = share
    return p


SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def test_a_padding_backend_gets_the_max_closest_to_the_best_at_every_load_not_its_peak():
    # a padded max b answers min(c, b) of c requests with b rows: on a flat curve every lone request pays for b rows
    flat = [profile(b, 1000.0) for b in SIZES]
    assert every_load_max(flat) == 1
    # rows cost nothing extra up to 8, then time grows with rows: 8 serves every load as well as any size
    linear_then_flat = [profile(b, 100.0 * min(b, 8)) for b in SIZES]
    assert every_load_max(linear_then_flat) == 8
    # a curve that keeps rising (the peak is 128): far below the peak, and more than one row
    rising = [profile(b, 100.0 * b ** 0.5) for b in SIZES]
    chosen = every_load_max(rising)
    assert 1 < chosen < 128
    def worst(b: int) -> float:
        thr = {p.batch_size: p.throughput for p in rising}
        loads = [*SIZES, 10**9]
        return min((thr[b] * min(c, b) / b) / max(thr[x] * min(c, x) / x for x in SIZES) for c in loads)
    assert worst(chosen) == max(worst(b) for b in SIZES) and worst(chosen) > 2 * worst(128)


def test_only_a_padding_backends_searched_max_is_replaced_in_the_rules_point():
    from types import SimpleNamespace

    from optimizer.app.export import _padded_max_for_every_load
    from optimizer.records.triton_platforms import PLATFORMS

    rising = [profile(b, 100.0 * b ** 0.5) for b in SIZES]

    def result(platform: str, decided_by: str = "peak") -> SimpleNamespace:
        decision = SimpleNamespace(profiles=rising, decided_by=decided_by)
        cand = SimpleNamespace(artifact=SimpleNamespace(platform=PLATFORMS[platform]), decision=decision)
        return SimpleNamespace(selected_candidate=cand, max_batch_size=128, selection_reason="fastest")

    padded = result("openvino")
    _padded_max_for_every_load(padded, None)
    assert padded.max_batch_size == every_load_max(rising) < 128
    assert "not the in-process peak 128" in padded.selection_reason and "openvino backend computes max_batch_size rows" in padded.selection_reason
    for unchanged, user_max in ((result("onnxruntime_onnx"), None), (result("openvino"), 128), (result("openvino", "recorded"), None)):
        _padded_max_for_every_load(unchanged, user_max)
        assert unchanged.max_batch_size == 128 and unchanged.selection_reason == "fastest"


class FitCheck:
    """fits(batch) for the fit check past a saturation stop: milliseconds of one inference, OOM above a size."""

    def __init__(self, oom_above: int | None = None, ms=lambda b: 1.0 * b):
        self.oom_above, self.ms, self.asked = oom_above, ms, []

    def __call__(self, batch: int) -> float:
        self.asked.append(batch)
        if self.oom_above is not None and batch > self.oom_above:
            raise OutOfMemory(f"batch {batch}: cannot allocate")
        return self.ms(batch)


def test_past_a_saturation_stop_larger_batches_are_run_once_to_check_they_fit():
    """The served search may try them (the server's per-request cost can favour larger batches); the max stays the peak."""
    fake, fit = FakeModel(lambda b: {1: 100, 2: 190, 4: 195, 8: 203}[b]), FitCheck()
    d = find_max_batch_size(fake, BatchPolicy(), fits=fit)
    assert fake.measured == [1, 2, 4, 8] and fit.asked == [16, 32]  # two doublings, never profiled
    assert d.max_batch_size == 8 and d.largest_fit == 32 and d.fit_checked == [16, 32]
    assert "16 and 32 ran once each to check they fit" in d.explanation
    assert MaxBatchDecision.from_json(d.to_json()).fit_checked == [16, 32]


@pytest.mark.parametrize("fit, largest", [(FitCheck(oom_above=16), 16), (FitCheck(ms=lambda b: 2.0 * b), 16)])
def test_the_fit_check_ends_at_the_first_batch_out_of_memory_or_over_the_latency_budget(fit: FitCheck, largest: int):
    fake = FakeModel(lambda b: {1: 100, 2: 190, 4: 195, 8: 203}[b])
    d = find_max_batch_size(fake, BatchPolicy(latency_budget_ms=40.0), fits=fit)  # 2 ms a row: 32 rows take 64 ms
    assert d.largest_fit == largest and d.fit_checked == [16] and fit.asked == [16, 32]


def test_no_fit_check_for_a_batch_whose_inference_would_take_over_a_second():
    fit = FitCheck()
    d = find_max_batch_size(FakeModel(lambda b: {1: 10, 2: 19, 4: 19.5, 8: 20.3}[b]), BatchPolicy(), fits=fit)  # 8 rows: 394 ms
    assert d.search_stop == "saturation" and fit.asked == [16] and d.largest_fit == 16  # 32 rows would take about 1.6 s


def test_no_fit_check_where_the_growth_ended_on_a_limit_or_a_size_the_user_asked_for():
    for policy, oom in ((BatchPolicy(max_batch_size=8), None), (BatchPolicy(search_cap=16), None), (BatchPolicy(), 5)):
        fit = FitCheck()
        d = find_max_batch_size(FakeModel(lambda b: 100.0 * b, oom_above=oom), policy, fits=fit)
        assert fit.asked == [] and d.fit_checked == [] and d.largest_fit == d.profiles[-1].batch_size


def test_the_fit_check_has_room_for_half_the_available_memory_within_the_budget():
    """A batch never profiled may not push the machine into swap or the OOM killer (which would end the candidate)."""
    from optimizer.task.evaluation import _host_room_mb
    from optimizer.task.profiling import peak_rss_mb

    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) / 1024 for line in f if line.startswith("MemAvailable:"))
    room = _host_room_mb(None)
    assert peak_rss_mb() < room <= peak_rss_mb() + 0.55 * available  # (MemAvailable read a moment apart)
    assert _host_room_mb(peak_rss_mb() + 10) <= peak_rss_mb() + 10  # the memory budget's limit bounds it
