"""Renderers of the pipeline's Event stream: a live `rich` display on a terminal, plain lines elsewhere.

The CLI only chooses one (`choose_progress`); both are event sinks and context managers. They rely
on the contract written in optimizer/events.py and on nothing inside the pipeline, so the pipeline
can be restructured without touching them.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import IO, Any

from optimizer.events import CANDIDATE_PHASES, Event, ends_candidate

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def plain_text(text: str) -> str:
    """`text` on one line without control characters (escape sequences, carriage returns, newlines)."""
    return _CONTROL.sub(" ", text).strip()


class PlainProgress:
    """Progress as plain start/finish lines with the run's elapsed time, for logs, CI and pipes.

    Lines carry no control characters, so they read the same in a file, a CI log or a terminal.
    `detail` is "normal" (every step, one line per measured batch size), "quiet" (finished steps
    only) or "silent" (nothing).
    """

    DETAILS = ("normal", "quiet", "silent")

    def __init__(self, stream: IO[str] | None = None, detail: str = "normal") -> None:
        if detail not in self.DETAILS:
            raise ValueError(f"detail {detail!r} is not one of {', '.join(self.DETAILS)}")
        self.stream = stream
        self.detail = detail
        self._t0 = time.monotonic()

    def __enter__(self) -> PlainProgress:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def line(self, e: Event) -> str | None:
        """The line for one event (None: nothing at this detail)."""
        if self.detail == "silent" or (self.detail == "quiet" and e.state in ("start", "progress")):
            return None
        if e.state == "progress" and not e.message:
            return None
        text = " | ".join(p for p in (plain_text(e.candidate), plain_text(e.message)) if p)
        count = f" [{e.done}/{e.total}]" if e.total else ""
        elapsed = time.monotonic() - self._t0
        return plain_text(f"[{elapsed:7.1f}s] {e.phase:<11} {e.state:<8} {text}{count}")

    def __call__(self, e: Event) -> None:
        text = self.line(e)
        if text is None:
            return
        stream = self.stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()


class RichProgress:
    """A live display on a terminal: one line per phase and per candidate, with elapsed time and what is left.

    Log records of the "optimizer" logger are printed above the display while it runs. Pass a
    `console` to render elsewhere (tests); by default it draws on stderr.
    """

    def __init__(self, console: Any = None, auto_refresh: bool = True) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.table import Column

        self.console = console or Console(stderr=True)
        fixed = dict(no_wrap=True)
        self.progress = Progress(
            _state_column(SpinnerColumn(table_column=Column(width=1, **fixed))),
            TextColumn("{task.description}", style="bold", markup=False, table_column=Column(**fixed)),  # "[cpu]" is not markup
            TimeElapsedColumn(table_column=Column(**fixed)),
            TextColumn("{task.fields[status]}", markup=False, table_column=Column(ratio=1, overflow="ellipsis", **fixed)),
            _left_column(Column(**fixed)),
            console=self.console,
            auto_refresh=auto_refresh,
            expand=True,
        )
        self._lines: dict[str, Any] = {}
        self._handlers: list[tuple[logging.StreamHandler, IO[str]]] = []

    def __enter__(self) -> RichProgress:
        self.progress.start()
        # the live display swapped sys.stderr for a proxy that prints above it: send log lines there too
        proxied = getattr(sys.stderr, "rich_proxied_file", None)
        if proxied is not None:
            for h in logging.getLogger("optimizer").handlers:
                if isinstance(h, logging.StreamHandler) and h.stream is proxied:
                    self._handlers.append((h, h.setStream(sys.stderr)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h, stream in self._handlers:
            h.setStream(stream)
        self._handlers.clear()
        self.progress.refresh()
        self.progress.stop()

    def _line(self, key: str, description: str) -> Any:
        if key not in self._lines:
            self._lines[key] = self.progress.add_task(description, total=1, status="", left="", icon="")
        return self._lines[key]

    def _finish(self, task: Any, state: str, status: str) -> None:
        icon = {"done": "[green]✓[/]", "failed": "[red]✗[/]", "skipped": "[yellow]-[/]"}.get(state, "")
        self.progress.update(task, completed=self.progress.tasks[self._index(task)].total, status=status, icon=icon)

    def _index(self, task: Any) -> int:
        return next(i for i, t in enumerate(self.progress.tasks) if t.id == task)

    def _candidate_event(self, e: Event, message: str) -> None:
        tune = self._line("tune", "tune")
        task = self._line(f"candidate:{e.candidate}", f"  {e.candidate}")
        if ends_candidate(e):
            self._finish(task, e.state, message)
        else:  # a bare stage word ("measure") says no more than the phase
            self.progress.update(task, status=f"{e.phase}: {message}" if " " in message else f"{e.phase}...")
        if e.total:
            left = e.total - e.done
            self.progress.update(tune, total=e.total, completed=e.done, status=f"{e.done}/{e.total} steps done",
                                 left=f"{left} left" if left else "")
            if not left:
                self._finish(tune, "done", f"{e.total}/{e.total} steps done")

    def __call__(self, e: Event) -> None:
        message = plain_text(e.message)
        if e.candidate and e.phase in CANDIDATE_PHASES:
            self._candidate_event(e, message)
            return
        task = self._line(e.phase, e.phase)
        status = " | ".join(p for p in (e.candidate, message) if p)
        if e.state in ("done", "failed", "skipped"):
            self._finish(task, e.state, status)
        else:
            self.progress.update(task, status=status or "...")


def _state_column(spinner: Any) -> Any:
    """A column showing a spinner while a line runs, then its outcome (the icon field: ✓, ✗ or -)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class StateColumn(ProgressColumn):
        def render(self, task: Any) -> Any:
            if task.finished and task.fields.get("icon"):
                return Text.from_markup(task.fields["icon"])
            return spinner.render(task)

    return StateColumn(table_column=spinner.get_table_column())


def _left_column(column: Any) -> Any:
    """What is left of a counted line: its `left` field and, once one step finished, the time the rest should take."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class LeftColumn(ProgressColumn):
        def render(self, task: Any) -> Any:
            text = task.fields.get("left", "")
            if text and task.total and 0 < task.completed < task.total and task.elapsed:
                eta = task.elapsed / task.completed * (task.total - task.completed)
                text += f", about {_duration(eta)}"
            return Text(text, style="dim")

    return LeftColumn(table_column=column)


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def wants_rich(stream: IO[str], verbosity: int) -> bool:
    """A live display only on a real terminal at the default verbosity (logs of -v would interleave)."""
    if verbosity != 0 or os.environ.get("TERM") == "dumb" or os.environ.get("CI"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def choose_progress(verbosity: int, stream: IO[str] | None = None) -> PlainProgress | RichProgress:
    """The renderer for this run: rich on a terminal, plain lines otherwise or with -q / -v (-qq: none)."""
    stream = stream or sys.stderr
    if wants_rich(stream, verbosity):
        return RichProgress()
    detail = "normal" if verbosity >= 0 else ("quiet" if verbosity == -1 else "silent")
    return PlainProgress(stream, detail)
