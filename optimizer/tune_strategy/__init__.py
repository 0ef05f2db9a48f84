"""Tune strategies, named after NVIDIA AITune's (`aitune.torch.tune_strategy`)."""

from __future__ import annotations

from types import MappingProxyType

from optimizer.records.tune_result import TuneResult
from optimizer.tune_strategy.first_wins_strategy import FirstWinsStrategy
from optimizer.tune_strategy.latency_budget_strategy import LatencyBudgetStrategy
from optimizer.tune_strategy.max_throughput_strategy import MaxThroughputStrategy
from optimizer.tune_strategy.min_latency_strategy import MinLatencyStrategy
from optimizer.tune_strategy.mixin.find_max_batch_size_mixin import FindMaxBatchSizeMixin
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy
from optimizer.tune_strategy.one_backend_strategy import OneBackendStrategy
from optimizer.tune_strategy.tune_strategy import TuneStrategy

STRATEGIES = MappingProxyType(
    {
        s.name: s
        for s in (MaxThroughputStrategy, MinLatencyStrategy, LatencyBudgetStrategy, FirstWinsStrategy, OneBackendStrategy)
    }
)
"""CLI name -> strategy class."""

__all__ = [
    "STRATEGIES",
    "FindMaxBatchSizeMixin",
    "FirstWinsStrategy",
    "LatencyBudgetStrategy",
    "MaxThroughputStrategy",
    "MinLatencyStrategy",
    "MultiBackendStrategy",
    "OneBackendStrategy",
    "TuneResult",
    "TuneStrategy",
]
