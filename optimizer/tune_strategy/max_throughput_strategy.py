"""MaxThroughputStrategy (the default): the highest throughput, each candidate at its own best batch."""

from __future__ import annotations

from optimizer.task.evaluation import Candidate
from optimizer.tune_strategy import default_backends
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy


class MaxThroughputStrategy(MultiBackendStrategy):
    """Ranks by throughput at the candidate's best measured batch (within the latency budget, if any)."""

    name = "max-throughput"

    def _default_aot_backends(self, distributed: bool) -> list[str]:
        return default_backends.aot(distributed, self.device)

    def _default_jit_backends(self, distributed: bool) -> list[str]:
        return default_backends.jit(distributed)

    def _metric(self, cand: Candidate) -> float | None:
        return cand.best_throughput if cand.decision and cand.decision.profiles else None
