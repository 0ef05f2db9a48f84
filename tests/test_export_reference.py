"""validate reads the samples of the report it was given, whatever the current folder holds.

A report records its sample files relative to the folder its export ran in (`aitune-reports/cnn/samples/...`). Read
against the current folder, that path can be another export's file: the quick start's `make export` writes one at
exactly the recorded path, and validating a model against another model's samples would check the wrong answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _report_folder(where: Path) -> Path:
    folder = where / "elsewhere" / "cnn"
    (folder / "samples").mkdir(parents=True)
    for name in ("samples.npz", "reference_outputs.npz", "profile_feed.npz"):
        (folder / "samples" / name).write_bytes(b"own")
    (folder / "report.json").write_text((ROOT / "tests" / "fixtures" / "report_cnn.json").read_text())
    return folder


def _another_export_in(cwd: Path) -> None:
    """What `make export` leaves in a checkout: files at the very paths the fixture report records."""
    recorded = json.loads((ROOT / "tests" / "fixtures" / "report_cnn.json").read_text())["result"]["reference"]
    for key in ("feeds", "outputs", "profile_feed"):
        path = cwd / recorded[key]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"another export's")


def test_the_reports_own_samples_win_over_a_file_at_the_recorded_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from optimizer.triton.measure.validation import load_export_reference

    folder = _report_folder(tmp_path)
    _another_export_in(tmp_path)
    monkeypatch.chdir(tmp_path)
    ref = load_export_reference(folder / "report.json")
    assert ref.feeds == folder / "samples" / "samples.npz"
    assert ref.outputs == folder / "samples" / "reference_outputs.npz"
    assert ref.profile_feed == folder / "samples" / "profile_feed.npz"


def test_a_report_without_its_samples_is_refused_rather_than_read_with_another_exports(tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch):
    from optimizer.errors import RepositoryError
    from optimizer.triton.measure.validation import load_export_reference

    folder = _report_folder(tmp_path)
    (folder / "samples" / "samples.npz").unlink()
    _another_export_in(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RepositoryError, match=r"samples\.npz.* is gone .*re-run the export"):
        load_export_reference(folder / "report.json")
