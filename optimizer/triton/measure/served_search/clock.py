"""The served search's time: one budget, the part of it the exploration may use, and what repeats cost.

The budget (--serve-search-seconds) is a bound, not a target: a group of variants that would not finish in it is not
started. Time spent waiting out other processes' load and measuring again moves the deadlines back (REMEASURE_SHARE of
the budget at most), so the repeats do not cut the search short.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

STABLE_WINDOWS = 3  # perf_analyzer reports the mean of its last three stable windows (measure.measure_level)
EXIT_S = 0.25  # perf_analyzer's report and exit after its last window
REMEASURE_SHARE = 0.25
"""Of the budget, the most that waiting and measuring again may take: past it a disturbed measurement stands, so a machine
busy on and off still gets its variants measured. The time is added to the budget (a busy search takes up to 1.25x it)."""


class OutOfTime(Exception):
    """The next variant would not finish within --serve-search-seconds."""


@dataclass
class BudgetClock:
    """The deadline, the exploration's own deadline, and what variants have cost so far."""

    budget_s: float
    deadline: float
    now: Callable[[], float] = time.monotonic
    explore_deadline: float = 0.0  # the coarse pass and the refinement stop here, leaving later stages their time
    retried_s: float = 0.0  # waiting for others' load to fall and measuring again
    costs: list[float] = field(default_factory=list)  # seconds per variant measured after the start
    start_cost: float = 0.0  # the start loads alone, so it costs more than a group's share

    def __post_init__(self) -> None:
        self.explore_deadline = self.explore_deadline or self.deadline

    @classmethod
    def starting_now(cls, budget_s: float, now: Callable[[], float] = time.monotonic) -> BudgetClock:
        """A clock whose deadline is `budget_s` from now."""
        return cls(budget_s, now() + budget_s, now)

    def record_cost(self, start: bool, seconds: float) -> None:
        """One variant's cost (load share, warm-up and measurement), for planning the rest."""
        if start:
            self.start_cost = seconds
        else:
            self.costs.append(seconds)

    def variant_cost(self) -> float:
        """The slowest variant measured after the start, else the start's."""
        return max(self.costs) if self.costs else self.start_cost

    held = staticmethod(lambda: 0.0)
    """(not a field) Seconds held back for a stage after the search (holding_back), worked out when asked: it may grow with what
    variants cost."""

    def _ends(self, explore: bool) -> float:
        end = self.deadline - self.held()
        return min(end, self.explore_deadline) if explore else end

    def fits(self, wanted: int) -> int:
        """How many more variants fit before the exploration's deadline at the slowest cost so far."""
        cost = self.variant_cost()
        if not cost:
            return wanted
        return max(0, min(wanted, int((self._ends(True) - self.now()) // cost)))

    def passed(self, seconds: float = 0.0, explore: bool = False) -> bool:
        """Whether `seconds` from now would be past the deadline (the exploration's, when `explore`)."""
        return self.now() + seconds > self._ends(explore)

    @staticmethod
    def level_cost(window_ms: int) -> float:
        """Seconds one level of a loaded variant takes: three stable windows, perf_analyzer's exit, a second for its start
        and the warm-up."""
        return STABLE_WINDOWS * window_ms / 1000.0 + EXIT_S + 1.0

    def settle_cost(self, loads: int, robust: bool, window_ms: int) -> float:
        """Seconds a settling takes: both variants, every round, at each of `loads` loads (a ladder with the search's
        window, a target load with twice it), and one load."""
        per_level = max(1.5, 3 * window_ms / 1000.0) if robust else max(2.0, 3 * 2 * window_ms / 1000.0)
        return 2 * 2 * loads * per_level + self.variant_cost()

    def may_retake(self, seconds: float) -> bool:
        """Whether measuring again (waiting, then `seconds` of measuring) fits the exploration and REMEASURE_SHARE."""
        return self.now() + seconds <= self._ends(True) and self.retried_s + seconds <= REMEASURE_SHARE * self.budget_s

    def add_retake(self, seconds: float) -> None:
        """Time spent waiting out others' load and measuring again: it moves the deadlines back."""
        self.retried_s += seconds
        self.deadline += seconds
        self.explore_deadline += seconds

    @contextmanager
    def keeping(self, seconds: float) -> Iterator[None]:
        """Within the block the exploration stops `seconds` before the deadline (the time kept for later stages)."""
        self.explore_deadline = self.deadline - seconds
        try:
            yield
        finally:
            self.explore_deadline = self.deadline

    @contextmanager
    def holding_back(self, seconds: Callable[[], float]) -> Iterator[None]:
        """Within the block the whole search stops `seconds()` earlier: time kept for a stage that follows it, worked out
        at each check (so it can grow with what a variant costs). Nested blocks add up: each later stage keeps its time."""
        before = self.held
        self.held = lambda: before() + seconds()
        try:
            yield
        finally:
            self.held = before
