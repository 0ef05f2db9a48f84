"""Progress renderers: plain lines without control characters, a rich display on terminals, the CLI's choice."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from optimizer.events import Event, ends_candidate
from optimizer.report.progress import PlainProgress, RichProgress, choose_progress
from tests.conftest import run_cli

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # everything but "\n"

RUN = [
    Event("load", "start", message="bundled example"),
    Event("load", "done", message="cnn (torch)"),
    Event("build", "skipped", "tensorrt[cuda]", "tensorrt runs on cuda, not cpu."),
    Event("build", "start", "torch-eager[cpu]", "", 0, 2),
    Event("build", "done", "torch-eager[cpu]", "nothing to build in 0.0 s", 0, 2),
    Event("correctness", "start", "torch-eager[cpu]", "", 0, 2),
    Event("correctness", "done", "torch-eager[cpu]", "max abs 0, max rel 0", 0, 2),
    Event("profile", "start", "torch-eager[cpu]", "", 0, 2),
    Event("profile", "progress", "torch-eager[cpu]", "batch 1: 50.0/s, p95 21.0 ms", 0, 2),
    Event("profile", "done", "torch-eager[cpu]", "58.0/s at batch 2, max batch 8 (saturation)", 1, 2),
    Event("build", "start", "onnxruntime[cpu]", "", 1, 2),
    Event("correctness", "failed", "onnxruntime[cpu]", "rejected: output 'y' differs\n\x1b[31mred\r", 2, 2),
]


def test_plain_lines_carry_no_control_characters_and_count_candidates():
    out = io.StringIO()
    sink = PlainProgress(out)
    for e in RUN:
        sink(e)
    text = out.getvalue()
    assert not CONTROL.search(text), repr(text)
    lines = text.splitlines()
    assert len(lines) == len(RUN)  # one line per event; the message's newline did not split it
    assert re.match(r"^\[\s*\d+\.\ds\] profile\s+progress torch-eager\[cpu\] \| batch 1: 50\.0/s, p95 21\.0 ms \[0/2\]$", lines[8])
    assert lines[9].endswith("58.0/s at batch 2, max batch 8 (saturation) [1/2]")
    assert lines[10].endswith("build       start    onnxruntime[cpu] [1/2]")
    assert lines[11].endswith("rejected: output 'y' differs [31mred [2/2]")


def test_quiet_keeps_finished_steps_and_silent_keeps_nothing():
    quiet, silent = io.StringIO(), io.StringIO()
    for e in RUN:
        PlainProgress(quiet, "quiet")(e)
        PlainProgress(silent, "silent")(e)
    states = [line.split("]", 1)[1].split()[1] for line in quiet.getvalue().splitlines()]
    assert states == ["done", "skipped", "done", "done", "done", "failed"]
    assert silent.getvalue() == ""


def test_the_last_event_of_a_candidate_is_recognised():
    assert [ends_candidate(e) for e in RUN] == [False, False, True, False, False, False, False, False, False, True, False, True]


def test_rich_display_has_a_line_per_phase_and_candidate():
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with RichProgress(console, auto_refresh=False) as progress:
        for e in RUN:
            progress(e)
    final = Console(file=io.StringIO(), width=100, record=True)
    final.print(progress.progress.get_renderable())
    lines = final.export_text().splitlines()
    by_name = {line.split()[1]: line for line in lines}
    assert by_name["load"].startswith("✓") and "cnn (torch)" in by_name["load"]
    assert by_name["tensorrt[cuda]"].startswith("-")
    assert by_name["torch-eager[cpu]"].startswith("✓") and "58.0/s at batch 2" in by_name["torch-eager[cpu]"]
    assert by_name["onnxruntime[cpu]"].startswith("✗") and "rejected: output 'y' differs" in by_name["onnxruntime[cpu]"]
    assert "2/2 steps done" in by_name["tune"]
    assert [line.split()[1] for line in lines] == ["load", "tune", "tensorrt[cuda]", "torch-eager[cpu]", "onnxruntime[cpu]"]


def test_rich_display_shows_the_batch_being_measured_and_what_is_left():
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with RichProgress(console, auto_refresh=False) as progress:
        for e in RUN[:9]:
            progress(e)
        progress(Event("build", "progress", "onnxruntime[cpu]", "correctness", 0, 2))  # a bare stage word
        final = Console(file=io.StringIO(), width=100, record=True)
        final.print(progress.progress.get_renderable())
    text = final.export_text()
    assert "profile: batch 1: 50.0/s" in text
    assert "0/2 steps done" in text and "2 left" in text
    assert re.search(r"onnxruntime\[cpu\]\s+\S+\s+build\.\.\.", text)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_cli_chooses_rich_only_on_a_terminal_at_default_verbosity(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert isinstance(choose_progress(0, _Tty()), RichProgress)
    assert isinstance(choose_progress(0, io.StringIO()), PlainProgress)
    assert choose_progress(1, _Tty()).detail == "normal"  # -v: logs interleave, so plain lines
    assert choose_progress(-1, _Tty()).detail == "quiet"
    assert choose_progress(-2, io.StringIO()).detail == "silent"
    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(choose_progress(0, _Tty()), PlainProgress)


@pytest.mark.slow
def test_piped_export_shows_every_step_in_plain_lines_and_json_alone_on_stdout(in_tmp: Path):
    r = run_cli("export", "--backend", "onnxruntime", "--eager-gate", "disabled", "--max-batch-size", "2", "--json", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout is exactly one JSON document
    assert doc["result"]["selected"] == "onnxruntime[cpu]"
    assert not CONTROL.search(r.stderr), repr(r.stderr)
    steps = [" ".join(line.split("]", 1)[1].split()[:2]) for line in r.stderr.splitlines() if line.startswith("[")]
    for expected in ("load done", "signature done", "reference done", "build start", "correctness done",
                     "profile start", "profile progress", "profile done", "select done", "publish done", "report done"):
        assert expected in steps, (expected, r.stderr)
    measured = re.findall(r"profile\s+progress onnxruntime\[cpu\] \| batch (\d+):", r.stderr)
    assert measured == ["1", "2"]
    report_dir = in_tmp / "aitune-reports" / "cnn"
    assert {"report.json", "report.md", "throughput.png", "latency.png"} <= {p.name for p in report_dir.iterdir()}
    assert "# cnn: onnxruntime[cpu], max_batch_size 2" in (report_dir / "report.md").read_text()
