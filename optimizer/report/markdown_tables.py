"""Markdown cells and tables, shared by report.md's sections (markdown.py and served_search_section.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ms(value: Any) -> str:
    """Milliseconds: two decimals below 100, whole numbers above."""
    if value is None:
        return ""
    v = float(value)
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def cell(text: str) -> str:
    """Text that keeps a Markdown table intact: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; every cell goes through `cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
