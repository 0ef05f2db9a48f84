"""Candidate: a backend on a device and everything learned about it (build, correctness, measurements, reason)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from optimizer.records.artifact import Artifact
from optimizer.records.correctness import CorrectnessReport
from optimizer.records.measurements import MaxBatchDecision

STATUSES = ("passed", "failed", "unavailable", "skipped")
"""Final statuses; "built" exists only between the two steps."""


@dataclass
class Candidate:
    """A backend on a device and everything learned about it. `status` is "passed" only when it is deployable."""

    name: str
    backend: str
    device: str
    status: str = "skipped"
    stage: str = ""  # where it stopped: availability, build, load, correctness, measure, crash, timeout
    reason: str = ""
    artifact: Artifact | None = None
    build_s: float = 0.0
    measure_s: float = 0.0
    correctness: CorrectnessReport | None = None
    decision: MaxBatchDecision | None = None
    ceiling_estimate: int | None = None
    log: str = ""
    cached: str = ""  # "", "build" or "build+measure": what was reused from the cache
    versions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.device = str(self.device)  # records keep the device as the text users wrote ("cuda:1")

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def best_throughput(self) -> float:
        return self.decision.best.throughput if self.decision is not None and self.decision.profiles else 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["artifact"] = self.artifact.to_json() if self.artifact is not None else None
        d["correctness"] = self.correctness.to_json() if self.correctness is not None else None
        d["decision"] = self.decision.to_json() if self.decision is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Candidate:
        d = dict(d)
        d["artifact"] = Artifact.from_json(d["artifact"]) if d.get("artifact") else None
        d["correctness"] = CorrectnessReport.from_json(d["correctness"]) if d.get("correctness") else None
        d["decision"] = MaxBatchDecision.from_json(d["decision"]) if d.get("decision") else None
        return cls(**d)
