"""FindMaxBatchSizeMixin: a strategy's batch-size policy, searched per candidate (not on eager alone)."""

from __future__ import annotations

from typing import Sequence

from optimizer.errors import SettingsError
from optimizer.records.measurements import BatchPolicy
from optimizer.vocab import MAX_BATCH_SIZE_LIMIT, PERCENTILES


class FindMaxBatchSizeMixin:
    """Holds max_batch_size ("auto" or N), the latency budget and percentile, the memory budget and the
    search switch; `batch_policy()` turns them into the policy each candidate's search follows."""

    def _init_batch_policy(
        self,
        max_batch_size: int | str | None = "auto",
        latency_budget_ms: float | None = None,
        percentile: int = 95,
        memory_budget_mb: float | None = None,
        find_max_batch_size: bool = True,
        search_cap: int = 256,
    ) -> None:
        if max_batch_size in (None, "auto"):
            self.max_batch_size: int | None = None
        else:
            try:
                self.max_batch_size = int(max_batch_size)
            except (TypeError, ValueError):
                raise SettingsError(f"max_batch_size {max_batch_size!r} is not a number or 'auto'.") from None
            if not 1 <= self.max_batch_size <= MAX_BATCH_SIZE_LIMIT:
                raise SettingsError(f"max_batch_size {self.max_batch_size} must be from 1 to {MAX_BATCH_SIZE_LIMIT} (Triton's int32), or 'auto'.")
        if latency_budget_ms is not None and latency_budget_ms <= 0:
            raise SettingsError(f"latency budget {latency_budget_ms} ms must be positive.")
        if percentile not in PERCENTILES:
            raise SettingsError(f"percentile {percentile} is not one of {', '.join(map(str, PERCENTILES))}.")
        self.latency_budget_ms = latency_budget_ms
        self.percentile = percentile
        self.memory_budget_mb = memory_budget_mb
        self.find_max_batch_size = find_max_batch_size
        self.search_cap = search_cap

    def batch_policy(self, recorded_batch_sizes: Sequence[int] = ()) -> BatchPolicy:
        """The search policy; without discovery only the recorded batch sizes (or batch 1) are measured."""
        fixed = None
        if not self.find_max_batch_size:
            fixed = tuple(sorted(set(recorded_batch_sizes))) or (1,)
            if self.max_batch_size:
                fixed = tuple(b for b in fixed if b <= self.max_batch_size) or (1,)
        return BatchPolicy(
            max_batch_size=self.max_batch_size,
            search_cap=self.search_cap,
            latency_budget_ms=self.latency_budget_ms,
            percentile=self.percentile,
            batch_sizes=fixed,
        )
