"""Progress as a stream of events: the pipeline emits them, the CLI renders them (rich or plain lines).

What a renderer may rely on (optimizer/report/progress.py relies on nothing else):

- `phase` is one of PHASES; `state` is "start", "progress", "done", "failed" or "skipped".
- Events with a `candidate` and a phase in CANDIDATE_PHASES describe that candidate. For each
  candidate that runs: build start, build done, correctness start, correctness done, profile start,
  one profile progress per measured batch size (message "batch N: ..."), then profile done. A
  candidate that stops early ends with one "failed" event (in the phase where it stopped); one that
  cannot run here gets one build "skipped". `done`/`total` count finished candidates (eager included).
- Every other event describes a whole phase of the run (load, signature, reference, select,
  publish, report, validate): start, then done / failed / skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PHASES = ("load", "signature", "reference", "build", "correctness", "profile", "select", "publish", "report", "validate")

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
