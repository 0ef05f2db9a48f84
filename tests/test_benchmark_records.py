"""Benchmark records (benchmarks/results.py) and the page rendered from them (scripts/render_benchmarks.py): cheap, no
benchmark is run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ("cache_speedup", "fleet", "noisy_choice", "precision", "served_grid", "served_throughput", "tune_quality", "url_choice", "traffic", "export_time", "rate")
"""The benchmarks that end with a machine-readable line, each of which must write its record."""


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results():
    return _load("benchmark_results_under_test", ROOT / "benchmarks" / "results.py")


@pytest.fixture(scope="module")
def renderer():
    return _load("render_benchmarks_under_test", ROOT / "scripts" / "render_benchmarks.py")


def test_a_record_names_the_machine_date_and_command(results, tmp_path: Path):
    path = results.write_result("fake_bench", {"models": {"cnn": {"ratio": 1.25}}}, directory=tmp_path)
    assert path == tmp_path / "fake_bench.json"
    doc = json.loads(path.read_text())
    machine = doc["machine"]
    assert machine["cpu"] and isinstance(machine["flags"], list) and isinstance(machine["cores"], int) and machine["cores"] >= 1
    assert doc["benchmark"] == "fake_bench" and doc["date"].endswith("Z") and doc["command"].startswith("python")
    assert doc["models"] == {"cnn": {"ratio": 1.25}}
    assert [p.name for p in tmp_path.iterdir()] == ["fake_bench.json"]  # no temporary file left behind


def test_a_second_model_joins_the_first_with_where_it_came_from(results, tmp_path: Path):
    results.write_result("bench", results.merge_models("bench", {"cnn": {"ratio": 0.9}}, {"settings": {"rounds": 4}}, tmp_path), tmp_path)
    results.write_result("bench", results.merge_models("bench", {"transformer": {"ratio": 1.1}}, {"settings": {"rounds": 2}}, tmp_path), tmp_path)
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["settings"] == {"rounds": 2}
    assert doc["models"]["transformer"] == {"ratio": 1.1}
    assert doc["models"]["cnn"]["ratio"] == 0.9 and doc["models"]["cnn"]["from_run"]["settings"] == {"rounds": 4}
    assert "cpu" in doc["models"]["cnn"]["from_run"]["machine"]
    results.write_result("bench", results.merge_models("bench", {"cnn": {"ratio": 0.95}}, {}, tmp_path), tmp_path)  # measured again
    assert json.loads((tmp_path / "bench.json").read_text())["models"]["cnn"] == {"ratio": 0.95}


def test_line_figures_reads_a_machine_readable_line(results):
    line = "noisy_choice model=cnn load=steady runs=3 min_ratio=0.950 ratio_lo=n/a ratio_hi=nan same_choice=2/3 (one failed)"
    assert results.line_figures(line) == {"model": "cnn", "load": "steady", "runs": 3, "min_ratio": 0.95, "ratio_lo": "n/a",
                                          "ratio_hi": "nan", "same_choice": "2/3", "note": "one failed"}


def test_the_page_renders_flat_and_nested_records(results, renderer, tmp_path: Path):
    records = tmp_path / "results"
    results.write_result("fleet", {"ray_seconds": 101.5, "local_seconds": 99.0, "ratio": 1.025, "settings": {"rounds": 2}}, directory=records)
    paired = {"a": 120.0, "b": 125.0, "ratio": 0.96, "lo": 0.91, "hi": 1.01, "p95_ratio": 1.02,
              "rounds": [[{"status": "measured", "throughput": 120.0}], [{"status": "measured", "throughput": 125.0}]]}
    results.write_result("traffic", {"loads": [1, 4], "rounds": 4, "models": {
        "transformer": {"exports": {"traffic": {"seconds": 80.0, "emitted": "max 8"}}, "grid": [{"status": "measured", "throughput": 1.0}],
                        "against_grid": {"1": {**paired, "best_point": "max 4"}, "4": {**paired, "best_point": "max 16"}}},
        "bert": {"skipped": "transformers is not installed"}}}, directory=records)
    out = tmp_path / "docs" / "benchmarks.md"
    text = renderer.render(records, out)
    assert out.read_text() == text
    assert "## fleet" in text and "## traffic" in text and text.index("## fleet") < text.index("## traffic")
    assert "Does Ray cost wall time on one node?" in text  # what it measures: benchmarks/fleet.py's docstring
    assert "| fleet | 101.5 | 99.0 | 1.025 |" in text
    assert "| transformer / against_grid / 4 | 120.0 | 125.0 | 0.96 | 0.91 | 1.01 | 1.02 | max 16 |" in text
    assert "| bert | transformers is not installed |" in text
    assert "Raw rows (grid, rounds) in" in text and "'status'" not in text
    machine = json.loads((records / "fleet.json").read_text())["machine"]
    assert f"Measured on **{machine['cpu']}** (flags: " in text and f"{machine['cores']} cores" in text
    assert "Settings: loads 1, 4; rounds 4." in text and "render_benchmarks.py" in text
    assert renderer.render(records, out) == text  # the same records, the same page


def test_without_records_the_page_says_so(renderer, tmp_path: Path):
    text = renderer.render(tmp_path / "missing", tmp_path / "benchmarks.md")
    assert "No benchmark records yet" in text and ".venv/bin/python scripts/render_benchmarks.py" in text


@pytest.mark.parametrize("name", RECORDING)
def test_every_benchmark_writes_its_record(name: str):
    source = (ROOT / "benchmarks" / f"{name}.py").read_text()
    assert "from results import" in source and "write_result(" in source, f"benchmarks/{name}.py prints figures but writes no record"


def test_the_benchmark_list_is_complete():
    """A benchmark that prints a machine-readable line is in RECORDING; the libraries beside them are not benchmarks."""
    libraries = {"results", "served_lab", "precision_models", "traffic_models", "model_analyzer_run"}
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - libraries
    assert scripts == set(RECORDING)
