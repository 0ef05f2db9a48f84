"""Artifact: what a build produced, as plain data that crosses process boundaries and lands in report.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optimizer.records.triton_platforms import PLATFORMS, TritonPlatform


@dataclass
class Artifact:
    """What a build produced: files in `directory` plus the facts needed to load, publish and report it."""

    backend: str
    device: str
    directory: str
    files: list[str]  # relative to directory; files[0] is the model file Triton loads
    signature: dict[str, Any]  # Signature.to_json() of the tensors as the artifact names them
    triton_platform: str | None  # key into PLATFORMS; None when it cannot be published
    triton_settings: dict[str, Any] = field(default_factory=dict)  # platform-specific config fragment
    metadata: dict[str, Any] = field(default_factory=dict)  # opset, precision, versions, build time...
    batch_range: tuple[int, int] = (1, 1)  # the batch sizes the artifact was built to accept

    def __post_init__(self) -> None:
        self.device = str(self.device)  # a vocab.Device from the parent, text from a child: records keep text

    @property
    def path(self) -> Path:
        return Path(self.directory) / self.files[0] if self.files else Path(self.directory)

    @property
    def platform(self) -> TritonPlatform | None:
        return PLATFORMS[self.triton_platform] if self.triton_platform else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["batch_range"] = list(self.batch_range)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Artifact:
        d = dict(d)
        d["batch_range"] = tuple(d.get("batch_range", (1, 1)))
        return cls(**d)
