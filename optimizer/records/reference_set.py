"""ReferenceSet: where a run's shared ground truth lies (samples, reference outputs, profiling feed) and its labels."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReferenceSet:
    """Paths of the sample and reference files and the label of each correctness case."""

    feeds: str
    outputs: str
    points: list[str]
    profile_feed: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReferenceSet:
        return cls(**d)
