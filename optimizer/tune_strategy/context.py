"""TuneContext: what a strategy needs to tune one model, gathered by the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.events import EventSink, ignore
from optimizer.model.signature import Signature
from optimizer.model.source import LoadedModel
from optimizer.task.correctness import Tolerance
from optimizer.task.profiling import ProfileSettings
from optimizer.task.reference_set import ReferenceSet


@dataclass
class TuneContext:
    """The loaded model, its signature and reference, where to work, and the run's limits."""

    model: LoadedModel
    signature: Signature
    reference: ReferenceSet
    workdir: Path
    device: str = "cpu"
    precision: str = "fp32"  # --precision every candidate builds at (eager, the baseline, stays fp32)
    recorded_batch_sizes: tuple[int, ...] = ()
    build_timeout_s: float | None = 900.0
    profile_timeout_s: float | None = 900.0
    time_budget_s: float | None = None
    profile: ProfileSettings = field(default_factory=ProfileSettings)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    state_dict: str | None = None
    on_event: EventSink = ignore
    cache: Any = None  # optimizer.task.cache.ArtifactCache when caching is on
