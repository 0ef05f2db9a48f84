"""Benchmark records: every benchmark writes its figures as JSON into benchmarks/results/, with the machine they were
measured on (CPU model and the flags that change a precision figure, cores), the date, the command and its runs, so a
figure is never quoted without where it comes from. scripts/render_benchmarks.py renders the records into
docs/benchmarks.md (`make benchmarks-page`).

One file per benchmark, benchmarks/results/BENCHMARK.json (BENCHMARK: the script's name, benchmarks/BENCHMARK.py):

- "benchmark", "date" (UTC), "machine" (machine()), "command": added by write_result;
- "settings": what the run was asked for and how its figures are computed: runs, rounds, pairs, load, the interval
  ("90%, Student's t over ...") where the benchmark computes one (a top-level "runs", "rounds", "repeats", "pairs",
  "loads" or "interval" is read as a setting too, as benchmarks/traffic.py writes them);
- "models": the figures per model or config, keyed by its name ("cnn", "transformer", "cnn --int8"): the fields of
  the benchmark's machine-readable line (line_figures) and what a reader needs beside them. A benchmark runs one
  model or several per process, so merge_models keeps the entries of models this run did not measure from the file
  already there, each with "from_run": the date, command, machine and settings that measured it. A second model never
  overwrites the first; the same model measured again replaces its entry;
- figures of the whole run that belong to no model (benchmarks/fleet.py): top-level scalars;
- raw rows (lists of dicts, such as "grid" and "rounds"): kept in the file, not rendered.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
FLAGS = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "avx2")
"""The CPU flags that decide what a CPU figure means (bf16 compute, INT8 dot products, AMX)."""


def machine() -> dict[str, Any]:
    """CPU model, the flags of FLAGS it has, cores, and the Python and torch it ran with."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.processor(), platform.machine()):
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    torch_version = ""
    try:
        from importlib.metadata import version

        torch_version = version("torch")
    except Exception:
        pass
    return {"cpu": model, "flags": [f for f in FLAGS if f in flags], "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "python": platform.python_version(), "torch": torch_version, "platform": platform.platform()}


def write_result(name: str, record: dict[str, Any], directory: Path = RESULTS) -> Path:
    """Write benchmarks/results/NAME.json: `record` with the machine, the date (UTC) and the command, atomically."""
    doc = {"benchmark": name, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
           "command": shlex.join(["python", *sys.argv]), **record}
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=f".{name}.", suffix=".json", delete=False) as tmp:
        json.dump(doc, tmp, indent=1, default=str)
    os.replace(tmp.name, directory / f"{name}.json")
    return directory / f"{name}.json"


def line_figures(line: str) -> dict[str, Any]:
    """The fields of a benchmark's machine-readable line ("name k=v k=v ... (note)"): integers and finite floats as
    numbers, anything else ("n/a", "nan", "2/3", "onnxruntime/fp32") as printed; words after the fields as "note"."""
    out: dict[str, Any] = {}
    note = []
    for token in line.split()[1:]:
        key, eq, value = token.partition("=")
        if not eq or not key:
            note.append(token)
            continue
        out[key] = _number(value)
    if note:
        out["note"] = " ".join(note).strip("()")
    return out


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def merge_models(name: str, models: dict[str, Any], record: dict[str, Any] | None = None, directory: Path = RESULTS) -> dict[str, Any]:
    """`record` with "models": these entries, and the entries of other models from directory/NAME.json if one is there
    (each with "from_run": that file's date, command, machine and settings, unless it has one already). Pass the result
    to write_result(NAME, ...)."""
    kept: dict[str, Any] = {}
    try:
        old = json.loads((directory / f"{name}.json").read_text())
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict) and isinstance(old.get("models"), dict):
        run = {k: old[k] for k in ("date", "command", "machine", "settings") if k in old}
        for model, entry in old["models"].items():
            if model in models:
                continue
            if isinstance(entry, dict) and "from_run" not in entry:
                entry = {**entry, "from_run": run}
            kept[model] = entry
    return {**(record or {}), "models": {**kept, **models}}
