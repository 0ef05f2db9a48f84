"""LatencyBudgetStrategy: the highest throughput whose chosen percentile latency stays within the budget."""

from __future__ import annotations

from typing import Any

from optimizer.errors import SettingsError
from optimizer.records.candidate import Candidate
from optimizer.tune_strategy.default_backends import DefaultBackendsMixin
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy


class LatencyBudgetStrategy(DefaultBackendsMixin, MultiBackendStrategy):
    """The batch search stops at the budget; ranking uses only batch sizes whose percentile fits it."""

    name = "latency-budget"

    def __init__(self, budget_ms: float | None = None, percentile: int = 95, **kwargs: Any) -> None:
        budget_ms = budget_ms if budget_ms is not None else kwargs.pop("latency_budget_ms", None)
        kwargs.pop("latency_budget_ms", None)
        if budget_ms is None:
            raise SettingsError("the latency-budget strategy needs a budget; add --latency-budget-ms MS.")
        super().__init__(latency_budget_ms=budget_ms, percentile=percentile, **kwargs)

    @property
    def budget_ms(self) -> float:
        return float(self.latency_budget_ms or 0.0)

    def _metric(self, cand: Candidate) -> float | None:
        if not cand.decision:
            return None
        fitting = [p for p in cand.decision.profiles if p.percentile_ms(self.percentile) <= self.budget_ms]
        return max((p.throughput for p in fitting), default=None)

    def _metric_label(self) -> str:
        return f"highest throughput within p{self.percentile} <= {self.budget_ms:g} ms"
