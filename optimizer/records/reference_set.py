"""ReferenceSet: where a run's shared ground truth lies (samples, reference outputs, profiling feeds, traffic) and its labels."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReferenceSet:
    """Paths of the sample and reference files and the label of each correctness case."""

    feeds: str
    outputs: str
    points: list[str]
    profile_feed: str  # npz: the traffic's median request, its p90 request and its largest (profiling, the tail, the fit check)
    traffic: str | None = None  # npz: the traffic's requests, batch-1 each (model/traffic.py); None in reports written before it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReferenceSet:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
