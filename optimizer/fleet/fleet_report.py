"""The fleet report: fleet.json and report.md beside the per-model report folders, one row per model of the plan.

Each row says how the model ended (published, unchanged, failed, interrupted, not run) and why, the backend
and max batch size that were published, its throughput and where that was measured, and links to the
model's own report.md, so one page answers "what is in the repository now, and what went wrong".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from optimizer.errors import SettingsError
from optimizer.fleet.job import ModelOutcome
from optimizer.report.markdown_tables import table

FORMAT = 1


def fleet_record(plan_path: Path, executor: str, placement: str, outcomes: list[ModelOutcome], seconds: float) -> dict[str, Any]:
    """The fleet's JSON document: the run (plan, executor, placement, wall time, counts) and every model's outcome."""
    counts = {s: sum(o.status == s for o in outcomes) for s in ("published", "unchanged", "failed", "interrupted", "not run")}
    return {"format": FORMAT, "plan": str(plan_path), "executor": executor, "placement": placement, "seconds": round(seconds, 1),
            "counts": counts, "models": [o.to_json() for o in outcomes]}


def write_fleet_report(folder: Path, record: dict[str, Any], suffix: str = "") -> tuple[Path, Path]:
    """Write fleet{suffix}.json and report{suffix}.md into `folder` atomically; returns both paths.

    `suffix` ("-3" for `--index 3`) keeps the pods of one Indexed Job from overwriting each other on a shared volume.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        json_path, md_path = folder / f"fleet{suffix}.json", folder / f"report{suffix}.md"
        _atomic_write(json_path, json.dumps(record, indent=2, default=str) + "\n")
        _atomic_write(md_path, markdown(record, folder))
    except OSError as err:
        raise SettingsError(f"could not write the fleet report into {str(folder)!r}: {err.strerror or err}; choose another --report-dir.") from err
    return json_path, md_path


def read_previous(folder: Path, suffix: str = "") -> dict[str, ModelOutcome]:
    """The outcomes of the last run that wrote this folder's fleet record, by model name (empty when there is none)."""
    path = folder / f"fleet{suffix}.json"
    try:
        doc = json.loads(path.read_text())
        return {m["name"]: ModelOutcome.from_json(m) for m in doc.get("models", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no record yet, or not ours: export everything
        return {}


def markdown(record: dict[str, Any], folder: Path) -> str:
    """report.md: a headline with the counts, then one table row per model with a link to its own report."""
    counts = record["counts"]
    parts = [f"{n} {s}" for s, n in counts.items() if n]
    lines = [f"# Fleet: {len(record['models'])} models, {', '.join(parts) or 'none run'}", "",
             f"Plan `{record['plan']}`, executor `{record['executor']}`; {record['seconds']:.0f} s wall time.", "",
             f"Placement: {record['placement']}", ""]
    job = record.get("job_manifest") or {}
    if job.get("path"):
        lines += [f"Kubernetes Indexed Job (one pod per model): [{Path(job['path']).name}]({os.path.relpath(job['path'], folder)})", ""]
    elif job.get("reason"):
        lines += [f"No Kubernetes Job manifest: {job['reason']}.", ""]
    rows = []
    for m in record["models"]:
        throughput = f"{m['throughput']:.1f}" if m.get("throughput") else ""
        rows.append([m["name"], m["status"], m.get("backend") or "", str(m.get("max_batch_size") or ""), throughput,
                     m.get("throughput_source") or "", f"{m.get('seconds') or 0:.0f}", m.get("reason") or "", _link(m, folder)])
    lines.append(table(["model", "status", "backend", "max batch", "throughput/s", "measured", "seconds", "reason", "report"], rows))
    return "\n".join(lines) + "\n"


def _link(model: dict[str, Any], folder: Path) -> str:
    """A relative link to the model's report.md (or its export.log when no report was written)."""
    if not model.get("report_dir"):
        return ""
    report_dir = Path(model["report_dir"])
    for name in ("report.md", "export.log"):
        target = report_dir / name
        if target.is_file():
            rel = os.path.relpath(target.resolve(), folder.resolve())
            return f"[{name}]({rel})"
    return ""


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
