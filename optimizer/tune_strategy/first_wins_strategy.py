"""FirstWinsStrategy: the first candidate, in order, that builds, is correct and beats eager."""

from __future__ import annotations

from typing import Sequence

from optimizer.records.candidate import Candidate
from optimizer.tune_strategy.default_backends import DefaultBackendsMixin
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy


class FirstWinsStrategy(DefaultBackendsMixin, MultiBackendStrategy):
    """Candidate order is the ranking; eager's throughput is the bar (the gate decides what happens below it)."""

    name = "first-wins"

    def _metric(self, cand: Candidate) -> float | None:
        return cand.best_throughput if cand.decision and cand.decision.profiles else None

    def _rank(self, passed: Sequence[Candidate], eager: Candidate | None) -> tuple[Candidate | None, str]:
        for c in passed:
            if self._metric(c) is not None:
                return c, f"{c.name} is the first candidate in order that passed ({self._fmt(self._metric(c))})"
        return None, "no candidate has a measurement"
