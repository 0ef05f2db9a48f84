"""MaxThroughputStrategy (the default): the highest throughput, each candidate at its own best batch."""

from __future__ import annotations

from optimizer.records.candidate import Candidate
from optimizer.tune_strategy.default_backends import DefaultBackendsMixin
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy


class MaxThroughputStrategy(DefaultBackendsMixin, MultiBackendStrategy):
    """Ranks by throughput at the candidate's best measured batch (within the latency budget, if any)."""

    name = "max-throughput"
    settles_close_calls = True  # its metric is the throughput task/paired.py re-measures

    def _metric(self, cand: Candidate) -> float | None:
        return cand.best_throughput if cand.decision and cand.decision.profiles else None
