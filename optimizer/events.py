"""Progress as a stream of events: the pipeline emits them, the CLI renders them (rich or plain lines)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PHASES = ("load", "signature", "reference", "build", "correctness", "profile", "select", "publish", "report", "validate")


@dataclass(frozen=True)
class Event:
    """One step of a run. `state` is "start", "progress", "done", "failed" or "skipped"; `done`/`total` count steps."""

    phase: str
    state: str
    candidate: str = ""
    message: str = ""
    done: int = 0
    total: int = 0
    elapsed_s: float = 0.0


EventSink = Callable[[Event], None]


def ignore(_: Event) -> None:
    """The default sink: library calls stay silent unless the caller listens."""
