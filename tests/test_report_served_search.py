"""report.md's served-search section and its plot, from a ServedSearch record as report.json stores it.

No server runs: the search is built from the records and stored with `.to_json()`, the way the
pipeline writes `published.served_search`; the rest of the report is the stored run in tests/fixtures.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch, ServedVariant
from optimizer.report.markdown import write_report_files
from optimizer.report.plots import SERVED_SEARCH_FILE, served_search_figure, short_label, write_served_search_plot
from optimizer.report.served_search_section import served_search_section
from tests.conftest import FIXTURES

PNG = b"\x89PNG\r\n\x1a\n"
START = OperatingPoint(2, (2,), 249, 1, 2)
WIDE = OperatingPoint(2, (2,), 249, 2, 1)
BIG = OperatingPoint(8, (8,), 0, 2, 1)
BROKEN = OperatingPoint(16, (16,), 0, 2, 1)


def _measured(point: OperatingPoint, stage: str, curve: list[tuple[int, float, float]], batch: float | None = None) -> ServedVariant:
    """A variant with its curve (concurrency, throughput, p95) scored at its best level."""
    levels = [LoadLevel(c, tp, p95 * 0.75, p95 * 0.9, p95, p95 * 1.1, batch) for c, tp, p95 in curve]
    v = ServedVariant(point, stage, curve=levels, seconds=5.0)
    v.score_at(max(levels, key=lambda lv: lv.throughput))
    return v


def _search(stand_in: bool = True, **overrides) -> dict:
    """A searched run that published BIG over the rules' START, with one variant that failed to load."""
    variants = [
        _measured(START, "start", [(4, 455.0, 10.7)], 1.99),
        _measured(WIDE, "coarse", [(4, 430.6, 13.73), (8, 440.0, 25.0)], 1.49),
        _measured(BIG, "coarse", [(4, 480.0, 9.0), (8, 612.3, 17.67)], 5.5),
        ServedVariant(BROKEN, "coarse", status="failed", reason="the config is refused: too big", seconds=0.4),
    ]
    for v in variants:
        v.differs = v.point.differences(BIG)
    search = ServedSearch(
        status="searched", objective="max-throughput", load="the most throughput the config sustains", concurrency=8,
        concurrency_source="where the published variant reached its peak in its sweep",
        served_by="stand-in backend: Triton's python backend runs backends/onnxruntime/model.py" if stand_in else "native backend",
        stand_in=stand_in, server="local tritonserver at 127.0.0.1:1", request_mix="the profiled sample (image 3x64x64)",
        start=START, chosen=BIG, variants=variants, stopped="every variant of the coarse pass and the refinement was measured",
        seconds=16.0, budget_s=25.0, in_process_throughput=580.25, per_request_ms=0.0899, predicted_throughput=612.3,
    )
    doc = search.to_json()
    doc.update(overrides)
    return json.loads(json.dumps(doc))  # as report.json holds it: lists, not tuples


def _rows(md: str) -> list[list[str]]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| stage |"))
    width = lines[start].count(" | ") + 1
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        assert len(cells) == width, f"row breaks the table: {line}"
        rows.append(cells)
    return rows


def test_table_has_every_variant_in_order_with_its_numbers_and_its_curve_and_marks_the_published_row():
    search = _search()
    md = served_search_section(search)
    assert md.startswith("## Served search\n")
    rows = _rows(md)
    assert [r[0] for r in rows] == [v["stage"] for v in search["variants"]]
    measured = [(row, v) for row, v in zip(rows, search["variants"]) if v["throughput"] is not None]
    assert len(measured) == 3
    for row, v in measured:
        assert v["label"] in row[1] and row[3] == str(v["concurrency"])
        assert float(row[4]) == round(v["throughput"], 1)
        assert [float(c) for c in row[5:8]] == [round(v[k], 2) for k in ("p50_ms", "p95_ms", "p99_ms")]
        assert float(row[8]) == round(v["server_batch"], 2)
    assert measured[2][0][9] == "4: 480, 8: 612"  # BIG's curve: each load its sweep measured
    published = [r for r in rows if "(published)" in r[1]]
    assert len(published) == 1 and published[0][1] == f"**{BIG.label}** (published)" and published[0][2] == "published"
    assert rows[0][2] == "max_batch_size 2 (published 8), preferred [2] (published [8]), queue_delay_us 249 (published 0), instances 1 (published 2), threads 2 (published 1)"
    assert rows[3][-1] == "failed: the config is refused: too big" and rows[3][4] == ""


def test_the_sentences_name_the_load_the_backend_the_choice_and_the_prediction():
    md = served_search_section(_search())
    text = md.split("\n\n")[1]
    assert text.startswith("Chosen for the most throughput the config sustains.")
    assert "scored at concurrency 8 (where the published variant reached its peak in its sweep)" in text
    assert "the profiled sample (image 3x64x64)" in text
    assert "4 variants in 16 s" in text and "stopped: every variant of the coarse pass" in text
    assert f"Published **{BIG.label}**" in text and f"instead of the in-process rules' {START.label}" in text
    assert "612.3 infer/s served (stand-in) closed-loop at concurrency 8" in text and "580.2 samples/s in-process at the server-formed batch 5.50" in text
    assert "0.090 ms per request (stand-in)" in text
    budgeted = served_search_section(_search(latency_budget_ms=20.0))
    assert "within a p95 latency budget of 20 ms" in budgeted
    settled = served_search_section(_search(settled="A and B served within 2.0% of each other, measured A B A B at concurrency 8: A kept"))
    assert "Close call: A and B served within 2.0%" in settled


def test_the_count_is_of_configs_and_says_apart_how_many_were_measured_again():
    doc = _search()
    settle = ServedVariant(BIG, "settle", curve=[LoadLevel(8, 600.0, 17.0, 17.0, 17.0, 17.0)], seconds=0.0)
    base = ServedVariant(BIG, "base", curve=[LoadLevel(1, 100.0, 9.0, 9.0, 9.0, 9.0)], seconds=0.0)
    doc["variants"] += [settle.to_json(), base.to_json(), json.loads(json.dumps(_measured(WIDE, "refine", [(4, 300.0, 9.0)]).to_json()))]
    text = served_search_section(doc).split("\n\n")[1]
    assert "4 variants (+2 measured again) in 16 s" in text  # WIDE measured twice in the pass is one config


def test_every_served_number_is_labelled_stand_in_or_native():
    stand_in = served_search_section(_search(stand_in=True))
    assert "Served by the stand-in backend" in stand_in and "not the native backend's" in stand_in
    assert "| throughput/s (stand-in) | p50 ms (stand-in) |" in stand_in
    native = served_search_section(_search(stand_in=False))
    assert "stand-in" not in native and "| throughput/s (native) |" in native and "served (native)" in native


def test_the_rules_point_kept_says_so():
    search = _search(chosen=_search()["start"])
    md = served_search_section(search)
    assert f"Published **{START.label}**, the in-process rules' config" in md
    assert [r[1] for r in _rows(md) if "(published)" in r[1]] == [f"**{START.label}** (published)"]


def test_skipped_and_off_say_why_and_that_the_rules_stand():
    skipped = ServedSearch(status="skipped", reason="tritonserver is not installed", start=START, chosen=START).to_json()
    md = served_search_section(skipped)
    assert md == "## Served search\n\nSkipped: tritonserver is not installed; the in-process rules stand."
    off = ServedSearch(status="off", reason="--serve-search off: the in-process rules stand").to_json()
    assert served_search_section(off) == "## Served search\n\nOff: --serve-search off: the in-process rules stand."
    assert served_search_section(None) == ""
    assert write_served_search_plot(skipped, Path("/nonexistent")) is None


def test_plot_draws_one_curve_per_variant_and_marks_the_published_point(tmp_path: Path):
    search = _search()
    fig = served_search_figure(search)
    ax = fig.axes[0]
    lines = ax.get_lines()
    curves = [line for line in lines if len(line.get_xdata()) and line.get_marker() != "*"]
    assert sorted(tuple(line.get_xdata()) for line in curves) == [(4,), (4, 8), (4, 8)]  # the failed variant has no curve
    star = next(line for line in lines if line.get_marker() == "*")
    assert list(star.get_xdata()) == [8] and list(star.get_ydata()) == [612.3]  # where the published variant was scored
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"published: {short_label(BIG.to_json())}" in legend and f"rules: {short_label(START.to_json())}" in legend
    assert short_label(BIG.to_json()) == "max 8 pref[8] 2x1t d0"
    assert ax.get_title() == "served search, closed-loop: max-throughput (stand-in backend)" and ax.get_xscale() == "log"
    assert served_search_figure(_search(stand_in=False)).axes[0].get_title() == "served search, closed-loop: max-throughput"
    path = write_served_search_plot(search, tmp_path)
    assert path == tmp_path / SERVED_SEARCH_FILE and path.read_bytes()[:8] == PNG


def test_no_plot_when_nothing_was_measured(tmp_path: Path):
    search = _search()
    search["variants"] = [v for v in search["variants"] if v["status"] != "measured"]
    assert write_served_search_plot(search, tmp_path) is None and not (tmp_path / SERVED_SEARCH_FILE).exists()
    assert write_served_search_plot(None, tmp_path) is None


def test_report_md_carries_the_section_and_links_the_plot(tmp_path: Path):
    doc = json.loads((FIXTURES / "report_cnn.json").read_text())
    doc["published"]["served_search"] = _search()
    report = tmp_path / "report.json"
    report.write_text(json.dumps(doc))
    (tmp_path / "validation.json").write_text(json.dumps({"loaded": True}))
    rendered = write_report_files(report)
    md = rendered.markdown.read_text()
    assert rendered.plots["served_search"] == tmp_path / SERVED_SEARCH_FILE
    assert rendered.plots["served_search"].read_bytes()[:8] == PNG
    assert f"]({SERVED_SEARCH_FILE})" in md
    assert md.index("## Max batch size") < md.index("## Served search") < md.index("## Validation in Triton")
    assert f"**{BIG.label}** (published)" in md


def test_the_heading_names_the_published_max_batch_when_the_search_moved_it(tmp_path: Path):
    doc = json.loads((FIXTURES / "report_cnn.json").read_text())
    ruled = doc["result"]["max_batch_size"]
    doc["published"]["served_search"] = _search()
    doc["published"]["config"] = {"max_batch_size": ruled * 2}  # what the served search published
    report = tmp_path / "report.json"
    report.write_text(json.dumps(doc))
    md = write_report_files(report).markdown.read_text()
    assert md.splitlines()[0].endswith(f"max_batch_size {ruled * 2}")
    assert f"Published with max_batch_size {ruled * 2}: the served search measured it best" in md
    assert f"the in-process rule said {ruled}" in md


def test_an_older_report_without_a_served_search_renders_as_before(tmp_path: Path):
    shutil.copy(FIXTURES / "report_cnn.json", tmp_path / "report.json")
    rendered = write_report_files(tmp_path / "report.json")
    assert "## Served search" not in rendered.markdown.read_text() and "served_search" not in rendered.plots


def test_a_search_beside_another_job_says_so_and_publishes_what_it_measured():
    """Beside another job the variants ran on every core, as the server will be deployed; the story says how busy the
    machine was and that the published point is the one measured beside that load."""
    measured = OperatingPoint(4, (), 0, 1, 2)
    doc = _search(chosen=measured.to_json(), measured_on={"cores": [1], "available": [0, 1], "others_busy": 1.0},
                  variants=[_measured(measured, "coarse", [(4, 243.1, 23.3)]).to_json()])
    md = served_search_section(json.loads(json.dumps(doc)))
    assert "Other processes kept 1.0 of 2 cores busy" in md and "ran on every core beside them" in md and "published as measured" in md
    assert f"**{measured.label}** (published)" in md and "243.1" in md
    assert served_search_figure(doc) is not None


def test_a_published_queue_delay_says_what_one_request_at_a_time_pays():
    delayed = OperatingPoint(4, (), 9200, 1, 2)
    doc = _search(chosen=delayed.to_json())
    base = ServedVariant(delayed, "base", curve=[LoadLevel(1, 64.9, 14.92, 15.7, 18.01, 19.0)], seconds=0.0)
    doc["variants"].append(json.loads(json.dumps(base.to_json())))
    text = served_search_section(doc).split("\n\n")[1]
    assert "One request at a time waits the 9200 us queue delay for a batch that cannot fill: 64.9 infer/s, p95 18.01 ms (stand-in)" in text
    assert "queue delay for a batch" not in served_search_section(_search()).split("\n\n")[1]  # no delay published, nothing to say
