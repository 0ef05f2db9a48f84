"""MinLatencyStrategy: the lowest p50 latency at batch 1."""

from __future__ import annotations

from optimizer.records.candidate import Candidate
from optimizer.tune_strategy.default_backends import DefaultBackendsMixin
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy


class MinLatencyStrategy(DefaultBackendsMixin, MultiBackendStrategy):
    """Ranks by p50 latency of a single sample; the max batch size is still searched for the config."""

    name = "min-latency"
    higher_is_better = False

    def _metric(self, cand: Candidate) -> float | None:
        if not cand.decision or not cand.decision.profiles:
            return None
        p = cand.decision.profile_at(1) or min(cand.decision.profiles, key=lambda p: p.batch_size)
        return p.p50_ms
