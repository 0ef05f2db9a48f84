"""Served-search records: an operating point of the served config, one measured variant, and the search.

Plain data with JSON round trips: the search (triton/served_search) writes them, publishing applies
the chosen point, report.json keeps every variant under `published.served_search`, and `validate`
reads the prediction back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEARCH_STATUSES = ("searched", "skipped", "off")
"""searched: measured in the local server; skipped: it could not serve this artifact (reason says why); off: not asked."""


@dataclass(frozen=True)
class OperatingPoint:
    """How Triton serves the artifact: the batcher (max, preferred sizes, queue delay) and the instance layout.

    `threads` is one instance's intra-op thread count (None: the artifact's own setting, e.g. on a GPU).
    """

    max_batch_size: int
    preferred: tuple[int, ...]
    queue_delay_us: int
    instances: int = 1
    threads: int | None = None

    @property
    def label(self) -> str:
        """One short line a table cell or a plot label can hold."""
        pref = ",".join(map(str, self.preferred)) or "-"
        return f"max {self.max_batch_size} pref [{pref}] delay {self.queue_delay_us}us {self.layout}"

    @property
    def layout(self) -> str:
        """Instances x threads each ("2x1t"), or the instance count where threads are the artifact's own."""
        return f"{self.instances}x{self.threads}t" if self.threads else f"{self.instances} inst"

    def differences(self, other: OperatingPoint) -> dict[str, list[Any]]:
        """Field -> [this value, other's value] for every field that differs (how a variant differs from the published point)."""
        mine, theirs = self.to_json(), other.to_json()
        return {k: [mine[k], theirs[k]] for k in mine if mine[k] != theirs[k]}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["preferred"] = list(self.preferred)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OperatingPoint:
        d = dict(d)
        d["preferred"] = tuple(d.get("preferred") or ())
        return cls(**d)


@dataclass
class ServedVariant:
    """One config variant measured by perf_analyzer in the local server, at the search's concurrency."""

    point: OperatingPoint
    stage: str  # "start", "instances", "batch", "queue delay", or "confirm" (the best measured again after a small win)
    status: str = "measured"  # measured, over budget, failed
    reason: str = ""
    throughput: float | None = None  # inferences (samples) per second
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    server_batch: float | None = None  # the batch the dynamic batcher really formed (inferences per execution)
    seconds: float = 0.0  # load + measurement
    differs: dict[str, list[Any]] = field(default_factory=dict)  # filled in at the end: field -> [this, published]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["point"] = self.point.to_json()
        d["label"] = self.point.label
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServedVariant:
        d = {k: v for k, v in d.items() if k != "label"}
        d["point"] = OperatingPoint.from_json(d["point"])
        return cls(**d)


@dataclass
class ServedSearch:
    """What the served search measured and chose, or why it did not run. `chosen` is what was published."""

    status: str
    reason: str = ""
    concurrency: int | None = None
    concurrency_source: str = ""  # "--concurrency" or how the default was derived
    latency_budget_ms: float | None = None
    percentile: int = 95
    served_by: str = ""  # "stand-in backend ..." or "native backend": every served number is labelled
    stand_in: bool = False
    server: str = ""
    request_mix: str = ""
    start: OperatingPoint | None = None  # the in-process rules' point
    chosen: OperatingPoint | None = None
    variants: list[ServedVariant] = field(default_factory=list)
    stopped: str = ""  # why the search ended: no neighbour improved, or the time budget
    seconds: float = 0.0
    budget_s: float = 0.0
    in_process_throughput: float | None = None  # in-process samples/s at the batch the server formed
    per_request_ms: float | None = None  # the server's cost per request on top of the in-process time
    predicted_throughput: float | None = None  # what the published config serves at `concurrency`
    measured_on: dict[str, Any] | None = None  # task/core_share.CoreShare.to_json() when others kept cores busy (else None)
    measured_point: OperatingPoint | None = None  # the variant that decided `chosen` when its layout was not measured

    @property
    def chosen_variant(self) -> ServedVariant | None:
        """The published point's latest measurement (a confirmation may have measured it again); on a busy
        machine, the measurement of `measured_point`, the same batching on the cores others left free."""
        point = self.measured_point or self.chosen
        return next((v for v in reversed(self.variants) if v.point == point and v.status == "measured"), None)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["start"] = self.start.to_json() if self.start else None
        d["chosen"] = self.chosen.to_json() if self.chosen else None
        d["measured_point"] = self.measured_point.to_json() if self.measured_point else None
        d["variants"] = [v.to_json() for v in self.variants]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServedSearch:
        d = dict(d)
        d["start"] = OperatingPoint.from_json(d["start"]) if d.get("start") else None
        d["chosen"] = OperatingPoint.from_json(d["chosen"]) if d.get("chosen") else None
        d["measured_point"] = OperatingPoint.from_json(d["measured_point"]) if d.get("measured_point") else None
        d["variants"] = [ServedVariant.from_json(v) for v in d.get("variants", [])]
        return cls(**d)
