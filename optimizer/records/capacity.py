"""Open-loop records: one offered rate measured, and the capacity of a config (the highest rate it holds within a target).

Closed-loop figures (N clients that each wait for an answer) never queue more than N requests; these are measured with
requests sent on a schedule whatever the answers' pace, as production traffic arrives. The served search writes them,
report.json keeps the published config's under `capacity`, validate reads the claim back and proves it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

HELD_THROUGHPUT = 0.97
"""A rate is held only when the server answered at least this share of what was offered: below it requests were piling up
(or the client could not send on schedule), and the window's latency no longer says what a longer run would see."""


def arrivals_label(arrivals: str) -> str:
    """How the requests arrived, in words a figure carries ("Poisson arrivals", "the trace's schedule")."""
    return {"poisson": "Poisson arrivals", "constant": "evenly spaced arrivals", "trace": "the trace's schedule"}.get(arrivals, arrivals)


@dataclass
class RateLevel:
    """perf_analyzer's measurement of one config at one offered rate (requests per second, open-loop)."""

    offered: float  # requests per second the schedule sent
    throughput: float  # answers (samples) per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    server_batch: float | None = None
    held: bool | None = None  # within the budget and at least HELD_THROUGHPUT of the offered rate (None: no budget to hold)
    why: str = ""  # why it was not held
    others_busy: float | None = None  # other processes' most CPU while it was measured (cores); None: not watched

    def latency(self, percentile: int) -> float:
        """The latency at a percentile perf_analyzer reports (50, 90, 95, 99)."""
        return {50: self.p50_ms, 90: self.p90_ms, 99: self.p99_ms}.get(percentile, self.p95_ms)

    def judge(self, budget_ms: float | None, percentile: int) -> RateLevel:
        """Set `held` and `why` against a latency budget (with none, only the throughput decides)."""
        whys = []
        if self.throughput < HELD_THROUGHPUT * self.offered:
            whys.append(f"served {self.throughput:.1f}/s of {self.offered:g}/s offered (below {HELD_THROUGHPUT:.0%}: requests queued up)")
        if budget_ms is not None and self.latency(percentile) > budget_ms:
            whys.append(f"p{percentile} {self.latency(percentile):.1f} ms is over {budget_ms:g} ms")
        self.held, self.why = not whys, "; ".join(whys)
        return self

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RateLevel:
        return cls(**{k: d.get(k) for k in (f.name for f in fields(cls)) if k in d})


@dataclass
class Capacity:
    """The highest offered rate a config held: percentile latency within the budget and throughput >= HELD_THROUGHPUT of
    what was offered, under the stated arrivals. `curve` is every rate measured (latency against offered rate)."""

    rate_per_s: float | None  # None: not even the lowest rate measured was held
    latency_budget_ms: float | None
    percentile: int
    arrivals: str  # "poisson", "constant" or "trace"
    runs: int  # perf_analyzer runs the figure rests on
    curve: list[RateLevel] = field(default_factory=list)  # in offered order
    bounded: bool = True  # a rate above it was measured and not held (False: the search stopped before one failed)
    window_ms: int = 0
    windows: int = 0
    target_rate: float | None = None  # --rate R, when given
    headroom: float | None = None  # --headroom: the share of capacity kept free on each replica
    point: str = ""  # the config it was measured on (its label)

    @property
    def replicas(self) -> int | None:
        """Replicas `target_rate` needs: ceil(R / (capacity x (1 - headroom))); None without a rate or a capacity."""
        if self.target_rate is None or not self.rate_per_s:
            return None
        return max(1, math.ceil(self.target_rate / (self.rate_per_s * (1 - (self.headroom or 0.0))) - 1e-9))

    @property
    def held_level(self) -> RateLevel | None:
        """The run at the capacity's rate. perf_analyzer reports what it offered (1220.003/s for the rung 1220/s), and
        rates measured lie at least 9% apart (a rung and its half rung), so the nearest run within 1% is that rate's."""
        if not self.rate_per_s:
            return None
        near = min(self.curve, key=lambda lv: abs(lv.offered - self.rate_per_s), default=None)
        return near if near is not None and abs(near.offered - self.rate_per_s) <= 0.01 * self.rate_per_s else None

    @property
    def per_replica_target(self) -> float | None:
        """The rate each replica is planned at (capacity less the headroom): an autoscaler's target."""
        if not self.rate_per_s:
            return None
        return self.rate_per_s * (1 - (self.headroom or 0.0))

    def describe(self) -> str:
        """One line: the rate held, within what, under which arrivals, on how many runs."""
        target = f"p{self.percentile} <= {self.latency_budget_ms:g} ms" if self.latency_budget_ms is not None else "no latency target"
        if self.rate_per_s is None:
            low = min((lv.offered for lv in self.curve), default=0.0)
            return f"no rate held (open-loop, {arrivals_label(self.arrivals)}, {target}): not even {round(low, 1):g}/s"
        more = "" if self.bounded else " (at least: no higher rate was measured)"
        return (f"{self.rate_per_s:g} requests/s held{more} (open-loop, {arrivals_label(self.arrivals)}, {target}; "
                f"{self.runs} perf_analyzer runs)")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["replicas"] = self.replicas
        d["per_replica_target"] = round(self.per_replica_target, 2) if self.per_replica_target else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Capacity:
        d = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        d["curve"] = [RateLevel.from_json(x) for x in d.get("curve") or []]
        return cls(**d)
