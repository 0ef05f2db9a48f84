"""validate's open-loop check: which rates it measures (the export's claim, --rate, a --traffic trace), when a rate not
held fails validate and when it is a warning, what it prints, and one short real run on the bundled server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.records.capacity import RateLevel
from optimizer.triton.measure.validation.open_loop import OpenLoopAsk, Step, check_open_loop, open_loop_record, plan_open_loop, run_open_loop, verdict
from tests.conftest import run_cli, tree_snapshot
from tests.test_triton_server import write_double_model

CLAIM = {"rate_per_s": 300.0, "latency_budget_ms": 20.0, "percentile": 99, "arrivals": "constant", "runs": 9, "curve": []}


def _levels(plan, served: dict[float, tuple[float, float]]):
    """Measure `plan` with made-up figures: offered rate -> (throughput, p-latency ms)."""
    def measure(step: Step, k: int) -> RateLevel:
        throughput, ms = served[step.rate]
        return RateLevel(step.rate, throughput, ms / 2, ms, ms, ms)
    return run_open_loop(plan, measure)


def test_a_claim_is_checked_at_080_and_100_times_its_rate_with_its_own_arrivals_percentile_and_budget():
    plan = plan_open_loop(OpenLoopAsk(), CLAIM, None)
    assert [(s.rate, s.required) for s in plan.steps] == [(240.0, True), (300.0, False)]
    assert (plan.arrivals, plan.percentile, plan.latency_budget_ms) == ("constant", 99, 20.0)
    assert plan.source.startswith("the export's claim: 300 requests/s held")
    assert plan_open_loop(OpenLoopAsk(arrivals="poisson", latency_budget_ms=50), CLAIM, None).arrivals == "poisson"
    asked = plan_open_loop(OpenLoopAsk(rate=120), CLAIM, None)
    assert [(s.rate, s.role, s.required) for s in asked.steps] == [(120, "--rate", True)] and asked.latency_budget_ms == 20.0
    assert "the export's claim (300 requests/s) was not checked" in asked.notes[0]
    assert plan_open_loop(OpenLoopAsk(), None, None) is None  # nothing asked, nothing claimed: closed-loop only
    assert plan_open_loop(OpenLoopAsk(), {**CLAIM, "rate_per_s": None}, None) is None  # the export held no rate: no claim
    traced = plan_open_loop(OpenLoopAsk(), {**CLAIM, "arrivals": "trace"}, None)
    assert traced.arrivals == "poisson" and "timestamps are not here" in traced.notes[0]
    assert plan_open_loop(OpenLoopAsk(), {**CLAIM, "arrivals": "trace"}, [0, 5, 10]).arrivals == "trace"


def test_a_traffic_trace_is_replayed_at_its_own_mean_rate_or_scaled_to_rate():
    own = plan_open_loop(OpenLoopAsk(), None, [0.0, 10.0, 20.0, 40.0], user_trace=True)
    assert own.arrivals == "trace" and [(s.rate, s.role) for s in own.steps] == [(75.0, "the trace's own rate")] and own.steps[0].required
    assert own.latency_budget_ms is None and own.percentile == 95 and "held means served at least 97%" in own.target
    scaled = plan_open_loop(OpenLoopAsk(rate=150), None, [0.0, 10.0, 20.0, 40.0], user_trace=True)
    assert scaled.arrivals == "trace" and scaled.steps[0].rate == 150
    from optimizer.triton.measure.validation.open_loop import schedule

    gaps = schedule(scaled, scaled.steps[0], [0.0, 10.0, 20.0, 40.0], seed=0)
    assert sum(gaps) / len(gaps) == pytest.approx(1e6 / 150, rel=0.01) and gaps[2] == 2 * gaps[0]  # scaled, bursts kept


def test_080_not_held_fails_and_the_claimed_capacity_not_held_is_a_warning():
    plan = plan_open_loop(OpenLoopAsk(), CLAIM, None)
    held = _levels(plan, {240.0: (240.0, 9.0), 300.0: (299.0, 18.0)})
    assert verdict(plan, held)[0] == "held" and "held 240/s (0.8x the claimed capacity) and 300/s (the claimed capacity)" in verdict(plan, held)[1]
    edge = _levels(plan, {240.0: (240.0, 9.0), 300.0: (299.0, 26.5)})
    state, line = verdict(plan, edge)
    assert state == "warning" and "300/s (the claimed capacity) not held: p99 26.5 ms is over 20 ms" in line and "240/s held" in line
    wrong = _levels(plan, {240.0: (200.0, 80.0), 300.0: (210.0, 400.0)})
    state, line = verdict(plan, wrong)
    assert state == "not held" and "240/s (0.8x the claimed capacity) not held: served 200.0/s of 240/s offered" in line
    assert "the claim does not hold here" in line and "\n" not in line
    record = open_loop_record(plan, wrong, "grpc", 4000, "the export's traffic")
    assert record["verdict"] == "not held" and record["claim"]["rate_per_s"] == 300.0 and record["arrivals_label"] == "evenly spaced arrivals"
    assert [lv["held"] for lv in record["levels"]] == [False, False] and record["levels"][0]["role"] == "0.8x the claimed capacity"
    asked = plan_open_loop(OpenLoopAsk(rate=100), None, None)
    assert verdict(asked, _levels(asked, {100: (90.0, 5.0)}))[0] == "not held"  # a rate the user asked for must hold


def test_validate_fails_on_080_not_held_warns_on_100_and_prints_both_kinds_of_figure(monkeypatch, capsys, tmp_path: Path):
    """The record's status, the exit status and the console, with perf_analyzer's figures made up."""
    from optimizer.cli.output import print_validation
    from optimizer.errors import ValidationError
    from optimizer.triton.measure.validation.expectation import ExportReference
    from optimizer.triton.measure.validation.record import ValidationRecord
    from optimizer.triton.runtime import perf_analyzer_rate

    for served, status in (({240.0: (240.0, 9.0), 300.0: (250.0, 90.0)}, "passed"), ({240.0: (170.0, 90.0), 300.0: (180.0, 95.0)}, "failed")):
        monkeypatch.setattr(perf_analyzer_rate, "measure_rate",
                            lambda model, url, data, intervals, work, settings, served=served: RateLevel(
                                perf_analyzer_rate.mean_rate([int(x) for x in intervals.read_text().split()]), *_fig(served, intervals)))
        record = ValidationRecord("m", "repo", "local", "onnxruntime_onnx", "onnxruntime", status="passed", reason="loaded")
        record.perf = {"rows": [{"concurrency": 4, "throughput": 480.0, "p50_ms": 5.0, "p95_ms": 9.0, "p99_ms": 12.0}],
                       "settings": {"protocol": "grpc", "batch_size": 1}, "unstable": []}
        record.output_dir = str(tmp_path)
        reference = ExportReference(tmp_path, tmp_path, tmp_path, [], "c", None, None, capacity=CLAIM)
        check_open_loop(record, type("T", (), {"name": "m"})(), reference, {"input": []}, OpenLoopAsk(window_ms=4000), None,
                        tmp_path / "in.json", "127.0.0.1:1", "grpc", tmp_path, tmp_path / "work", lambda e: None)
        assert record.status == status, record.reason
        print_validation(record)
        out = capsys.readouterr().out
        assert "perf_analyzer closed-loop: N clients, each waiting for its answer" in out and "clients (N)" in out
        assert "perf_analyzer open-loop: requests/s offered on a schedule, evenly spaced arrivals (grpc, p99 <= 20 ms, 3 windows of 4 s)" in out
        if status == "passed":
            assert "open-loop WARNING: 300/s (the claimed capacity) not held" in out and "240/s held: a single run at capacity" in out
            assert out.count("a single run at capacity") == 1 and "a warning" in record.reason
            record.raise_for_status()  # exit 0
        else:
            assert "open-loop NOT HELD: 240/s (0.8x the claimed capacity) not held" in out and "NOT HELD (0.8x the claimed capacity)" in out
            with pytest.raises(ValidationError, match="0.8x the claimed capacity"):  # exit 1
                record.raise_for_status()


def _fig(served, intervals):
    from optimizer.triton.runtime.perf_analyzer_rate import mean_rate

    offered = round(mean_rate([int(x) for x in intervals.read_text().split()]))
    throughput, ms = served[float(offered)]
    return throughput, ms / 2, ms, ms, ms


@pytest.mark.parametrize("args, fragment", [
    (["repo", "--rate", "0"], "--rate 0 must be a positive number"),
    (["repo", "--rate", "10", "--latency-budget-ms", "-5"], "--latency-budget-ms -5 must be a positive"),
    (["repo", "--traffic", "trace.json"], "entry 1: \"timestamp\" 3 is before entry 0's 5"),
])
def test_bad_open_loop_options_exit_2_and_write_nothing(args, fragment, tmp_path: Path):
    write_double_model(tmp_path / "repo")
    (tmp_path / "trace.json").write_text(json.dumps({"data": [{"x": [1.0, 2.0, 3.0], "timestamp": 5}, {"x": [1.0, 2.0, 3.0], "timestamp": 3}]}))
    before = tree_snapshot(tmp_path)
    r = run_cli("validate", *args, cwd=tmp_path)
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert tree_snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_traffic_trace_is_replayed_open_loop_in_a_real_server_and_says_which_figure_is_which(tmp_path: Path):
    """A trace scaled to --rate through the bundled server over gRPC: every request in the trace's order, the verdict
    and the exit status agree, and each figure printed says closed-loop or open-loop."""
    write_double_model(tmp_path / "repo")
    stamps = [0, 2, 3, 30, 31, 60, 90, 91, 92, 120]  # bursty
    (tmp_path / "trace.json").write_text(json.dumps({"data": [{"x": [float(k), 1.0, 2.0], "timestamp": t} for k, t in enumerate(stamps)]}))
    r = run_cli("validate", "repo", "--traffic", "trace.json", "--rate", "100", "--rate-window", "1000", "--concurrency", "1",
                "--measurement-interval", "300", cwd=tmp_path, timeout=120)
    record = json.loads((tmp_path / "aitune-reports" / "double" / "validation.json").read_text())
    section = record["open_loop"]
    assert section["arrivals"] == "trace" and section["protocol"] == "grpc" and section["latency_budget_ms"] is None
    level = section["levels"][0]
    assert level["offered"] == pytest.approx(100, rel=0.02) and level["throughput"] > 0 and level["role"] == "--rate"
    assert (r.returncode == 0) == (section["verdict"] == "held") == level["held"], r.stderr
    assert "all 10 requests in the trace's order" in section["sending"] and record["traffic"].startswith("--traffic trace.json")
    assert "perf_analyzer closed-loop: N clients" in r.stdout and "open-loop: requests/s offered on a schedule, the trace's schedule" in r.stdout
