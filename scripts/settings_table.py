"""Rewrite the settings table of docs/exporting.md from ExportSettings (run after adding an option):

    .venv/bin/python scripts/settings_table.py
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, fields
from pathlib import Path

from optimizer.settings import ExportSettings, key_of

PAGE = Path(__file__).resolve().parents[1] / "docs" / "exporting.md"
START, END = "<!-- settings-table -->", "<!-- /settings-table -->"


def toml_value(value: object) -> str:
    """A default as the settings file writes it (true, not True; strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # a string or a list of strings: TOML's basic strings are JSON's


def table() -> str:
    rows = ["| key (option) | default | meaning |", "|---|---|---|"]
    for f in fields(ExportSettings):
        key = key_of(f.name)
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        option = "MODEL argument" if key == "model" else f"--{key}"
        shown = "" if default in (None, []) else f"`{toml_value(default)}`"
        rows.append(f"| `{key}` ({option}) | {shown} | {f.metadata['help'].replace('|', '/')} |")
    return "\n".join(rows)


def main() -> None:
    text = PAGE.read_text()
    new = re.sub(f"{re.escape(START)}.*?{re.escape(END)}", f"{START}\n{table()}\n{END}", text, flags=re.S)
    PAGE.write_text(new)


if __name__ == "__main__":
    main()
