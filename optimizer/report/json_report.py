"""Writing report.json: the TuneResult, the settings that produced it (replayable with --config) and where it was published.

Reading it back is records/report_file.py: validation (triton/, a peer of report/) and republish (app/) read
reports too, and triton/ must not import report/."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from optimizer.errors import SettingsError
from optimizer.records.tune_result import TuneResult
from optimizer.settings import ExportSettings


def write_report(path: Path, result: TuneResult, settings: ExportSettings, published: Any = None, extra: dict[str, Any] | None = None) -> Path:
    """Write report.json atomically (a reader never sees half a file)."""
    try:
        return _write_report(path, result, settings, published, extra)
    except OSError as err:
        done = f"the model was published to {published.model_dir}, but " if published is not None else ""
        raise SettingsError(f"{done}could not write {str(path)!r}: {err.strerror or err}; free some space or choose another --report-dir.") from err


def _write_report(path: Path, result: TuneResult, settings: ExportSettings, published: Any, extra: dict[str, Any] | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    published_json = None if published is None else published.to_json()
    doc = {
        "result": result.to_json(),
        "settings": settings.to_dict(),
        "published": published_json,
        # the published config's open-loop capacity (--rate or --latency-budget-ms), where fleet sizing and validate read it
        "capacity": ((published_json or {}).get("served_search") or {}).get("capacity"),
        **(extra or {}),
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, path)
    (path.parent / "settings.toml").write_text(settings.to_toml())
    return path
