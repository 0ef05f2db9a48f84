"""perf_analyzer's inputs and outputs as users meet them: real samples in, an unordered CSV and console report out."""

from __future__ import annotations

import base64
import json
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from optimizer.errors import SettingsError, ValidationError
from optimizer.triton.runtime.perf_analyzer import ConcurrencyRange, PerfSettings, parse_csv, perf_analyzer_command
from optimizer.triton.runtime.perf_analyzer_console import parse_server_counts
from optimizer.triton.runtime.perf_analyzer_input import write_input_data

# Captured from perf_analyzer 2.51 against the local tritonserver 2.51 (rows in perf_analyzer's own order).
CSV = """Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency
3,16887.8,40,232,252,17,133,30,0,679,941,1019,1521
1,2579.5,50,150,1110,18,166,48,0,1477,1634,1675,3278
2,17808.3,32,199,52,17,114,28,0,424,580,682,932
"""

CONSOLE = """Request concurrency: 1
  Client: 
    Request count: 113
    Throughput: 15.6772 infer/sec
  Server: 
    Inference count: 113
    Execution count: 113
    Successful request count: 113

Request concurrency: 8
  Client: 
    Request count: 608
  Server: 
    Inference count: 608
    Execution count: 152
    Successful request count: 608

Request concurrency: 4
Failed to obtain stable measurement within 10 measurement windows for concurrency 4. Please try to increase the --measurement-interval.
"""


def test_csv_rows_come_back_in_concurrency_order_in_milliseconds():
    rows = parse_csv(CSV)
    assert [r.concurrency for r in rows] == [1, 2, 3]
    first = rows[0]
    assert first.throughput == pytest.approx(2579.5)
    assert (first.p50_ms, first.p95_ms, first.p99_ms) == pytest.approx((1.477, 1.675, 3.278))
    assert first.server_queue_ms == pytest.approx(1.110)
    assert first.server_compute_ms == pytest.approx((18 + 166 + 48) / 1000)


def test_a_csv_without_the_needed_columns_is_refused_with_its_header():
    header = "Request Rate,Inferences/Second,p50 latency,p90 latency,p95 latency,p99 latency\n1,2,3,4,5,6\n"
    with pytest.raises(ValidationError, match="no column.*Concurrency.*Request Rate"):
        parse_csv(header)


def test_server_batch_comes_from_inference_and_execution_counts():
    counts = parse_server_counts(CONSOLE)
    assert counts == {1: (113, 113), 8: (608, 152)}  # the unstable level has no counts
    rows = parse_csv(CSV.replace("\n3,", "\n8,"))
    row = next(r for r in rows if r.concurrency == 8)
    row.inference_count, row.execution_count = counts[8]
    assert row.server_batch == 4.0 and row.to_json()["server_batch"] == 4.0


def test_input_data_holds_each_sample_row_exactly(tmp_path: Path):
    rng = np.random.default_rng(0)
    feeds = [{"image": rng.standard_normal((1, 3, 4, 4)).astype(np.float32), "ids": np.arange(5, dtype=np.int64)[None]},
             {"image": rng.standard_normal((3, 3, 4, 4)).astype(np.float32), "ids": np.arange(15, dtype=np.int64).reshape(3, 5)}]
    path = write_input_data(tmp_path / "in.json", feeds, batching=True)
    data = json.loads(path.read_text())["data"]
    assert len(data) == 4  # one entry per batch row: perf_analyzer -b N stacks N of them
    third = data[2]
    assert third["image"]["shape"] == [3, 4, 4] and third["ids"]["shape"] == [5]
    image = np.frombuffer(base64.b64decode(third["image"]["content"]["b64"]), dtype="<f4").reshape(3, 4, 4)
    np.testing.assert_array_equal(image, feeds[1]["image"][1])
    ids = np.frombuffer(base64.b64decode(third["ids"]["content"]["b64"]), dtype="<i8")
    np.testing.assert_array_equal(ids, feeds[1]["ids"][1])
    assert not list(tmp_path.glob(".*"))  # the atomic write left no temporary file


def test_a_per_sample_scalar_input_is_written_as_one_element(tmp_path: Path):
    """Its config declares dims [1] (reshape { shape: [] }), and perf_analyzer sends each entry in that shape."""
    feeds = [{"x": np.ones((2, 6), np.float64), "idx": np.array([4, 5], dtype=np.int32)}]
    data = json.loads(write_input_data(tmp_path / "in.json", feeds, batching=True).read_text())["data"]
    assert [d["idx"]["shape"] for d in data] == [[1], [1]] and data[1]["x"]["shape"] == [6]
    assert np.frombuffer(base64.b64decode(data[1]["idx"]["content"]["b64"]), dtype="<i4").tolist() == [5]


def test_input_data_for_a_model_without_batching_keeps_full_shapes(tmp_path: Path):
    feeds = [{"x": np.ones((2, 7), np.float32)}] * 50
    data = json.loads(write_input_data(tmp_path / "in.json", feeds, batching=False, max_entries=5).read_text())["data"]
    assert len(data) == 5 and data[0]["x"]["shape"] == [2, 7]


def test_no_samples_is_an_error(tmp_path: Path):
    with pytest.raises(ValidationError, match="no samples"):
        write_input_data(tmp_path / "in.json", [], batching=True)


@pytest.mark.parametrize("text, levels", [("1:8", list(range(1, 9))), ("1:8:7", [1, 8]), ("4", [4]), ("2:6:2", [2, 4, 6])])
def test_concurrency_ranges(text, levels):
    assert ConcurrencyRange.parse(text).levels == levels


@pytest.mark.parametrize("text", ["0:4", "8:1", "a:b", "1:2:3:4", "", "1:-2"])
def test_bad_concurrency_is_a_usage_error(text):
    with pytest.raises(SettingsError, match="--concurrency"):
        ConcurrencyRange.parse(text)


def test_command_line_settles_on_a_noisy_machine(tmp_path: Path):
    cmd = perf_analyzer_command(Path("perf_analyzer"), "cnn", "127.0.0.1:1", tmp_path / "in.json", tmp_path / "o.csv",
                                PerfSettings(ConcurrencyRange.parse("1:8"), "grpc"))
    joined = " ".join(cmd)
    assert "--concurrency-range 1:8:1" in joined and "-i grpc" in joined and "--input-data" in joined
    assert int(cmd[cmd.index("-s") + 1]) >= 50  # wide stability tolerance: 10 % never settles on 2 shared cores


def test_slow_models_get_longer_windows():
    from optimizer.triton.measure.validation.checks import MAX_WINDOW_MS, window_for

    settings = PerfSettings()
    assert window_for(settings, None) == settings.measurement_interval_ms
    assert window_for(settings, 1.0) == settings.measurement_interval_ms  # never shorter than asked
    assert window_for(settings, 150.0) == 3000  # about 20 requests per window
    assert window_for(settings, 5000.0) == MAX_WINDOW_MS


@contextmanager
def _doubling_server(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """A real tritonserver serving the one-node `double` model, and perf_analyzer input data for it."""
    from optimizer.triton.runtime.server import LocalTritonServer
    from tests.test_triton_server import write_double_model

    repo = tmp_path / "repo"
    write_double_model(repo)
    data = write_input_data(tmp_path / "in.json", [{"x": np.ones((1, 3), np.float32)}], batching=True)
    with LocalTritonServer(repo) as server:
        server.load("double")
        yield server, data


@pytest.mark.slow
def test_warm_up_requests_reach_the_server_before_the_measured_windows(tmp_path: Path):
    """perf_analyzer 2.51 has no warm-up option: `warmup_requests` are sent by a separate run, seen by the server, and
    not in the measured rows."""
    from optimizer.triton.runtime.perf_analyzer import run_perf_analyzer

    settings = PerfSettings(concurrency=ConcurrencyRange(2, 2), measurement_interval_ms=500, stability_percentage=100, max_trials=3,
                            timeout_s=120, warmup_requests=300)
    with _doubling_server(tmp_path) as (server, data):
        result = run_perf_analyzer("double", server.http_url, data, tmp_path / "pa", settings)
        stats = server.client("http").get_inference_statistics("double")["model_stats"][0]
    served = int(stats["inference_stats"]["success"]["count"])
    measured = result.rows[0].inference_count
    assert measured is not None and served >= measured + 300


@pytest.mark.slow
def test_a_level_that_never_settles_is_measured_roughly_and_flagged_not_failed(tmp_path: Path):
    """A level whose windows never agree (as on a small busy machine; here forced by a zero tolerance) still gets a row,
    measured by real perf_analyzer windows, and is named as unstable with a note a user reads; the run does not fail."""
    from optimizer.triton.runtime.perf_analyzer import ROUGH_WINDOWS, run_perf_analyzer

    settings = PerfSettings(concurrency=ConcurrencyRange(1, 1), measurement_interval_ms=200, stability_percentage=0, max_trials=3,
                            retry_stability_percentage=0, timeout_s=120)
    with _doubling_server(tmp_path) as (server, data):
        result = run_perf_analyzer("double", server.http_url, data, tmp_path / "pa", settings)
        quick = run_perf_analyzer("double", server.http_url, data, tmp_path / "pa", replace(settings, retry_alone=False))
    assert result.unstable == [1]
    assert [r.concurrency for r in result.rows] == [1] and result.rows[0].throughput > 0
    assert 0 < result.rows[0].p50_ms <= result.rows[0].p99_ms
    assert "still unstable: 1" in result.note and f"mean of {ROUGH_WINDOWS} windows" in result.note
    # the served search's way: no retry with longer windows, straight to the rough mean
    assert quick.unstable == [1] and quick.rows[0].throughput > 0
    assert "re-measured" not in quick.note and "did not settle within 0%" in quick.note


SILENT_CONFIG = """name: "silent"
backend: "python"
max_batch_size: 4
input {{ name: "x" data_type: TYPE_FP32 dims: [3] }}
output {{ name: "y" data_type: TYPE_FP32 dims: [3] }}
instance_group {{ count: 1 kind: KIND_CPU }}
"""

SILENT_MODEL = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(6)  # answers after the run's bound (about 4 s), so the server can stop without waiting out its exit timeout
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
"""


@pytest.mark.slow
def test_a_run_that_stops_making_progress_is_stopped_with_the_level_and_the_fix(tmp_path: Path):
    """A run bounded by its windows, not by the 900 s cap: a server that does not answer in time (as when perf_analyzer's
    HTTP client stalls) ends it after the grace, with one line naming the level, the protocol and what to change."""
    from optimizer.triton.runtime.perf_analyzer import run_perf_analyzer
    from optimizer.triton.runtime.server import LocalTritonServer

    repo = tmp_path / "repo"
    (repo / "silent" / "1").mkdir(parents=True)
    (repo / "silent" / "config.pbtxt").write_text(SILENT_CONFIG.format())
    (repo / "silent" / "1" / "model.py").write_text(SILENT_MODEL)
    data = write_input_data(tmp_path / "in.json", [{"x": np.ones((1, 3), np.float32)}], batching=True)
    settings = PerfSettings(concurrency=ConcurrencyRange(1, 1), measurement_interval_ms=200, max_trials=3, stall_grace_s=3)
    assert settings.timeout_s >= 900  # the cap is not what ends it
    with LocalTritonServer(repo) as server:
        server.load("silent")
        started = time.monotonic()
        with pytest.raises(ValidationError) as stalled:
            run_perf_analyzer("silent", server.http_url, data, tmp_path / "pa", settings)
        took = time.monotonic() - started
    assert took < 30  # its bound is about 4 s; the cap would have been 900
    message = str(stalled.value)
    assert "stopped making progress at concurrency 1 over http" in message and "--protocol grpc" in message
    assert "\n" not in message
