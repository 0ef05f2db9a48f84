"""Measurement records: one batch size's profile, the batch policy a search follows, and what it decided.

Plain data with JSON round trips: they cross process boundaries (a measuring child writes them)
and land in report.json; timing and searching live in task/.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class BatchProfile:
    """One batch size's measurement. Latencies in milliseconds, throughput in samples per second."""

    batch_size: int
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput: float
    runs: int
    windows: int
    stable: bool
    cv: float
    others_cpu_share: float  # share of the measured cores' CPU used by other processes during the windows (0..1)
    peak_rss_mb: float = 0.0
    retakes: int = 0  # times it was measured again because other processes' load rose while it was timed

    def percentile_ms(self, percentile: int) -> float:
        return {50: self.p50_ms, 90: self.p90_ms, 95: self.p95_ms, 99: self.p99_ms}[percentile]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchProfile:
        return cls(**d)


@dataclass(frozen=True)
class BatchPolicy:
    """What limits the batch. `max_batch_size` None means auto (search up to `search_cap`)."""

    max_batch_size: int | None = None
    search_cap: int = 256
    latency_budget_ms: float | None = None
    percentile: int = 95
    saturation_gain: float = 0.05
    saturation_steps: int = 2
    batch_sizes: tuple[int, ...] | None = None  # JIT: measure exactly these (recorded) sizes, no discovery

    @property
    def cap(self) -> int:
        return self.max_batch_size or self.search_cap

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["batch_sizes"] = list(self.batch_sizes) if self.batch_sizes else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchPolicy:
        d = dict(d)
        d["batch_sizes"] = tuple(d["batch_sizes"]) if d.get("batch_sizes") else None
        return cls(**d)


LIMITS = {
    "memory": "an allocation failed above this size",
    "latency_budget": "the latency budget was exceeded above this size",
    "saturation": "throughput stopped growing",
    "user_cap": "the requested --max-batch-size",
    "search_cap": "the search cap",
    "time_budget": "the time budget ran out",
    "recorded": "the largest batch recorded in the samples (JIT workflow)",
    "no_batching": "the model does not batch",
    "peak": "the throughput peak: the smallest measured batch within the measured noise of the best throughput",
}
"""Why the published max_batch_size is what it is, by decision key."""


@dataclass
class MaxBatchDecision:
    """The measured profiles and what they decided."""

    profiles: list[BatchProfile]
    max_batch_size: int
    knee: int
    best_batch: int
    decided_by: str
    ceiling: int | None = None  # largest size that fit when an allocation failed (None: not reached)
    first_failure: int | None = None
    failure: str = ""
    over_budget: list[BatchProfile] = field(default_factory=list)  # sizes measured but above the latency budget
    peak: int = 0  # the smallest batch within the measured noise of the best throughput (0: none measured)
    largest_fit: int = 0  # the largest batch that fit (memory and latency budget): what capacity allows
    search_stop: str = ""  # why the growth stopped (a LIMITS key); decided_by is "peak" when the peak capped the max
    measured_max: int = 0  # the max batch as measured, when it was measured on fewer cores and scaled (0: not scaled)
    scaled_by: float = 1.0  # available cores / measured cores (task/core_share.py)
    fit_checked: list[int] = field(default_factory=list)  # past a saturation stop, run once each to check they fit (not profiled)
    tail: BatchProfile | None = None  # the traffic's p90 request alone (batch 1): the tail a lone client sees (None: one shape)
    fit_shape: str = ""  # the request shape the fit checks ran at (the traffic's largest), when it is not the profiled one

    @property
    def best(self) -> BatchProfile:
        return next(p for p in self.profiles if p.batch_size == self.best_batch)

    def profile_at(self, batch: int) -> BatchProfile | None:
        return next((p for p in self.profiles if p.batch_size == batch), None)

    @property
    def explanation(self) -> str:
        why = LIMITS.get(self.decided_by, self.decided_by)
        text = f"max_batch_size {self.max_batch_size}: {why}"
        if self.decided_by in ("memory", "latency_budget") and self.first_failure:
            text += f" (first failing size {self.first_failure})"
        if self.decided_by in ("peak", "saturation") and self.largest_fit > self.max_batch_size:
            text += f"; {self.fit_text}"
        if self.measured_max:
            text += (f"; measured on 1/{self.scaled_by:g} of the cores with as many threads, where the max was {self.measured_max}: "
                     f"scaled x{self.scaled_by:g} so each thread gets the same share of a batch on every core")
        return text + f"; knee at {self.knee}, best throughput at {self.best_batch}"

    @property
    def fit_text(self) -> str:
        """How far batches fit, and how that is known (profiled, or run once past the saturation stop)."""
        stop = LIMITS.get(self.search_stop, self.search_stop)
        if not self.fit_checked:
            return f"batches up to {self.largest_fit} fit (the search stopped there: {stop})"
        profiled = max((p.batch_size for p in self.profiles), default=0)
        ran = " and ".join(str(b) for b in self.fit_checked)
        return f"batches up to {self.largest_fit} fit (the search stopped at {profiled}: {stop}; {ran} ran once each to check they fit)"

    def to_json(self) -> dict[str, Any]:
        return {
            "profiles": [p.to_json() for p in self.profiles],
            "over_budget": [p.to_json() for p in self.over_budget],
            "max_batch_size": self.max_batch_size,
            "knee": self.knee,
            "best_batch": self.best_batch,
            "decided_by": self.decided_by,
            "ceiling": self.ceiling,
            "first_failure": self.first_failure,
            "failure": self.failure,
            "peak": self.peak,
            "largest_fit": self.largest_fit,
            "search_stop": self.search_stop,
            "measured_max": self.measured_max,
            "scaled_by": self.scaled_by,
            "fit_checked": list(self.fit_checked),
            "tail": self.tail.to_json() if self.tail else None,
            "fit_shape": self.fit_shape,
            "explanation": self.explanation,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MaxBatchDecision:
        return cls(
            profiles=[BatchProfile.from_json(p) for p in d["profiles"]],
            over_budget=[BatchProfile.from_json(p) for p in d.get("over_budget", [])],
            max_batch_size=d["max_batch_size"],
            knee=d["knee"],
            best_batch=d["best_batch"],
            decided_by=d["decided_by"],
            ceiling=d.get("ceiling"),
            first_failure=d.get("first_failure"),
            failure=d.get("failure", ""),
            peak=d.get("peak", d["best_batch"]),
            largest_fit=d.get("largest_fit", d["max_batch_size"]),
            search_stop=d.get("search_stop", d["decided_by"]),
            measured_max=d.get("measured_max", 0),
            scaled_by=d.get("scaled_by", 1.0),
            fit_checked=list(d.get("fit_checked", [])),
            tail=BatchProfile.from_json(d["tail"]) if d.get("tail") else None,
            fit_shape=d.get("fit_shape", ""),
        )
