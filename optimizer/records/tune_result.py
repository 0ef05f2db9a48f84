"""TuneResult: the plain, JSON-serializable record of a tuning run; publishing and reporting need nothing else."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from optimizer.errors import Interrupted, NoCandidateError, OptimizerError, PublishError, SettingsError
from optimizer.records.candidate import Candidate
from optimizer.records.reference_set import ReferenceSet

SCHEMA = 1


@dataclass
class Unpublished:
    """Why a tuned run publishes nothing: the error the export raises once the report is written, and whether report.md
    and the plots are rendered for it (not for a failed accuracy check or an interruption)."""

    error: OptimizerError
    render: bool


@dataclass
class TuneResult:
    """Every candidate with status and reason, the selected one, and the max batch size it supports."""

    model_name: str
    source: dict[str, str]
    signature: dict[str, Any]
    device: str
    strategy: str
    workflow: str
    candidates: list[Candidate]
    eager: Candidate | None
    selected: str | None
    max_batch_size: int
    selection_reason: str
    reference: ReferenceSet
    eager_gate: str = "enabled"
    warnings: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    tune_seconds: float = 0.0
    latency_budget_ms: float | None = None
    percentile: int = 95
    interrupted: bool = False
    tolerances: dict[str, list[float]] = field(default_factory=dict)  # the selected candidate's overrides: output (or "") -> [atol, rtol]
    comparison: dict[str, Any] | None = None  # task/paired.PairedComparison: a close call re-measured in pairs
    triton_release: dict[str, Any] | None = None  # task/release_gate.ReleaseGate.to_json(): the target release's facts and checks
    measured_on: dict[str, Any] | None = None  # task/core_share.CoreShare.to_json(): the cores every measurement ran on, and why
    traffic: dict[str, Any] | None = None  # records/traffic.TrafficSummary.to_json(): the traffic the run was tuned for
    precision: dict[str, Any] | None = None  # --precision other than fp32: requested, the candidates' precisions, what auto left out and why, the gate's budget

    @property
    def selected_candidate(self) -> Candidate:
        for c in self.candidates:
            if c.name == self.selected:
                return c
        raise PublishError("this result has no selected candidate; nothing can be published from it.")

    def why_not_published(self, name: str, report_path: Any) -> Unpublished | None:
        """A failed accuracy check, an interruption or no publishable candidate ends the run (None: publish). Once the
        accuracy check passed, the result takes the published name `name`."""
        broken = next((c for c in self.candidates if c.stage == "accuracy_check"), None)
        if broken is not None:  # the user's check failed on a candidate's outputs: nothing is published
            return Unpublished(SettingsError(broken.reason), render=False)
        self.model_name = name
        if self.interrupted:
            return Unpublished(Interrupted(f"interrupted; candidate processes were stopped, the repository was not changed, partial results "
                                           f"are in {report_path}."), render=False)
        if self.selected is None:
            reasons = "; ".join(f"{c.name}: {c.status} ({c.reason})" for c in self.candidates) or "no candidates"
            return Unpublished(NoCandidateError(f"no candidate can be published ({reasons}). Details in {report_path}."), render=True)
        return None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = SCHEMA
        d["candidates"] = [c.to_json() for c in self.candidates]
        d["eager"] = self.eager.to_json() if self.eager else None
        d["reference"] = self.reference.to_json()
        if d["precision"] is None:  # a --precision fp32 run writes the report it always wrote
            del d["precision"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TuneResult:
        d = dict(d)
        d.pop("schema", None)
        d["candidates"] = [Candidate.from_json(c) for c in d["candidates"]]
        d["eager"] = Candidate.from_json(d["eager"]) if d.get("eager") else None
        d["reference"] = ReferenceSet.from_json(d["reference"])
        return cls(**d)
