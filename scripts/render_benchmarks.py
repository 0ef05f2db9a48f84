"""Render docs/benchmarks.md from the benchmark records in benchmarks/results/*.json (benchmarks/results.py).

One section per record, sorted by benchmark name: what the benchmark measures (the first line of benchmarks/NAME.py's
docstring), its figures as tables, and the machine, date, command and settings that produced them. Nested figures
(per model, per load) become one table row each; raw rows (lists of dicts, such as "grid" and "rounds") stay in the
record. The same records always give the same page.

    .venv/bin/python scripts/render_benchmarks.py [--results DIR] [--out FILE]     (or: make benchmarks-page)
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
META = ("benchmark", "date", "machine", "command")
SETTING_KEYS = ("runs", "rounds", "repeats", "pairs", "loads", "interval")
"""Top-level keys read as settings (run line), not figures, beside the record's "settings" dict."""
REGENERATE = ".venv/bin/python scripts/render_benchmarks.py"
LEGEND = {"a": "the first config's throughput (the emitted one), infer/s", "b": "the other config's (the grid's best, or the pair), infer/s",
          "lo": "the low end of the ratio's 90% interval", "hi": "its high end", "p95_ratio": "p95 latency, a over b"}
"""Columns whose name alone does not say what they hold (benchmarks/traffic.py's paired figures)."""

Row = tuple[tuple[str, ...], dict[str, Any]]


def render(results_dir: Path = RESULTS, out_path: Path = PAGE, benchmarks_dir: Path = ROOT / "benchmarks") -> str:
    """Write the page for every record in results_dir to out_path; returns its text."""
    text = page(Path(results_dir), Path(benchmarks_dir))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    return text


def page(results_dir: Path, benchmarks_dir: Path) -> str:
    records, unreadable = load_records(results_dir)
    out = [
        "# Benchmarks",
        "",
        "This page shows the current benchmark figures. It is generated from the records in `benchmarks/results/` by "
        "`scripts/render_benchmarks.py`: do not edit it by hand. Each benchmark in `benchmarks/` writes its figures there "
        "as JSON, with the machine it ran on (CPU model, the CPU flags that change a figure, cores), the date, the command "
        "and its settings (runs, rounds, the interval where it computes one). Benchmarks compare side by side in one run; "
        "a figure holds for the machine it names. After running a benchmark, regenerate the page:",
        "",
        "```",
        REGENERATE,
        "```",
        "",
        "(or `make benchmarks-page`).",
        "",
    ]
    if not records:
        out += [f"No benchmark records yet: `{_shown(results_dir)}` holds none. Run a benchmark (for example "
                "`.venv/bin/python benchmarks/tune_quality.py`), then regenerate this page.", ""]
    for stem, record in records:
        out += section(stem, record, results_dir, benchmarks_dir)
    if unreadable:
        out += ["## Unreadable records", ""] + [f"- `{name}`: {why}" for name, why in unreadable] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def load_records(results_dir: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, str]]]:
    """(file stem, record) sorted by benchmark name, and (file name, why) for files that are not a JSON object."""
    records, unreadable = [], []
    paths = sorted(p for p in results_dir.glob("*.json") if not p.name.startswith(".")) if results_dir.is_dir() else []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            unreadable.append((path.name, f"not JSON ({err})"))
            continue
        if not isinstance(doc, dict):
            unreadable.append((path.name, "not a JSON object"))
            continue
        records.append((path.stem, doc))
    records.sort(key=lambda r: (_natural(str(r[1].get("benchmark") or r[0])), r[0]))
    return records, unreadable


def describe(name: str, benchmarks_dir: Path) -> str:
    """The first line of benchmarks/NAME.py's docstring."""
    path = benchmarks_dir / f"{name}.py"
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (OSError, SyntaxError, ValueError):
        doc = None
    if not doc:
        return f"(`benchmarks/{name}.py` has no docstring to say what it measures.)"
    return doc.strip().splitlines()[0].strip()


def section(stem: str, record: dict[str, Any], results_dir: Path, benchmarks_dir: Path) -> list[str]:
    name = str(record.get("benchmark") or stem)
    out = [f"## {name}", "", describe(name, benchmarks_dir), ""]
    settings = dict(record["settings"]) if isinstance(record.get("settings"), dict) else {}
    figures: dict[str, Any] = {}
    for key, value in record.items():
        if key in META or key == "settings":
            continue
        if key in SETTING_KEYS and _scalar_like(value):
            settings.setdefault(key, value)
        else:
            figures[key] = value
    rows: list[Row] = []
    raw: list[str] = []
    others: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    walk(figures, (), rows, raw, others)
    for table in tables(rows):
        out += render_table(table, name) + [""]
    if not rows:
        out += ["No figures in this record.", ""]
    if raw:
        out += [f"Raw rows ({', '.join(sorted(set(raw)))}) in `{_shown(results_dir / (stem + '.json'))}`.", ""]
    out += [run_line(record, settings), ""]
    for path, run in sorted(others, key=lambda o: _natural(_label(o[0], name))):
        out += [f"- `{_label(path, name)}` comes from another run: {run_line(run, run.get('settings') or {}, lead='')}"]
    if others:
        out.append("")
    return out


def walk(node: dict[str, Any], path: tuple[str, ...], rows: list[Row], raw: list[str], others: list) -> None:
    """One row per dict with scalar values (its path, those values); nested dicts recursively; lists of rows noted as raw."""
    scalars: dict[str, Any] = {}
    children = []
    for key, value in node.items():
        key = str(key)
        if key == "from_run" and isinstance(value, dict):
            others.append((path, value))
        elif _scalar_like(value):
            scalars[key] = value
        elif isinstance(value, dict):
            children.append((key, value))
        else:
            raw.append(key)
    if scalars:
        rows.append((path, scalars))
    for key, value in sorted(children, key=lambda kv: _natural(kv[0])):
        walk(value, (*path, key), rows, raw, others)


def tables(rows: list[Row]) -> list[list[Row]]:
    """Rows grouped by their fields: one table per set of fields, a row whose fields are a subset of a larger table's
    joins it; tables in the order of their first row, rows sorted by path."""
    groups: list[tuple[list[str], list[Row]]] = []
    for row in sorted(rows, key=lambda r: -len(r[1])):
        keys = set(row[1])
        for columns, members in groups:
            if keys <= set(columns):
                members.append(row)
                break
        else:
            groups.append((list(row[1]), [row]))
    order = {id(r): i for i, r in enumerate(rows)}
    out = [sorted(members, key=lambda r: (_natural(" / ".join(r[0])), order[id(r)])) for _, members in groups]
    return sorted(out, key=lambda members: min(order[id(r)] for r in members))


def render_table(rows: list[Row], name: str) -> list[str]:
    columns: list[str] = []
    for _, values in rows:
        columns += [k for k in values if k not in columns]
    under_models = all(path[:1] == ("models",) for path, _ in rows)
    head = ("model" if all(len(path) == 2 for path, _ in rows) else "model / part") if under_models else ""
    out = ["| " + " | ".join([head, *columns]) + " |", "|" + "---|" * (len(columns) + 1)]
    for path, values in rows:
        cells = [_label(path, name), *(cell(values[c]) if c in values else "" for c in columns)]
        out.append("| " + " | ".join(cells) + " |")
    legend = [f"{c}: {LEGEND[c]}" for c in columns if c in LEGEND]
    if legend:
        out += ["", "Columns: " + "; ".join(legend) + "."]
    return out


def run_line(record: dict[str, Any], settings: dict[str, Any], lead: str = "Measured on ") -> str:
    """CPU model (flags, cores), date, command and settings of a record (or of a from_run block)."""
    machine = record.get("machine") if isinstance(record.get("machine"), dict) else {}
    flags = machine.get("flags")
    flags_text = ", ".join(map(str, flags)) if isinstance(flags, list) and flags else "none of those recorded"
    extra = "".join(f"; {label} {machine[k]}" for k, label in (("python", "Python"), ("torch", "torch")) if machine.get(k))
    text = (f"{lead}**{_escape(str(machine.get('cpu') or 'an unrecorded CPU'))}** (flags: {flags_text}; "
            f"{machine.get('cores', '?')} cores{extra}), {record.get('date', 'undated')}, with `{record.get('command', 'an unrecorded command')}`.")
    if settings:
        text += " Settings: " + "; ".join(f"{k} {cell(v)}" for k, v in settings.items() if _scalar_like(v)) + "."
    return text


def cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 100:
            return f"{value:.1f}"
        text = f"{value:.3f}".rstrip("0")
        return text + "0" if text.endswith(".") else text
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value) or "none"
    return _escape(str(value))


def _scalar_like(value: Any) -> bool:
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))


def _label(path: tuple[str, ...], name: str) -> str:
    parts = path[1:] if path[:1] == ("models",) else path
    return _escape(" / ".join(parts)) if parts else name


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _natural(text: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p)


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records (default: benchmarks/results)")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page (default: docs/benchmarks.md)")
    args = parser.parse_args(argv)
    render(args.results, args.out)
    count = len(load_records(args.results)[0])
    print(f"wrote {_shown(args.out)} from {count} record(s) in {_shown(args.results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
