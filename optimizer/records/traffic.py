"""TrafficSummary: what report.json and report.md say of the traffic a run was tuned for."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

TRAFFIC_SOURCES = ("file", "samples", "generated")
"""file: --traffic (perf_analyzer --input-data JSON); samples: the requests in --samples; generated: a spread of every dynamic axis."""


@dataclass
class TrafficSummary:
    """Where the traffic came from, how many requests, the histogram of their shapes and its representative shapes."""

    source: str
    origin: str
    requests: int
    dynamic_axes: list[str] = field(default_factory=list)  # "input_ids[1]": input and axis (batch axis counted)
    histogram: list[list[Any]] = field(default_factory=list)  # [shape label, requests], most common first
    shapes: dict[str, dict[str, int]] = field(default_factory=dict)  # "median" / "p90" / "max" -> axis -> size
    # a trace (entries with timestamps) only; None otherwise
    rate_per_s: float | None = None  # mean rate: requests per second over the trace's span
    duration_s: float | None = None  # first to last timestamp
    burstiness: float | None = None  # coefficient of variation of the gaps: 1 Poisson, 0 evenly spaced, above 1 bursty
    peak_rate_per_s: float | None = None  # the most requests in any window of peak_window_s, per second
    peak_window_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> TrafficSummary | None:
        if not d:
            return None
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @property
    def is_trace(self) -> bool:
        """Whether the requests carry their arrival times."""
        return self.rate_per_s is not None

    def describe_trace(self) -> str:
        """One line of a trace's figures ("" when the traffic has no timestamps)."""
        if not self.is_trace:
            return ""
        return (f"a trace of {self.duration_s:g} s at {self.rate_per_s:g} requests/s on average, burstiness {self.burstiness:.2f} "
                f"(the gaps' coefficient of variation: 1 Poisson, 0 evenly spaced), peak {self.peak_rate_per_s:g} requests/s "
                f"over {self.peak_window_s:g} s")

    def describe(self) -> str:
        """One line: "--traffic t.json: 64 requests, 23 shapes (median input_ids[1] 36, p90 ...)"."""
        shapes = len(self.histogram)
        parts = [f"{self.origin}: {self.requests} request{'s' if self.requests != 1 else ''}, {shapes} shape{'s' if shapes != 1 else ''}"]
        if self.dynamic_axes:
            parts.append("(" + "; ".join(f"{label} " + ", ".join(f"{a} {v}" for a, v in self.shapes.get(label, {}).items())
                                        for label in ("median", "p90", "max")) + ")")
        return " ".join(parts)
