"""What perf_analyzer prints on its console: the server's counts per level, its own error lines, whether a level never
settled and which level a run was measuring. Its CSV carries the figures; the console carries these."""

from __future__ import annotations

import re

_LEVEL = re.compile(r"^Request concurrency:\s*(\d+)", re.MULTILINE)
_COUNTS = re.compile(r"Inference count:\s*(\d+)\s*\n\s*Execution count:\s*(\d+)")


def parse_server_counts(output: str) -> dict[int, tuple[int, int]]:
    """Concurrency -> (server inference count, execution count) from perf_analyzer's console report."""
    counts = {}
    starts = [(m.start(), int(m.group(1))) for m in _LEVEL.finditer(output)]
    for i, (pos, level) in enumerate(starts):
        block = output[pos: starts[i + 1][0] if i + 1 < len(starts) else len(output)]
        m = _COUNTS.search(block)
        if m:
            counts[level] = (int(m.group(1)), int(m.group(2)))
    return counts


def perf_analyzer_error(output: str) -> str:
    """perf_analyzer's own error lines, on one line."""
    lines = [l.strip() for l in output.splitlines() if re.search(r"(?i)\berror\b|failed|not found|cannot open", l)]
    return " | ".join(dict.fromkeys(lines))[:600]


def unsettled(output: str) -> bool:
    """A level perf_analyzer could not stabilize (it exits with status 2 and says so)."""
    return "Failed to obtain stable measurement" in output


def last_level(output: str) -> int | None:
    """The concurrency a run was measuring when its console ended (None before the first level began)."""
    levels = _LEVEL.findall(output)
    return int(levels[-1]) if levels else None
