"""validation.json: the plain record of what one validation found, and how it is written."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optimizer.errors import ValidationError
from optimizer.triton.measure.answers import AnswerCheck

STAND_IN_LABEL = "stand-in backend"
"""Every result served by a stand-in carries this label, in the CLI output and in validation.json."""

VALIDATION_FILENAME = "validation.json"
STATUSES = ("passed", "failed", "not validated")


@dataclass
class ValidationRecord:
    """Everything one validation found; plain data (validation.json)."""

    model: str
    repository: str
    server: str
    platform: str
    backend: str
    status: str = "failed"
    reason: str = ""
    served_by: str = ""  # "native backend", or STAND_IN_LABEL + what ran
    stand_in: bool = False
    loaded: bool = False
    load_s: float | None = None
    served_config: dict[str, Any] = field(default_factory=dict)
    answers: list[AnswerCheck] = field(default_factory=list)
    oversize: dict[str, Any] | None = None
    perf: dict[str, Any] | None = None
    server_batch: float | None = None  # inference count / execution count over the whole sweep
    predicted_throughput: float | None = None
    predicted_batch: int | None = None
    predicted_by: str = ""
    predicted_how: str = ""  # in-process at a batch, or the served search's measurement at its concurrency
    predicted_concurrency: int | None = None  # the ratio compares this perf_analyzer row when it was measured
    throughput_ratio: float | None = None  # served / predicted at the loads the served search did not measure (their mean)
    predictions: list[dict[str, Any]] = field(default_factory=list)  # per unmeasured load: concurrency, predicted, served, ratio
    repeatability: list[dict[str, Any]] = field(default_factory=list)  # per load the search measured: concurrency, searched, served, ratio
    export_report: str | None = None
    output_dir: str = ""
    notes: list[str] = field(default_factory=list)
    traffic: str = ""  # what perf_analyzer sent: the export's traffic (padded as its clients are told), --traffic, or the profiled sample
    open_loop: dict[str, Any] | None = None  # the open-loop check (open_loop.open_loop_record); None: no rate asked or claimed
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Only "passed" passes: "failed" and "not validated" both count as not proven."""
        return self.status == "passed"

    def to_json(self) -> dict[str, Any]:
        """The record as validation.json holds it (the report's Markdown reads this shape)."""
        return asdict(self)

    def raise_for_status(self) -> None:
        """ValidationError (exit status 1) unless the model loaded, answered correctly and was measured."""
        if self.status != "passed":
            raise ValidationError(f"{self.model}: {self.status}: {self.reason}")

    def write(self, folder: Path) -> Path:
        """validation.json, written atomically (concurrent validations of one model never interleave)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / VALIDATION_FILENAME
        self.output_dir = str(folder)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f".{VALIDATION_FILENAME}.", delete=False) as tmp:
            json.dump(self.to_json(), tmp, indent=2, default=str)
        os.replace(tmp.name, path)
        return path
