"""CLI flags, the settings file and the API are one table: every option has a key, round-trips, and is documented."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from optimizer.cli.commands import export as export_command
from optimizer.errors import SettingsError
from optimizer.settings import KEYS, ExportSettings, key_of, load_settings_file, parse_size_mb, settings_from
from tests.conftest import ROOT


def test_every_field_is_an_option_and_a_key():
    options = {o.name for o in export_command.params}
    for f in fields(ExportSettings):
        assert f.metadata["help"], f.name
        assert f.name in options or f.name == "model", f"{f.name} has no CLI option"
        assert KEYS[key_of(f.name)] == f.name


def test_settings_file_round_trips(tmp_path: Path):
    s = ExportSettings(model="pkg.mod:build", input=["x:float32:3x8"], backend=["onnxruntime"], max_batch_size="16",
                       latency_budget_ms=12.5, percentile=99, overwrite=True, cache=False, time_budget_s=300.0)
    path = tmp_path / "export.toml"
    path.write_text(s.to_toml())
    assert settings_from(load_settings_file(path)) == s


def test_pyproject_section_is_read(tmp_path: Path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n[tool.aitune-export]\nrepository = "models"\nbackend = "onnxruntime"\n')
    values = load_settings_file(path)
    assert values == {"repository": "models", "backend": ["onnxruntime"]}


def test_unknown_key_names_the_key_and_the_file(tmp_path: Path):
    path = tmp_path / "export.toml"
    path.write_text('max_batch = 8\n')
    with pytest.raises(SettingsError, match=r"export.toml.*unknown key 'max_batch'"):
        load_settings_file(path)


def test_cli_flags_override_the_file(tmp_path: Path):
    from optimizer.cli.commands import settings_from_cli

    path = tmp_path / "export.toml"
    path.write_text('repository = "from_file"\nstrategy = "min-latency"\n')
    s = settings_from_cli(None, str(path), {"repository": "from_flag", "strategy": None, "backend": ()})
    assert s.repository == "from_flag" and s.strategy == "min-latency"


def test_the_docs_document_every_settings_key():
    page = (ROOT / "docs" / "exporting.md").read_text()
    missing = [k for k in KEYS if f"`{k}`" not in page]
    assert not missing, f"the settings table of docs/exporting.md lacks {missing}: run scripts/settings_table.py"


def test_memory_sizes():
    assert parse_size_mb("2GiB") == 2048 and parse_size_mb("512") == 512 and parse_size_mb("none") is None
    assert 0 < parse_size_mb("auto") <= 8192
    with pytest.raises(SettingsError):
        parse_size_mb("-3G")
