"""TuneContext: what one tuning run needs (model, signature, reference, limits), handed from the app to the
strategy and on to the scheduler and the cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.events import EventSink, ignore
from optimizer.model.signature import Signature
from optimizer.model.loaded_model import LoadedModel
from optimizer.records.accuracy import AccuracyBudget
from optimizer.records.correctness import Tolerance
from optimizer.records.reference_set import ReferenceSet
from optimizer.task.profiling import ProfileSettings
from optimizer.vocab import Device


@dataclass
class TuneContext:
    """The loaded model, its signature and reference, where to work, and the run's limits."""

    model: LoadedModel
    signature: Signature
    reference: ReferenceSet
    workdir: Path
    device: Device | str = "cpu"  # a Device from the plan; text is accepted and parsed (tests, the Python API)
    precision: str = "fp32"  # --precision: auto or the one precision candidates build at (eager, the baseline, stays fp32)
    recorded_batch_sizes: tuple[int, ...] = ()
    build_timeout_s: float | None = 900.0
    profile_timeout_s: float | None = 900.0
    time_budget_s: float | None = None
    profile: ProfileSettings = field(default_factory=ProfileSettings)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    state_dict: str | None = None
    on_event: EventSink = ignore
    cache: Any = None  # a task.cache.ArtifactCache (which reads this context: no import back); None: --no-cache
    cache_root: Path | None = None  # the one cache root (machine.cache_root); backends that keep caches use it
    accuracy: AccuracyBudget = field(default_factory=AccuracyBudget)  # judges the bf16 / INT8 candidates
    calibration: str | None = None  # .npz of the real feeds INT8 candidates are calibrated on; None: only generated inputs

    def __post_init__(self) -> None:
        self.device = Device.of(self.device)
