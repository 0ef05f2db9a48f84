"""OneBackendStrategy: tune exactly one backend (its max batch size is still searched)."""

from __future__ import annotations

from typing import Any

from optimizer.backend import Backend
from optimizer.records.candidate import Candidate
from optimizer.tune_strategy.multi_backend_strategy import MultiBackendStrategy
from optimizer.vocab import Device


class OneBackendStrategy(MultiBackendStrategy):
    """A single explicit candidate; the eager gate still reports how it compares."""

    name = "one-backend"

    def __init__(self, backend: str | Backend, **kwargs: Any) -> None:
        kwargs.pop("backends", None)
        super().__init__(backends=[backend], **kwargs)

    def _default_aot_backends(self, distributed: bool, device: Device) -> list[str]:
        return []  # never asked: the list is always explicit

    def _default_jit_backends(self, distributed: bool) -> list[str]:
        return []

    def _metric(self, cand: Candidate) -> float | None:
        return cand.best_throughput if cand.decision and cand.decision.profiles else None
