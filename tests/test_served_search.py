"""The served search: which variants it tries and when it stops (pure), why it skips, and a real search end to end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from optimizer.records.served_search import OperatingPoint, ServedSearch, ServedVariant
from optimizer.triton.model_config import parse
from optimizer.triton.publish import PublishOptions, prepare_config
from optimizer.triton.served_search import SearchRequest, served_search
from optimizer.triton.served_search.points import (
    SearchSpace,
    batch_steps,
    better,
    default_concurrency,
    delay_steps,
    layout_steps,
    layouts,
    reachable,
)
from optimizer.triton.served_search.search import _climb
from tests.conftest import run_cli
from tests.triton_records import make_result

START = OperatingPoint(8, (8,), 200, 1, 2)


def variant(point: OperatingPoint, throughput: float, p95: float = 10.0) -> ServedVariant:
    return ServedVariant(point, "x", throughput=throughput, p50_ms=p95 / 2, p95_ms=p95, p99_ms=p95 * 1.2, seconds=1.0)


# -- the neighbourhood -----------------------------------------------------------------------------


def test_cpu_layouts_never_use_more_threads_than_cores():
    assert layouts(SearchSpace(32, False, 2, False)) == [(1, 2), (2, 1)]
    assert layouts(SearchSpace(32, False, 16, False)) == [(1, 16), (2, 8), (4, 4), (8, 2)]
    assert all(n * t <= 6 for n, t in layouts(SearchSpace(32, False, 6, False)))
    assert layouts(SearchSpace(32, False, 16, True)) == [(1, None), (2, None)]
    assert [(p.instances, p.threads) for p in layout_steps(START, SearchSpace(32, False, 2, False))] == [(2, 1)]


def test_batch_steps_try_capacity_first_then_double_and_halve_the_peak():
    up, down = batch_steps(START, SearchSpace(64, False, 2, False))
    assert up[0] == OperatingPoint(64, (8,), 200, 1, 2)  # max = the largest batch that fit, preferred = the peak
    assert [(p.max_batch_size, p.preferred) for p in up[1:]] == [(16, (16,)), (32, (32,)), (64, (64,))]
    assert [(p.max_batch_size, p.preferred) for p in down] == [(4, (4,)), (2, (2,))]


def test_a_max_the_user_fixed_never_moves():
    up, down = batch_steps(OperatingPoint(32, (8,), 200, 1, 2), SearchSpace(32, True, 2, False))
    assert {p.max_batch_size for p in up + down} == {32}
    assert [p.preferred for p in up] == [(16,), (32,)] and [p.preferred for p in down] == [(4,), (2,)]


def test_preferred_sizes_stay_within_what_the_target_load_can_form():
    assert reachable(OperatingPoint(64, (64,), 0, 1, 2), 16).preferred == (16,)
    assert reachable(OperatingPoint(64, (64,), 0, 1, 2), 12).preferred == (8,)
    assert reachable(START, 16) == START
    up, _ = batch_steps(START, SearchSpace(64, False, 2, False, concurrency=16))
    assert max(max(p.preferred) for p in up) == 16


def test_queue_delay_steps_are_none_and_a_larger_one():
    assert [p.queue_delay_us for p in delay_steps(START)] == [0, 800]
    assert [p.queue_delay_us for p in delay_steps(OperatingPoint(8, (8,), 0, 1, 2))] == [500]
    assert delay_steps(OperatingPoint(1, (), 0, 1, 2)) == []  # nothing to batch, nothing to wait for


def test_default_concurrency_keeps_two_peak_batches_in_flight():
    assert default_concurrency(START) == 16
    assert default_concurrency(OperatingPoint(0, (), 0, 1, None)) == 2
    assert default_concurrency(OperatingPoint(4096, (4096,), 0, 1, None)) == 64


# -- what counts as better ----------------------------------------------------------------------------


def test_noise_does_not_decide_but_a_clear_gain_or_a_much_lower_latency_does():
    base = variant(START, 100.0, p95=50.0)
    assert not better(variant(START, 102.0, p95=50.0), base, None)  # within the 3 % noise
    assert better(variant(START, 104.0, p95=50.0), base, None)
    assert better(variant(START, 99.0, p95=30.0), base, None)  # as fast, answers much sooner
    assert not better(variant(START, 99.0, p95=30.0), base, None, top=110.0)  # but not below what another variant served


def test_a_latency_budget_comes_before_throughput():
    fast_but_slow_to_answer = variant(START, 200.0, p95=80.0)
    within = variant(START, 120.0, p95=40.0)
    assert better(within, fast_but_slow_to_answer, 50.0)
    assert not better(fast_but_slow_to_answer, within, 50.0)
    assert better(variant(START, 150.0, p95=45.0), within, 50.0)


# -- the walk -------------------------------------------------------------------------------------------


def _served(point: OperatingPoint) -> float:
    """A made-up server: two instances help, the best batch is 4, a queue delay costs a little."""
    tp = {8: 400.0, 16: 380.0, 4: 460.0, 2: 430.0, 64: 300.0}[point.preferred[0] if point.preferred else point.max_batch_size]
    if point.max_batch_size == 64 and point.preferred == (8,):
        tp = 390.0
    return tp * (1.1 if point.instances == 2 else 1.0) * (1.0 if point.queue_delay_us == 0 else 0.99)


def test_the_walk_finds_the_best_neighbour_and_stops_at_the_first_step_that_does_not_improve():
    measured: list[OperatingPoint] = []

    def measure(point: OperatingPoint, stage: str) -> ServedVariant:
        measured.append(point)
        return variant(point, _served(point))

    best, stopped = _climb(measure(START, "start"), SearchSpace(64, False, 2, False), measure, time.monotonic() + 60, SearchRequest(Path(".")))
    assert best.point == OperatingPoint(4, (4,), 0, 2, 1)  # the second instance was tried without the delay first
    assert "no neighbour" in stopped
    assert len(measured) == len(set(measured))  # no variant measured twice
    assert OperatingPoint(2, (2,), 0, 2, 1) in measured  # the walk went one step past the best, then stopped
    assert OperatingPoint(32, (32,), 0, 2, 1) not in measured  # batch 16 served less: larger ones were not tried
    assert OperatingPoint(8, (8,), 200, 2, 1) not in measured  # the layout won without the delay: not measured with it


def test_a_second_instance_is_tried_without_the_rules_delay():
    """The bundled CNN's pattern in the exhaustive grid: 2x1t served 4% less at the rules' queue delay and 14% more
    at none, and the one-knob-at-a-time walk had settled on the start."""
    measured: list[OperatingPoint] = []

    def measure(point: OperatingPoint, stage: str) -> ServedVariant:
        measured.append(point)
        if point.instances == 2:
            return variant(point, 387.0 if point.queue_delay_us == 0 else 325.0)
        return variant(point, 338.0 if point.max_batch_size == 2 else 300.0)

    start = OperatingPoint(2, (2,), 288, 1, 2)
    best, _ = _climb(measure(start, "start"), SearchSpace(4, False, 2, False), measure, time.monotonic() + 60, SearchRequest(Path(".")))
    assert (best.point.instances, best.point.threads, best.point.queue_delay_us) == (2, 1, 0)
    assert measured[1] == OperatingPoint(2, (2,), 0, 2, 1)  # without the delay first: with it, it lost


def test_a_layout_that_only_wins_with_its_delay_is_still_taken():
    def measure(point: OperatingPoint, stage: str) -> ServedVariant:
        return variant(point, 500.0 if point.instances == 2 and point.queue_delay_us else 300.0)

    start = OperatingPoint(2, (2,), 288, 1, 2)
    best, _ = _climb(measure(start, "start"), SearchSpace(2, False, 2, False), measure, time.monotonic() + 60, SearchRequest(Path(".")))
    assert (best.point.instances, best.point.queue_delay_us) == (2, 288)


def test_a_small_win_made_by_drift_is_not_confirmed():
    """The machine speeds up during the search: every later measurement is 6% higher, whatever the config."""
    calls: list[tuple[OperatingPoint, str]] = []

    def measure(point: OperatingPoint, stage: str) -> ServedVariant:
        calls.append((point, stage))
        return variant(point, 400.0 * (1.06 if len(calls) > 1 else 1.0))

    start = measure(START, "start")
    best, _ = _climb(start, SearchSpace(8, False, 2, False), measure, time.monotonic() + 60, SearchRequest(Path(".")))
    assert best.point == START  # the 6% "gain" of 2 instances vanished when the start was measured again
    assert calls[1][1] == "instances" and calls[2] == (START, "confirm")


def test_the_time_budget_ends_the_search_with_the_best_so_far():
    calls = []

    def measure(point: OperatingPoint, stage: str) -> ServedVariant:
        calls.append(point)
        return variant(point, _served(point))

    start = measure(START, "start")
    best, stopped = _climb(start, SearchSpace(64, False, 2, False), measure, time.monotonic() + 0.5, SearchRequest(Path("."), budget_s=0.5))
    assert "time budget" in stopped and len(calls) == 1 and best is start  # a variant takes 1 s: none fits in 0.5 s


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


@pytest.mark.slow
def test_export_searches_in_the_server_and_publishes_what_it_measured(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled", "--concurrency", "4",
                "--serve-search-seconds", "30", "--validate", "--validate-concurrency", "4", cwd=in_tmp, serve_search=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads((in_tmp / "aitune-reports" / "mlp" / "report.json").read_text())
    search = ServedSearch.from_json(doc["published"]["served_search"])
    assert search.status == "searched", search.reason
    assert search.concurrency == 4 and search.stand_in and "stand-in" in search.served_by
    assert search.variants[0].stage == "start" and search.variants[0].point == search.start
    measured = [v for v in search.variants if v.status == "measured"]
    assert len(measured) >= 2 and all(v.throughput and v.p95_ms for v in measured)
    chosen = search.chosen_variant
    assert chosen is not None and chosen.differs == {}
    config = parse((in_tmp / "model_repository" / "mlp" / "config.pbtxt").read_text())
    assert config.max_batch_size == search.chosen.max_batch_size
    assert config.instance_group[0].count == search.chosen.instances
    if config.max_batch_size > 1:
        assert list(config.dynamic_batching.preferred_batch_size) == list(search.chosen.preferred)
        assert config.dynamic_batching.max_queue_delay_microseconds == search.chosen.queue_delay_us
    assert "served search:" in r.stdout
    report_md = (in_tmp / "aitune-reports" / "mlp" / "report.md").read_text()
    assert "## Served search" in report_md and (in_tmp / "aitune-reports" / "mlp" / "served_search.png").is_file()
    validation = json.loads((in_tmp / "aitune-reports" / "mlp" / "validation.json").read_text())
    assert validation["status"] == "passed", validation["reason"]
    assert validation["predicted_concurrency"] == 4 and validation["predicted_throughput"] == search.predicted_throughput
    assert 4 in [row["concurrency"] for row in validation["perf"]["rows"]] and validation["throughput_ratio"] is not None
    assert "served search" in validation["predicted_how"]


@pytest.mark.slow
def test_torch_aoti_is_searched_and_validated_locally_through_the_pytorch_stand_in(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "torch-aoti", "--eager-gate", "disabled", "--max-batch-size", "8",
                "--concurrency", "4", "--serve-search-seconds", "15", "--validate", "--validate-concurrency", "4", cwd=in_tmp,
                serve_search=True)
    assert r.returncode == 0, r.stderr
    config = parse((in_tmp / "model_repository" / "mlp__positional" / "config.pbtxt").read_text())  # behind the ensemble mlp
    assert config.platform == "torch_aoti"  # the published config is for Triton 26.03+, unchanged by the local translation
    doc = json.loads((in_tmp / "aitune-reports" / "mlp" / "report.json").read_text())
    search = doc["published"]["served_search"]
    assert search["status"] == "searched" and search["stand_in"] and "no platform 'torch_aoti'" in search["served_by"]
    validation = json.loads((in_tmp / "aitune-reports" / "mlp" / "validation.json").read_text())
    assert validation["status"] == "passed" and validation["stand_in"], validation["reason"]
    assert all(a["passed"] and a["compared_with"] == "reference" for a in validation["answers"])
    assert any("no platform 'torch_aoti'" in n for n in validation["notes"])
    assert "[stand-in backend]" in r.stdout


@pytest.mark.slow
def test_serve_search_off_keeps_the_in_process_rules(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled", "--serve-search", "off", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    doc = json.loads((in_tmp / "aitune-reports" / "mlp" / "report.json").read_text())
    assert doc["published"]["served_search"]["status"] == "off" and doc["published"]["served_search"]["variants"] == []
    config = parse((in_tmp / "model_repository" / "mlp" / "config.pbtxt").read_text())
    assert config.max_batch_size == doc["result"]["max_batch_size"] and config.instance_group[0].count == 1


def test_bad_serving_options_are_one_line_and_exit_2(in_tmp: Path):
    for args, words in ((("--concurrency", "0"), "--concurrency 0 must be from 1"),
                        (("--serve-search-seconds", "0"), "--serve-search-seconds 0 must be positive"),
                        (("--serve-search", "maybe"), "maybe")):
        r = run_cli("export", "tests.fixtures.models:mlp", *args, cwd=in_tmp, serve_search=True)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert not (in_tmp / "model_repository").exists()

