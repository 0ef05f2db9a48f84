"""Fleet progress: models done and left, as a live display on a terminal or plain lines elsewhere.

One export's own progress (candidates, batch sizes) stays in that model's export.log: with several models
at once it would interleave into noise. The choice of renderer follows report/progress.py's rules.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from optimizer.fleet.job import ModelOutcome
from optimizer.report.progress import plain_text, wants_rich


def outcome_line(o: ModelOutcome, with_status: bool = True) -> str:
    """A model's outcome in one line: its status, then the published backend and numbers, or the reason."""
    status = o.status if with_status else ""
    if o.status in ("published", "unchanged") and o.backend:
        rate = f", {o.throughput:.1f}/s" if o.throughput else ""
        return f"{status} {o.backend}, max batch {o.max_batch_size}{rate}".strip()
    return ": ".join(p for p in (status, o.reason) if p)


class FleetProgress:
    """Counts models as they start and finish; plain lines ("[   41.2s] published cnn | onnxruntime[cpu], max batch 4 [1/2 done, 1 left]") or rich."""

    def __init__(self, total: int, verbosity: int = 0, stream: IO[str] | None = None) -> None:
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.verbosity = verbosity
        self._rich: Any = None
        self._lines: dict[str, Any] = {}
        self._t0 = time.monotonic()

    def __enter__(self) -> FleetProgress:
        self._t0 = time.monotonic()
        if wants_rich(self.stream, self.verbosity):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.fields[status]}", markup=False),
                                  console=Console(file=self.stream))
            self._rich.start()
            self._lines["fleet"] = self._rich.add_task("models", total=self.total, status=self._left())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.stop()

    def _left(self) -> str:
        return f"{self.done}/{self.total} done, {self.total - self.done} left"

    def _plain(self, state: str, name: str, message: str = "") -> None:
        if self.verbosity < -1 or (self.verbosity == -1 and state == "start"):
            return
        text = " | ".join(p for p in (plain_text(name), plain_text(message)) if p)
        self.stream.write(f"[{time.monotonic() - self._t0:7.1f}s] {state:<9} {text} [{self._left()}]\n")
        self.stream.flush()

    def started(self, name: str) -> None:
        """A model's export began (on this machine, or as a Ray task)."""
        if self._rich is None:
            self._plain("start", name)
            return
        self._lines[name] = self._rich.add_task(f"  {name}", total=1, status="exporting...")

    def finished(self, outcome: ModelOutcome) -> None:
        """A model ended, whatever its status: one more done."""
        self.done += 1
        if self._rich is None:
            self._plain(outcome.status, outcome.name, outcome_line(outcome, with_status=False))
            return
        line = self._lines.get(outcome.name) or self._rich.add_task(f"  {outcome.name}", total=1, status="")
        self._rich.update(line, completed=1, status=plain_text(outcome_line(outcome)))
        self._rich.update(self._lines["fleet"], completed=self.done, status=self._left())
