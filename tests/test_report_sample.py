"""docs/reading-the-report.md shows a real export's console, config.pbtxt and report.md (scripts/report_sample.py ran
it and kept its files in tests/fixtures/report_sample/), and stays in step with the report writer: the page holds the
kept files, the writer still renders the kept report.json into the same sections and tables, and the page's table of
sections names every section the writer makes."""

from __future__ import annotations

import re
import sys

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "reading-the-report.md"
SAMPLE = ROOT / "tests" / "fixtures" / "report_sample"
REDO = "run scripts/report_sample.py --render (the kept report.json through the writer as it is now) or, for a new run, scripts/report_sample.py"


def _block(marker: str) -> str:
    text = PAGE.read_text().split(f"<!-- sample:{marker} -->", 1)[1].split(f"<!-- /sample:{marker} -->", 1)[0].strip()
    return re.sub(r"\A(`{3,})[a-z.]*\n(.*)\n\1\Z", r"\2", text, flags=re.S)


def _shape(markdown: str) -> list[str]:
    """The headings and the header rows of the tables: the sections and the fields a report shows."""
    lines = markdown.splitlines()
    return [line for i, line in enumerate(lines)
            if line.startswith("#") or (line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"))]


def test_the_page_shows_the_kept_run():
    for marker, name in (("console", "console.txt"), ("config.pbtxt", "config.pbtxt"), ("report.md", "report.md")):
        assert _block(marker) == (SAMPLE / name).read_text().rstrip(), f"the page's {marker} is not the kept one: run scripts/report_sample.py --page"


def test_the_report_writer_still_renders_the_sample_into_its_sections_and_tables():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from report_sample import render_report_md
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert _shape(render_report_md()) == _shape((SAMPLE / "report.md").read_text()), \
        f"the report writer's sections or table columns changed since the sample was made: {REDO}"


def test_the_pages_table_of_sections_names_every_section():
    headings = [h[3:] for h in (SAMPLE / "report.md").read_text().splitlines() if h.startswith("## ")]
    page = PAGE.read_text()
    rows = re.findall(r"^\| ([^|]+?) \| [^|]+ \|$", page.split("| section | read it for |", 1)[1], flags=re.M)
    named = [r for r in rows if not r.startswith(("the summary", "---"))]
    unnamed = [h for h in headings if not any(h.startswith(n) for n in named)]
    stale = [n for n in named if not any(h.startswith(n) for h in headings)]
    assert not unnamed and not stale, f"report.md's sections {unnamed} are not in the page's table; the table names {stale}, which report.md lacks"


def test_the_sample_config_is_one_triton_loads():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((SAMPLE / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.name == "cnn" and config.max_batch_size >= 1 and config.input[0].name == "image"
