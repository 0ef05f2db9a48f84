"""report.md's served-search section and its plot, from a ServedSearch record as report.json stores it.

No server runs: the search is built from the records and stored with `.to_json()`, the way the
pipeline writes `published.served_search`; the rest of the report is the stored run in tests/fixtures.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from optimizer.records.served_search import OperatingPoint, ServedSearch, ServedVariant
from optimizer.report.markdown import write_report_files
from optimizer.report.plots import SERVED_SEARCH_FILE, served_search_figure, short_label, write_served_search_plot
from optimizer.report.served_search_section import served_search_section
from tests.conftest import FIXTURES

PNG = b"\x89PNG\r\n\x1a\n"
START = OperatingPoint(2, (2,), 249, 1, 2)
WIDE = OperatingPoint(2, (2,), 249, 2, 1)
BIG = OperatingPoint(8, (8,), 0, 2, 1)
BROKEN = OperatingPoint(16, (16,), 0, 2, 1)


def _search(stand_in: bool = True, **overrides) -> dict:
    """A searched run that published BIG over the rules' START, with one variant that failed to load."""
    variants = [
        ServedVariant(START, "start", throughput=455.0, p50_ms=8.36, p95_ms=10.7, p99_ms=11.4, server_batch=1.99, seconds=5.1),
        ServedVariant(WIDE, "instances", throughput=430.6, p50_ms=8.49, p95_ms=13.73, p99_ms=15.88, server_batch=1.49, seconds=5.1),
        ServedVariant(BIG, "batch", throughput=612.3, p50_ms=11.8, p95_ms=17.67, p99_ms=23.11, server_batch=5.5, seconds=5.2),
        ServedVariant(BROKEN, "batch", status="failed", reason="the config is refused: too big", seconds=0.4),
    ]
    for v in variants:
        v.differs = v.point.differences(BIG)
    search = ServedSearch(
        status="searched", concurrency=4, concurrency_source="default: two peak batches in flight per instance",
        served_by="stand-in backend: Triton's python backend runs backends/onnxruntime/model.py" if stand_in else "native backend",
        stand_in=stand_in, server="local tritonserver at 127.0.0.1:1", request_mix="the profiled sample (image 3x64x64)",
        start=START, chosen=BIG, variants=variants, stopped="no neighbour of the best variant served more", seconds=16.0,
        budget_s=25.0, in_process_throughput=580.25, per_request_ms=0.0899, predicted_throughput=612.3,
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


def test_table_has_every_variant_in_order_with_its_numbers_and_marks_the_published_row():
    search = _search()
    md = served_search_section(search)
    assert md.startswith("## Served search\n")
    rows = _rows(md)
    assert [r[0] for r in rows] == [v["stage"] for v in search["variants"]]
    for row, v in zip(rows, search["variants"]):
        assert v["label"] in row[1]
        if v["throughput"] is not None:
            assert float(row[3]) == round(v["throughput"], 1)
            assert [float(c) for c in row[4:7]] == [round(v[k], 2) for k in ("p50_ms", "p95_ms", "p99_ms")]
            assert float(row[7]) == round(v["server_batch"], 2)
    published = [r for r in rows if "(published)" in r[1]]
    assert len(published) == 1 and published[0][1] == f"**{BIG.label}** (published)" and published[0][2] == "published"
    assert rows[0][2] == "max_batch_size 2 (published 8), preferred [2] (published [8]), queue_delay_us 249 (published 0), instances 1 (published 2), threads 2 (published 1)"
    assert rows[3][-1] == "failed: the config is refused: too big" and rows[3][3] == ""


def test_the_sentences_name_the_load_the_backend_the_choice_and_the_prediction():
    md = served_search_section(_search())
    text = md.split("\n\n")[1]
    assert "concurrency 4 (default: two peak batches in flight per instance)" in text and "without a latency budget" in text
    assert "the profiled sample (image 3x64x64)" in text
    assert "4 variants in 16 s" in text and "stopped: no neighbour of the best variant served more" in text
    assert f"Published **{BIG.label}**" in text and f"instead of the in-process rules' {START.label}" in text
    assert "612.3 infer/s served (stand-in)" in text and "580.2 samples/s in-process at the server-formed batch 5.50" in text
    assert "0.090 ms per request (stand-in)" in text
    budgeted = served_search_section(_search(latency_budget_ms=20.0))
    assert "within a p95 latency budget of 20 ms" in budgeted


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


def test_plot_marks_the_published_point_and_labels_each_variant(tmp_path: Path):
    search = _search()
    fig = served_search_figure(search)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    star = lines["published"]
    assert star.get_marker() == "*" and list(star.get_xdata()) == [17.67] and list(star.get_ydata()) == [612.3]
    assert list(lines["in-process rules"].get_xdata()) == [10.7]
    assert list(lines["variants"].get_ydata()) == [455.0, 430.6, 612.3]  # the failed variant has no point
    assert {t.get_text() for t in ax.texts} == {short_label(p.to_json()) for p in (START, WIDE, BIG)}
    assert short_label(BIG.to_json()) == "max 8 pref[8] 2x1t d0"
    assert "published" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_title() == "served search at concurrency 4 (stand-in backend)"
    assert served_search_figure(_search(stand_in=False)).axes[0].get_title() == "served search at concurrency 4"
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


def test_a_search_on_the_free_cores_says_so_and_shows_what_it_measured():
    """Beside another job the variants ran as one instance on the free core; the published point (scaled, with the
    rules' layout) was never served as such, so the story names the measured variant and predicts nothing."""
    measured = OperatingPoint(4, (4,), 0, 1, 1)
    published = OperatingPoint(8, (8,), 0, 1, 2)
    doc = _search(chosen=published.to_json(), measured_point=measured.to_json(), predicted_throughput=None, in_process_throughput=None,
                  per_request_ms=None, measured_on={"cores": [1], "available": [0, 1], "others_busy": 1.0},
                  variants=[ServedVariant(measured, "batch", throughput=243.1, p50_ms=20.0, p95_ms=23.3, p99_ms=25.0, seconds=5.0).to_json()])
    md = served_search_section(json.loads(json.dumps(doc)))
    assert "Other processes kept 1.0 of 2 cores busy" in md and "measured as max 4 pref [4] delay 0us 1x1t" in md
    assert "243.1" in md  # the published point's numbers are the measured variant's, labelled as such
    assert "Prediction:" not in md
    assert served_search_figure(doc) is not None
