"""Reading report.json back into records: the TuneResult, the settings that produced it, the whole document.

Here, at the bottom, because three layers read reports: the report renderer, validation (triton/) and
republish (app/); report/json_report.py writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optimizer.errors import SettingsError
from optimizer.records.tune_result import TuneResult
from optimizer.settings import ExportSettings, settings_from


def read_report(path: Path) -> tuple[TuneResult, ExportSettings, dict[str, Any]]:
    """A report written by write_report: the result, the settings and the whole document."""
    if not path.is_file():
        raise SettingsError(f"report {str(path)!r} does not exist; give the report.json of a finished export.")
    try:
        doc = json.loads(path.read_text())
        return TuneResult.from_json(doc["result"]), settings_from(doc["settings"]), doc
    except (ValueError, KeyError, TypeError) as err:
        raise SettingsError(f"{str(path)!r} is not an aitune-export report ({type(err).__name__}: {err}).") from err
