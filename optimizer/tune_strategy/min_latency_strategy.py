"""MinLatencyStrategy: the lowest p50 latency at batch 1."""

from __future__ import annotations

from optimizer.task.evaluation import Candidate
from optimizer.tune_strategy import default_backends
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy


class MinLatencyStrategy(MultiBackendStrategy):
    """Ranks by p50 latency of a single sample; the max batch size is still searched for the config."""

    name = "min-latency"
    higher_is_better = False

    def _default_aot_backends(self, distributed: bool) -> list[str]:
        return default_backends.aot(distributed, self.device)

    def _default_jit_backends(self, distributed: bool) -> list[str]:
        return default_backends.jit(distributed)

    def _metric(self, cand: Candidate) -> float | None:
        if not cand.decision or not cand.decision.profiles:
            return None
        p = cand.decision.profile_at(1) or min(cand.decision.profiles, key=lambda p: p.batch_size)
        return p.p50_ms
