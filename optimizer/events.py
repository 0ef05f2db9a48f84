"""Progress as a stream of events: the pipeline emits them, the CLI renders them (rich or plain lines).

What a renderer may rely on (optimizer/report/progress.py relies on nothing else):

- `phase` is one of PHASES; `state` is "start", "progress", "done", "failed" or "skipped".
- Events with a `candidate` and a phase in CANDIDATE_PHASES describe that candidate; a candidate's
  last event is its profile "done", or a "failed" / "skipped" in any of those phases
  (`ends_candidate`). Each measured batch size is a profile "progress" whose message starts with
  "batch N:". Other events of a candidate (build/correctness done, stage changes) are informative.
- `done` / `total` count the finished steps of tuning (0 / 0 when an event is not counted).
- Every other event describes a whole phase of the run (load, signature, reference, select,
  serve, publish, report, validate): start, then done / failed / skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PHASES = ("load", "signature", "reference", "build", "correctness", "profile", "select", "serve", "publish", "report", "validate")

CANDIDATE_PHASES = frozenset({"build", "correctness", "profile"})
"""Phases whose events belong to one candidate (they share that candidate's progress line)."""


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


def ends_candidate(e: Event) -> bool:
    """True for the last event of a candidate: profile done, or failed / skipped anywhere (its `done` counts it)."""
    return bool(e.candidate) and e.phase in CANDIDATE_PHASES and (
        e.state in ("failed", "skipped") or (e.phase == "profile" and e.state == "done")
    )


def ignore(_: Event) -> None:
    """The default sink: library calls stay silent unless the caller listens."""
