"""report.md and the plots, rendered from a stored report.json of a real run of the bundled example.

Nothing here measures anything: the fixture's numbers are whatever that run measured, and every
expectation is derived from the fixture itself.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from optimizer.cli import main
from optimizer.records.tune_result import TuneResult
from optimizer.report.markdown import render_markdown, validation_section, write_report_files
from optimizer.report.plots import latency_figure, plot_data, throughput_figure
from tests.conftest import FIXTURES

REPORT = FIXTURES / "report_cnn.json"


def _doc() -> dict:
    return json.loads(REPORT.read_text())


def _result(doc: dict | None = None) -> TuneResult:
    return TuneResult.from_json((doc or _doc())["result"])


def _table_rows(md: str, header_start: str) -> dict[str, list[str]]:
    """Rows of the Markdown table whose header starts with `header_start`, keyed by their first cell."""
    lines = md.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(f"| {header_start} |"))
    width = lines[start].count(" | ") + 1
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        assert len(cells) == width, f"row breaks the table: {line}"
        rows[cells[0]] = cells
    return rows


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", cell)]


def test_fixture_is_a_real_run_of_the_bundled_example():
    result = _result()
    assert result.model_name == "cnn" and result.source["spec"] == "optimizer.examples.cnn:build"
    assert result.selected and result.eager is not None
    assert all(c.decision and c.decision.profiles for c in [result.eager, *result.candidates] if c.passed)


def test_candidate_table_has_every_candidate_with_errors_and_latencies():
    doc = _doc()
    result = _result(doc)
    md = render_markdown(result, doc["settings"], doc["published"])
    rows = _table_rows(md, "candidate")
    assert len(rows) == len(result.candidates) + 1  # eager is a row too
    for cand in [result.eager, *result.candidates]:
        key = next(k for k in rows if cand.name in k)
        row = rows[key]
        assert row[1] == cand.status
        if cand is result.eager:
            assert "baseline" in key
        if cand.name == result.selected:
            assert key == f"**{cand.name}** (selected)"
        assert _numbers(row[3]) == [pytest.approx(cand.correctness.max_abs, rel=0.06, abs=1e-12)]
        assert _numbers(row[4]) == [pytest.approx(cand.correctness.max_rel, rel=0.06, abs=1e-12)]
        one, best = cand.decision.profile_at(1), cand.decision.best
        assert _numbers(row[5]) == pytest.approx([one.p50_ms, one.p95_ms, one.p99_ms], rel=0.01, abs=0.01)
        assert row[6] == str(best.batch_size)
        assert _numbers(row[7]) == [pytest.approx(best.throughput, abs=0.06)]
        assert _numbers(row[8]) == pytest.approx([best.p50_ms, best.p95_ms, best.p99_ms], rel=0.01, abs=0.01)
        assert row[9] == f"{cand.decision.max_batch_size} ({cand.decision.decided_by})"


def test_report_says_why_the_winner_won_and_how_the_max_batch_was_decided():
    doc = _doc()
    result = _result(doc)
    doc["result"]["warnings"] = ["eager PyTorch was faster than every deployable candidate"]
    md = render_markdown(TuneResult.from_json(doc["result"]), doc["settings"], doc["published"])
    chosen = result.selected_candidate
    assert md.startswith(f"# cnn: {result.selected}, max_batch_size {result.max_batch_size}\n")
    assert f"## Why {result.selected}" in md
    assert result.selection_reason in md
    assert "- Warning: eager PyTorch was faster than every deployable candidate" in md
    assert f"## Max batch size: {result.max_batch_size}" in md
    assert f"Decided by **{chosen.decision.decided_by}**" in md
    assert chosen.decision.explanation in md
    assert f"knee at batch {chosen.decision.knee}" in md and f"Throughput peak at batch {chosen.decision.peak}" in md
    assert chosen.ceiling_estimate is not None  # the stored run's winner never reached its capacity ceiling: the estimate is shown
    assert f"estimated at about batch {chosen.ceiling_estimate}" in md
    measured = _table_rows(md, "batch")
    assert f"{result.max_batch_size} (published max)" in measured
    assert len(measured) == len(chosen.decision.profiles)
    assert doc["published"]["model_dir"] in md
    assert "## Validation" not in md  # validation did not run


def test_failed_candidate_keeps_its_reason_and_the_table_intact():
    doc = _doc()
    failed = next(c for c in doc["result"]["candidates"] if c["name"] != doc["result"]["selected"])
    failed.update(status="failed", stage="correctness", decision=None,
                  reason="rejected: output 'output__0' differs | max abs error 0.31 (atol 0.0001)")
    failed["correctness"]["max_abs"] = 0.31
    md = render_markdown(TuneResult.from_json(doc["result"]), doc["settings"], doc["published"])
    row = _table_rows(md, "candidate")[failed["name"]]
    assert row[1] == "failed"
    assert row[2] == "rejected: output 'output__0' differs \\| max abs error 0.31 (atol 0.0001)"
    assert row[5:] == ["", "", "", "", ""]


def test_memory_limit_shows_the_ceiling_and_the_failing_size():
    doc = _doc()
    chosen = next(c for c in doc["result"]["candidates"] if c["name"] == doc["result"]["selected"])
    largest = max(p["batch_size"] for p in chosen["decision"]["profiles"])
    chosen["decision"].update(decided_by="memory", ceiling=largest, first_failure=largest + 1,
                              failure=f"batch {largest + 1}: MemoryError: std::bad_alloc")
    md = render_markdown(TuneResult.from_json(doc["result"]), doc["settings"], doc["published"])
    assert "Decided by **memory**: an allocation failed above this size." in md
    assert f"batch {largest} is the largest that fit; batch {largest + 1} did not (batch {largest + 1}: MemoryError: std::bad_alloc)" in md


def test_a_run_where_nothing_passed_still_renders():
    doc = _doc()
    for c in doc["result"]["candidates"]:
        c.update(status="failed", stage="build", reason="build failed: RuntimeError: unsupported operator", decision=None)
    doc["result"].update(selected=None, max_batch_size=0, selection_reason="no candidate passed")
    md = render_markdown(TuneResult.from_json(doc["result"]), doc["settings"], None)
    assert md.startswith("# cnn: no candidate can be published")
    assert "Nothing was published" in md and "## Max batch size" not in md
    assert md.count("build failed: RuntimeError: unsupported operator") == len(doc["result"]["candidates"])


def _validation(**overrides):
    """A validation.json as optimizer/triton/measure/validation/record.py writes it (the real record, not a lookalike)."""
    from optimizer.triton.runtime.perf_analyzer import PerfRow
    from optimizer.triton.measure.validation import AnswerCheck, ValidationRecord

    rows = [PerfRow(1, 80.0, 12.0, 13.0, 14.5, 15.0, inference_count=400, execution_count=400),
            PerfRow(4, 150.0, 30.0, 35.0, 41.0, 50.2, inference_count=900, execution_count=300)]
    record = ValidationRecord("cnn", "/repo", "local tritonserver 2.51.0", "onnxruntime_onnx", "onnxruntime", status="passed",
                              served_by="stand-in backend (optimizer/triton/runtime/standin_backends/onnxruntime)", stand_in=True, loaded=True,
                              answers=[AnswerCheck("http", True, max_abs=3e-7, max_rel=1e-6), AnswerCheck("grpc", True, max_abs=3e-7, max_rel=1e-6)],
                              oversize={"refused": True}, perf={"rows": [asdict(r) for r in rows]}, server_batch=2.5,
                              predicted_throughput=120.0, throughput_ratio=1.25)
    doc = record.to_json()
    doc.update(overrides)
    return doc


def test_validation_numbers_stand_beside_the_prediction():
    text = validation_section(_validation())
    assert "Result: **passed**" in text
    assert "Loaded in tritonserver: yes by stand-in backend" in text
    assert "Answers over http: correct (max abs 3e-07" in text and "Answers over grpc: correct" in text
    assert "A batch above max_batch_size: refused." in text
    assert "Predicted by tuning: 120.0 infer/s; best served / predicted: 1.25." in text
    rows = _table_rows(text, "concurrency")
    assert rows["1"] == ["1", "80.0", "14.50", "15.00", "1.00", "0.67x"]
    assert rows["4"] == ["4", "150.0", "41.00", "50.20", "3.00", "1.25x"]
    failed = validation_section(_validation(status="failed", reason="model 'cnn' failed to load: unknown platform", loaded=False,
                                            answers=[], perf=None))
    assert "Loaded in tritonserver: no." in failed and "unknown platform" in failed


def test_plot_data_has_one_series_per_candidate_and_the_published_point():
    result = _result()
    data = plot_data(result)
    names = [s.name for s in data.series]
    assert names == [result.eager.name, *[c.name for c in result.candidates if c.decision and c.decision.profiles]]
    assert [s.baseline for s in data.series] == [True] + [False] * (len(names) - 1)
    chosen = result.selected_candidate
    at_max = chosen.decision.profile_at(result.max_batch_size)
    assert (data.chosen.candidate, data.chosen.batch_size) == (result.selected, result.max_batch_size)
    assert data.chosen.throughput == at_max.throughput and data.chosen.latency_ms == at_max.p95_ms


def test_figures_draw_each_candidate_and_mark_the_chosen_point():
    result = _result()
    data = plot_data(result)
    for fig, value in ((throughput_figure(data), data.chosen.throughput), (latency_figure(data), data.chosen.latency_ms)):
        ax = fig.axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        eager = lines[f"{result.eager.name} (baseline)"]
        assert eager.get_linestyle() == "--"
        assert list(eager.get_xdata()) == [p.batch_size for p in result.eager.decision.profiles]
        measured = [c.name for c in result.candidates if c.passed]
        assert measured and all(lines[name].get_linestyle() == "-" for name in measured)
        star = lines[f"published: {result.selected}, max batch {result.max_batch_size}"]
        assert star.get_marker() == "*"
        assert list(star.get_xdata()) == [result.max_batch_size] and list(star.get_ydata()) == [value]
        assert ax.get_xscale() == "log"


def test_latency_plot_draws_the_budget():
    doc = _doc()
    doc["result"]["latency_budget_ms"] = 50.0
    fig = latency_figure(plot_data(TuneResult.from_json(doc["result"])))
    budget = [l for l in fig.axes[0].get_lines() if l.get_label() == "budget 50 ms"]
    assert budget and list(budget[0].get_ydata()) == [50.0, 50.0]


def test_files_are_written_beside_report_json_and_include_validation(tmp_path: Path):
    report = tmp_path / "report.json"
    shutil.copy(REPORT, report)
    (tmp_path / "validation.json").write_text(json.dumps({"loaded": True, "perf": {"rows": [{"concurrency": 2, "throughput": 99.0, "p95_ms": 20.0}]}}))
    rendered = write_report_files(report)
    assert rendered.markdown == tmp_path / "report.md"
    md = rendered.markdown.read_text()
    for kind, path in rendered.plots.items():
        assert path.parent == tmp_path and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({path.name})" in md
    assert set(rendered.plots) == {"throughput", "latency"}
    assert "## Validation in Triton" in md and "| 2 | 99.0 | 20.00 |" in md.replace("  ", " ")


def test_report_command_re_renders_into_another_folder(tmp_path: Path):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["report", str(REPORT), "--output-dir", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["latency.png", "report.md", "throughput.png"]
    assert r.stdout.splitlines() == [f"wrote {out / n}" for n in ("report.md", "throughput.png", "latency.png")]


def test_report_command_on_a_missing_file_is_one_line_exit_2(tmp_path: Path):
    r = CliRunner().invoke(main, ["report", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "does not exist" in r.output and not (tmp_path / "report.md").exists()


def test_a_rejected_candidate_shows_by_how_much_it_missed():
    from optimizer.records.correctness import CorrectnessReport
    from optimizer.task.correctness import compare_outputs

    doc = _doc()
    result = _result(doc)
    rejected = next(c for c in result.candidates if c.name != result.selected)
    rejected.status, rejected.stage, rejected.reason = "failed", "correctness", "rejected: output 'output__0' differs"
    rejected.correctness = CorrectnessReport([compare_outputs("batch=1", ["output__0"], ["float32"], [np.ones(3) * 1.5], [np.ones(3)])])
    assert not rejected.correctness  # falsy when it failed: the table must not hide its numbers for that
    row = _table_rows(render_markdown(result, doc["settings"], doc["published"]), "candidate")[rejected.name]
    assert row[3] == "5.0e-01" and row[4] == "5.0e-01"
