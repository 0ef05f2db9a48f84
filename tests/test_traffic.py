"""The traffic a model is tuned for: where it comes from, what it holds, bad traffic files, and how it is scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from optimizer.errors import TrafficError
from optimizer.model.dtypes import dtype_from_name
from optimizer.model.signature import Axis, Signature, TensorSpec
from optimizer.model.traffic import Traffic, generate_traffic, load_traffic, split_rows, traffic_for
from optimizer.records.served_search import LoadLevel
from optimizer.settings import ExportSettings
from optimizer.triton.runtime.perf_analyzer_input import write_input_data
from optimizer.triton.measure.served_search.objective import Objective, ladder, load_score, robust_ratios
from tests.conftest import run_cli

TEXT = Signature(inputs=(TensorSpec("input_ids", dtype_from_name("int64"), (Axis(1, 128),), (0, 999)),
                         TensorSpec("attention_mask", dtype_from_name("int64"), (Axis(1, 128),), (1, 1))))
IMAGE = Signature(inputs=(TensorSpec("image", dtype_from_name("float32"), (Axis(3, 3), Axis(8, 8))),))


def _entry(length: int, ids: list | None = None) -> dict:
    ids = ids if ids is not None else list(range(length))
    return {"input_ids": {"content": ids, "shape": [length]}, "attention_mask": {"content": [1] * length, "shape": [length]}}


def _write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "traffic.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


# -- where it comes from --------------------------------------------------------------------------------------------


def test_generated_traffic_spreads_every_dynamic_axis_over_its_range_never_only_its_maximum():
    traffic = generate_traffic(TEXT)
    sizes = [s[0] for s in traffic.sizes(TEXT)]
    assert len(traffic.requests) == 64 and traffic.source == "generated" and "log-uniform" in traffic.origin
    assert min(sizes) < 8 and max(sizes) > 64 and len(set(sizes)) > 10  # the whole range, many lengths
    assert sorted(sizes)[len(sizes) // 2] < 32  # log-uniform: half the requests are short
    assert all(1 <= s <= 128 for s in sizes)
    assert all(r["input_ids"].shape == r["attention_mask"].shape for r in traffic.requests)  # a shared length stays shared
    assert all(r["input_ids"].shape[0] == 1 for r in traffic.requests)  # batch-1 requests
    assert generate_traffic(TEXT).sizes(TEXT) == traffic.sizes(TEXT)  # the same every run
    static = generate_traffic(IMAGE)
    assert len(static.histogram(IMAGE)) == 1 and "no dynamic axis" in static.origin


def test_samples_are_the_traffic_one_request_per_recorded_row():
    feeds = [{"input_ids": np.zeros((3, 5), np.int64), "attention_mask": np.ones((3, 5), np.int64)},
             {"input_ids": np.zeros((1, 9), np.int64), "attention_mask": np.ones((1, 9), np.int64)}]
    traffic = traffic_for(TEXT, None, feeds, "s.npz")
    assert traffic.source == "samples" and traffic.origin == "--samples s.npz"
    assert [s[0] for s in traffic.sizes(TEXT)] == [5, 5, 5, 9]
    assert traffic.histogram(TEXT) == [("input_ids 5, attention_mask 5", 3), ("input_ids 9, attention_mask 9", 1)]
    assert len(split_rows(feeds, TEXT)) == 4


def test_a_traffic_file_round_trips_through_perf_analyzers_input_data_format(tmp_path: Path):
    traffic = generate_traffic(TEXT, requests=20)
    path = write_input_data(tmp_path / "t.json", list(traffic.requests), batching=True)
    again = load_traffic(path, TEXT)
    assert again.source == "file" and len(again.requests) == 20
    assert all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for a, b in zip(traffic.requests, again.requests) for k in a)
    listed = load_traffic(_write(tmp_path, {"data": [_entry(3), _entry(7, [[1, 2, 3, 4, 5, 6, 7]])]}), TEXT)  # nested lists too
    assert [s[0] for s in listed.sizes(TEXT)] == [3, 7]
    fixed = load_traffic(_write(tmp_path, {"data": [{"image": list(np.arange(24.0))}]}), IMAGE)  # a static shape needs no "shape"
    assert fixed.requests[0]["image"].shape == (1, 3, 8)


def test_the_representative_requests_are_real_ones_at_the_median_and_p90_of_each_dynamic_axis(tmp_path: Path):
    lengths = [4] * 51 + [16] * 29 + [64] * 15 + [100] * 5
    traffic = load_traffic(_write(tmp_path, {"data": [_entry(n) for n in lengths]}), TEXT)
    assert traffic.representative(TEXT, 0.5)["input_ids"].shape == (1, 4)
    assert traffic.representative(TEXT, 0.9)["input_ids"].shape == (1, 64)
    assert traffic.largest(TEXT)["input_ids"].shape == (1, 100)
    summary = traffic.summary(TEXT)
    assert summary.shapes == {"median": {"input_ids[1]": 4, "attention_mask[1]": 4}, "p90": {"input_ids[1]": 64, "attention_mask[1]": 64},
                              "max": {"input_ids[1]": 100, "attention_mask[1]": 100}}
    assert summary.histogram[0] == ["input_ids 4, attention_mask 4", 51] and summary.requests == 100
    sent = traffic.sent(20)
    assert len(sent) == 20 and sorted(r["input_ids"].shape[1] for r in sent).count(4) in (10, 11)  # every shape keeps its share


def test_padding_to_buckets_rounds_each_dynamic_axis_up_to_the_next_edge_within_its_range(tmp_path: Path):
    traffic = load_traffic(_write(tmp_path, {"data": [_entry(n) for n in (3, 5, 17, 100, 128)]}), TEXT)
    edges = traffic.bucket_edges(TEXT)
    assert edges == [4, 8, 16, 32, 64, 128]
    padded = traffic.padded(TEXT, edges)
    assert [r["input_ids"].shape[1] for r in padded.requests] == [4, 8, 32, 128, 128]
    assert padded.requests[0]["attention_mask"].tolist() == [[1, 1, 1, 0]]  # zeros after the real tokens
    assert padded.requests[0]["input_ids"][0, :3].tolist() == [0, 1, 2]


# -- bad traffic files ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc,words", [
    ("{not json", "is not JSON (line 1"),
    ({"data": []}, "has no requests"),
    ({"rows": [1]}, "has no requests"),
    ({"data": [_entry(3), {**_entry(3), "token_type_ids": {"content": [0, 0, 0], "shape": [3]}}]}, "entry 1 names input 'token_type_ids', which the model does not have"),
    ({"data": [{"input_ids": {"content": [1], "shape": [1]}}]}, "entry 0 misses input 'attention_mask'"),
    ({"data": [_entry(2, [1.5, 2])]}, "entry 0 input 'input_ids': value 1.5 is not of dtype int64"),
    ({"data": [_entry(2, ["a", "b"])]}, "value 'a' is not of dtype int64"),
    ({"data": [_entry(3, [1, 2])]}, "entry 0 input 'input_ids': 2 values do not fill shape [3]"),
    ({"data": [_entry(1), _entry(200)]}, "entry 1 input 'input_ids': dim 0 is 200, outside the model's 1-128"),
    ({"data": [{"input_ids": {"content": [1, 2], "shape": [1, 2]}, "attention_mask": {"content": [1], "shape": [1]}}]}, "shape [1, 2] has 2 dims"),
    ({"data": [{"input_ids": [1, 2], "attention_mask": [1, 1]}]}, "has no \"shape\""),
    ({"data": [{"input_ids": {"content": {"b64": "AAAA"}, "shape": [1]}, "attention_mask": {"content": [1], "shape": [1]}}]}, "3 bytes of b64 content"),
    ({"data": [[_entry(1)]]}, "is a list (a sequence stream)"),
])
def test_a_bad_traffic_file_is_one_line_naming_the_entry_and_the_fix(tmp_path: Path, doc, words):
    with pytest.raises(TrafficError) as err:
        load_traffic(_write(tmp_path, doc), TEXT)
    message = str(err.value)
    assert words in message and "\n" not in message and "--traffic" in message


def test_a_missing_traffic_file_is_refused(tmp_path: Path):
    with pytest.raises(TrafficError, match="does not exist"):
        load_traffic(tmp_path / "nope.json", TEXT)


@pytest.mark.slow
def test_export_refuses_a_bad_traffic_file_with_exit_2_and_writes_nothing(in_tmp: Path):
    _write(in_tmp, {"data": [{"x": {"content": [1.0] * 16, "shape": [16]}}, {"x": {"content": [1.0] * 15, "shape": [16]}}]})
    r = run_cli("export", "tests.fixtures.models:mlp", "--traffic", "traffic.json", "--repository", "repo", cwd=in_tmp)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "entry 1 input 'x': 15 values do not fill shape [16]" in last, r.stderr
    assert "Traceback" not in r.stderr and last.startswith("error:"), last
    assert not (in_tmp / "repo").exists() and not (in_tmp / "aitune-reports").exists()


# -- a trace: timestamps ----------------------------------------------------------------------------------------------


def _trace(stamps: list) -> dict:
    return {"data": [{**_entry(3 + k % 4), "timestamp": t} for k, t in enumerate(stamps)]}


def test_a_traffic_file_with_timestamps_is_a_trace_with_its_rate_duration_burstiness_and_peak(tmp_path: Path):
    even = load_traffic(_write(tmp_path, _trace([10.0 * k for k in range(201)])), TEXT)  # 100/s for 2 s, evenly spaced
    assert even.timestamps_ms == tuple(10.0 * k for k in range(201)) and len(even.requests) == 201
    s = even.summary(TEXT)
    assert (s.rate_per_s, s.duration_s, s.burstiness) == (100.0, 2.0, 0.0) and s.peak_rate_per_s == pytest.approx(100.0, rel=0.06)
    rng = np.random.default_rng(0)
    poisson = np.cumsum(rng.exponential(10.0, 2000))  # Poisson arrivals at 100/s for about 20 s
    p = load_traffic(_write(tmp_path, _trace([round(float(t), 3) for t in poisson])), TEXT).summary(TEXT)
    assert p.burstiness == pytest.approx(1.0, abs=0.1) and p.rate_per_s == pytest.approx(100, rel=0.1) and p.peak_window_s == 1.0
    assert p.peak_rate_per_s > 1.15 * p.rate_per_s  # a second of Poisson arrivals holds more than the mean somewhere
    from optimizer.report.markdown import traffic_section

    assert "Arrivals: a trace of 2 s at 100 requests/s on average, burstiness 0.00" in traffic_section(s.to_json())
    assert "Arrivals" not in traffic_section(load_traffic(_write(tmp_path, {"data": [_entry(3)]}), TEXT).summary(TEXT).to_json())
    again = type(s).from_json(s.to_json())
    assert again == s and "burstiness 0.00" in again.describe_trace() and "100 requests/s on average" in again.describe_trace()
    plain = load_traffic(_write(tmp_path, {"data": [_entry(3)]}), TEXT)
    assert plain.timestamps_ms is None and plain.summary(TEXT).rate_per_s is None and plain.summary(TEXT).describe_trace() == ""


@pytest.mark.parametrize("stamps,words", [
    ([0, 5, 3], 'entry 2: "timestamp" 3 is before entry 1\'s 5; list the requests in the order they arrived'),
    ([-1, 5], 'entry 0: "timestamp" -1 is negative'),
    ([0, "5"], "entry 1: \"timestamp\" '5' is not a number"),
    ([0, True], 'entry 1: "timestamp" True is not a number'),
    ([0, None], 'entry 1: "timestamp" None is not a number'),
    ([4, 4], "spans no time"),
])
def test_bad_timestamps_are_one_line_naming_the_entry_and_the_fix(tmp_path: Path, stamps, words):
    with pytest.raises(TrafficError) as err:
        load_traffic(_write(tmp_path, _trace(stamps)), TEXT)
    assert words in str(err.value) and "\n" not in str(err.value) and "--traffic" in str(err.value)


def test_timestamps_on_some_entries_only_are_refused(tmp_path: Path):
    doc = _trace([0, 1, 2])
    del doc["data"][1]["timestamp"]
    with pytest.raises(TrafficError, match=r'entry 1 has no "timestamp" while 2 of the 3 entries have one; give every entry'):
        load_traffic(_write(tmp_path, doc), TEXT)


def test_a_trace_is_saved_with_the_runs_samples_read_back_from_the_report_and_never_sent_as_an_input(tmp_path: Path):
    from optimizer.model.traffic import save_traffic, timestamps_path
    from optimizer.records.reference_set import ReferenceSet
    from optimizer.records.tune_result import TuneResult
    from optimizer.triton.runtime.perf_analyzer_input import trace_of, traffic_requests

    traffic = load_traffic(_write(tmp_path, _trace([0, 2.5, 2.5, 40])), TEXT)
    save_traffic(tmp_path / "traffic.npz", traffic)
    result = TuneResult.__new__(TuneResult)
    result.reference = ReferenceSet("f", "o", [], "p", str(tmp_path / "traffic.npz"))
    result.signature, result.traffic = TEXT.to_json(), traffic.summary(TEXT).to_json()
    feeds, stamps = trace_of(result)
    assert stamps == [0, 2.5, 2.5, 40] and [f["input_ids"].shape for f in feeds] == [(1, 3), (1, 4), (1, 5), (1, 6)]  # the trace's order
    assert len(traffic_requests(result)[0]) == 4  # the closed-loop mix reads the same .npz as before
    path = write_input_data(tmp_path / "pa.json", [{**f, "timestamp": t} for f, t in zip(feeds, stamps)], batching=True)
    assert all("timestamp" not in e for e in json.loads(path.read_text())["data"])  # perf_analyzer 2.51 refuses it
    save_traffic(tmp_path / "traffic.npz", Traffic(traffic.requests, "file", "t"))  # re-saved without timestamps: not a trace
    assert not timestamps_path(tmp_path / "traffic.npz").exists() and trace_of(result) is None


# -- aitune-export traffic FILE ----------------------------------------------------------------------------------------


def _traffic_cli(*args: str):
    from click.testing import CliRunner

    from optimizer.cli import main

    return CliRunner().invoke(main, ["traffic", *args])


def test_the_traffic_command_summarises_a_trace_and_gives_the_input_flags_its_shapes_need(tmp_path: Path):
    path = _write(tmp_path, _trace([0, 10, 20, 30, 40]))  # lengths 3, 4, 5, 6, 3
    r = _traffic_cli(str(path))
    assert r.exit_code == 0, r.output
    assert "5 requests, 4 shapes; checked against the file's own structure" in r.output
    assert "a trace of 0.04 s at 100 requests/s on average, burstiness 0.00" in r.output
    assert "input input_ids: int64, dims 3-6" in r.output and "(--input input_ids:int64:3-6)" in r.output
    assert "input_ids 3, attention_mask 3" in r.output and "40%" in r.output
    doc = json.loads(_traffic_cli(str(path), "--json").output)
    assert doc["summary"]["requests"] == 5 and doc["summary"]["rate_per_s"] == 100.0 and doc["summary"]["burstiness"] == 0.0
    assert [i["input_flag"] for i in doc["inputs"]] == ["--input input_ids:int64:3-6", "--input attention_mask:int64:3-6"]
    plain = _traffic_cli(str(_write(tmp_path, {"data": [_entry(3)]})), "--input", "input_ids:int64:1-8", "--input", "attention_mask:int64:1-8")
    assert plain.exit_code == 0 and "no timestamps" in plain.output and "checked against --input input_ids:int64:1-8" in plain.output


@pytest.mark.parametrize("doc,args,words", [
    ({"data": [_entry(3), _entry(9)]}, ("--input", "input_ids:int64:1-8", "--input", "attention_mask:int64:1-8"), "entry 1 input 'input_ids': dim 0 is 9, outside the model's 1-8"),
    ({"data": [_entry(3), {"input_ids": {"content": [1], "shape": [1]}}]}, (), "entry 1 misses input 'attention_mask'"),
    ({"data": [_entry(3), {"input_ids": {"content": [1, 2], "shape": [1, 2]}, "attention_mask": {"content": [1], "shape": [1]}}]}, (), "has shapes of 1 and 2 dims"),
    (_trace([0, 5, 3]), (), 'entry 2: "timestamp" 3 is before entry 1'),
    ("[1, 2", (), "is not JSON"),
])
def test_the_traffic_command_refuses_a_bad_file_with_one_line_and_exit_2(tmp_path: Path, doc, args, words):
    r = _traffic_cli(str(_write(tmp_path, doc)), *args)
    assert r.exit_code == 2 and words in r.output and r.output.count("error:") == 1, r.output


def test_the_traffic_command_checks_a_file_against_a_models_own_signature(tmp_path: Path):
    ok = _write(tmp_path, {"data": [{"x": {"content": [0.5] * 16, "shape": [16]}, "timestamp": 0}, {"x": [1.0] * 16, "timestamp": 4}]})
    r = _traffic_cli(str(ok), "tests.fixtures.models:mlp")
    assert r.exit_code == 0, r.output
    assert "checked against MODEL tests.fixtures.models:mlp" in r.output and "input x: float32, dims 16" in r.output
    bad = _write(tmp_path, {"data": [{"x": {"content": [0.5] * 8, "shape": [8]}}]})
    r = _traffic_cli(str(bad), "tests.fixtures.models:mlp")
    assert r.exit_code == 2 and "entry 0 input 'x': dim 0 is 8, outside the model's 16" in r.output, r.output


# -- the load in the user's terms -------------------------------------------------------------------------------------


def test_concurrency_takes_one_load_or_a_range():
    assert ExportSettings(concurrency=16).load() == (16, None)
    assert ExportSettings(concurrency="16").load() == (16, None)
    assert ExportSettings(concurrency="1:64").load() == (None, (1, 64))
    assert ExportSettings(concurrency="8:8").load() == (8, None)
    assert ExportSettings().load() == (None, None)
    for bad, words in (("0", "must be from 1"), ("64:1", "LOW is above HIGH"), ("a:b", "is not N or LOW:HIGH"), ("1:9999", "must be from 1")):
        with pytest.raises(Exception, match=words):
            ExportSettings(concurrency=bad).load()


def test_a_range_measures_every_load_of_its_ladder_and_no_load_starts_at_a_lone_client():
    assert ladder() == [1, 4, 16, 64, 256] and ladder(2, 40) == [2, 8, 32, 40]
    span = Objective(load_range=(2, 40))
    assert span.kind == "range" and span.robust and span.first_level(64) == 2
    curve = [LoadLevel(2, 100.0, 1, 1, 1, 1)]
    while (c := span.next_level(curve)) is not None:
        curve.append(LoadLevel(c, 100.0, 1, 1, 1, 1))  # flat: a range still measures every load it names
    assert [lv.concurrency for lv in curve] == [2, 8, 32, 40]
    anyload = Objective()
    assert anyload.kind == "any-load" and anyload.first_level(64) == 1 and "1, 4, 16, 64" in anyload.describe()


def _lv(c: int, throughput: float, p95: float) -> LoadLevel:
    return LoadLevel(c, throughput, p95 / 2, p95, p95, p95)


def test_a_lone_requests_wait_counts_in_the_score_beside_throughput():
    """A fill delay that makes a lone client wait 20 ms scores low at concurrency 1, whatever it gains at 16."""
    delay = [_lv(1, 50.0, 21.0), _lv(4, 300.0, 14.0), _lv(16, 900.0, 20.0)]
    none = [_lv(1, 300.0, 3.5), _lv(4, 600.0, 7.0), _lv(16, 820.0, 22.0)]
    ratios = robust_ratios({"delay": delay, "none": none})
    assert ratios["delay"][1] == 1 and ratios["delay"][0] < 0.2
    assert ratios["none"][0] > 0.85
    assert load_score(100.0, 10.0, 100.0, 10.0) == pytest.approx(1.0)
    assert load_score(100.0, 40.0, 100.0, 10.0) == pytest.approx(0.5)  # the same throughput, 4x the p95: sqrt(1/4)
    assert load_score(50.0, 10.0, 100.0, 10.0) == pytest.approx(0.5 ** 0.5)


def test_past_its_last_level_a_curve_keeps_its_throughput_and_its_latency_grows_with_the_load():
    stopped = [_lv(1, 100.0, 10.0), _lv(4, 400.0, 10.0)]
    climbed = [_lv(1, 100.0, 10.0), _lv(4, 400.0, 10.0), _lv(16, 400.0, 40.0)]
    ratios = robust_ratios({"stopped": stopped, "climbed": climbed})
    assert ratios["stopped"][0] == pytest.approx(1.0)  # at 16 its 400/s and 40 ms equal the one that climbed


# -- padded answers ---------------------------------------------------------------------------------------------------


def _served(outputs: list[str]) -> dict:
    return {"output": [{"name": n, "data_type": "TYPE_FP32"} for n in outputs], "input": [], "max_batch_size": 8}


def test_padded_answers_agree_only_when_the_outputs_cut_back_to_the_real_length_are_the_same(monkeypatch):
    from optimizer.triton.measure import answers
    from optimizer.triton.measure import client

    def masked(feed):  # per-token features and their masked mean: padding changes nothing
        x = feed["input_ids"].astype(np.float32)
        m = feed["attention_mask"].astype(np.float32)
        return [np.tanh(x)[..., None].repeat(2, -1), (np.tanh(x) * m).sum(1, keepdims=True) / m.sum(1, keepdims=True)]

    def unmasked(feed):  # a plain mean over every position: padding moves it
        x = feed["input_ids"].astype(np.float32)
        return [np.tanh(x)[..., None].repeat(2, -1), np.tanh(x).mean(1, keepdims=True)]

    traffic = Traffic(tuple({"input_ids": np.arange(1, n + 1)[None].astype(np.int64), "attention_mask": np.ones((1, n), np.int64)}
                            for n in (3, 5)), "file", "t")
    pairs = list(zip(traffic.requests, traffic.padded(TEXT, [4, 8]).requests))
    for model, agree in ((masked, True), (unmasked, False)):
        monkeypatch.setattr(client, "infer", lambda c, name, served, feed, model=model: model(feed))
        said = answers.answers_agree(None, "m", _served(["hidden", "pooled"]), pairs, None, None)
        assert (said == "") is agree, said
        if not agree:
            assert "output 'pooled' of request 0 differs padded" in said
    monkeypatch.setattr(client, "infer", lambda c, name, served, feed: unmasked(feed))
    assert "cosine" in answers.answers_agree(None, "m", _served(["hidden", "pooled"]), pairs, None, 0.9999)


# -- for real -----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_export_for_a_traffic_file_measures_it_from_one_client_up_and_checks_padding(in_tmp: Path):
    """A masked encoder (padding changes no answer) tuned for a traffic file over the range 1:4: profiling at the
    traffic's shapes, every variant measured at the loads of the range with the traffic's requests, and the padding
    trial's answer check passed (whether padding is advised is the measurements' call, and the report says why)."""
    rng = np.random.default_rng(3)
    lengths = [int(min(32, max(1, round(x)))) for x in rng.lognormal(np.log(6), 0.8, 24)]
    _write(in_tmp, {"data": [{"input_ids": {"content": rng.integers(0, 50, n).tolist(), "shape": [n]},
                              "attention_mask": {"content": [1] * n, "shape": [n]}} for n in lengths]})
    r = run_cli("export", "tests.fixtures.models:masked_encoder", "--input", "input_ids:int64:1-32", "--input", "attention_mask:int64:1-32",
                "--value-range", "input_ids:0:49", "--value-range", "attention_mask:1:1", "--traffic", "traffic.json",
                "--backend", "onnxruntime", "--eager-gate", "disabled", "--max-batch-size", "4", "--concurrency", "1:4",
                "--serve-search-seconds", "30", "--repository", "repo", cwd=in_tmp, serve_search=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(next(in_tmp.glob("aitune-reports/*/report.json")).read_text())
    traffic = report["result"]["traffic"] if "result" in report else report["traffic"]
    assert traffic["source"] == "file" and traffic["requests"] == 24 and sum(c for _, c in traffic["histogram"]) == 24
    assert traffic["shapes"]["max"]["input_ids[1]"] == max(lengths)
    search = report["published"]["served_search"]
    assert search["status"] == "searched" and search["objective"] == "range", search.get("reason")
    measured = [v for v in search["variants"] if v["status"] == "measured" and v.get("traffic", "") == ""]
    assert measured and all({lv["concurrency"] for lv in v["curve"]} <= {1, 4} for v in measured)
    assert any(lv["concurrency"] == 1 for v in measured for lv in v["curve"])  # a lone client counts
    padding = search["client_padding"]
    assert padding["answers_agree"] and padding["edges"][-1] == 32 and padding["why"], padding
    sent = json.loads(next(in_tmp.glob("aitune-reports/*/perf_analyzer_input.json")).read_text())["data"]
    shapes = {tuple(e["input_ids"]["shape"]) for e in sent}
    assert len(shapes) > 1 and all(e["input_ids"]["shape"] == e["attention_mask"]["shape"] for e in sent)
    md = next(in_tmp.glob("aitune-reports/*/report.md")).read_text()
    assert "## Traffic" in md and "--traffic traffic.json" in md and ("Clients pad" in md or "No client padding is advised" in md)
