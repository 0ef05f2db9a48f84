"""Max batch size, measured on each candidate itself: grow the batch until a limit, refine, explain.

Growth (1, 2, 4, ...) stops at the first of: allocation failure, the latency budget, throughput
saturation (gain under `saturation_gain` for `saturation_steps` steps in a row; only when the
size is searched, not when the user asked for one), the user's cap or the search cap, the time
budget. A memory or latency stop is refined by bisection between the
last good and the first bad size. The knee (smallest batch within `saturation_gain` of the best
throughput) and the capacity ceiling are reported separately from the published maximum.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from optimizer.task.profiling import BatchProfile


class OutOfMemory(Exception):
    """A batch did not fit: an allocation failed (or the measuring process was killed)."""


class TimeBudgetExceeded(Exception):
    """The tuning time budget ran out before the search finished."""


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
        return text + f"; knee at {self.knee}, best throughput at {self.best_batch}"

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
        )


def knee_of(profiles: list[BatchProfile], gain: float) -> int:
    """Smallest batch whose throughput is within `gain` of the best one."""
    best = max(p.throughput for p in profiles)
    return min(p.batch_size for p in profiles if p.throughput >= (1.0 - gain) * best)


def _saturated(profiles: list[BatchProfile], gain: float, steps: int) -> bool:
    """True when each of the last `steps` sizes gained less than `gain` over the best before it."""
    if len(profiles) <= steps:
        return False
    for i in range(len(profiles) - steps, len(profiles)):
        best_before = max(p.throughput for p in profiles[:i])
        if profiles[i].throughput >= best_before * (1.0 + gain):
            return False
    return True


def find_max_batch_size(measure: Callable[[int], BatchProfile], policy: BatchPolicy, batching: bool = True) -> MaxBatchDecision:
    """Run the search with `measure(batch) -> BatchProfile` (raising OutOfMemory / TimeBudgetExceeded)."""
    if not batching:
        p = measure(1)
        return MaxBatchDecision([p], 0, 1, 1, "no_batching")
    if policy.batch_sizes:
        return _measure_recorded(measure, policy)
    good: list[BatchProfile] = []
    over: list[BatchProfile] = []
    decided_by, first_bad, failure = "", None, ""
    cap = policy.cap
    batch = 1
    while True:
        try:
            p = measure(batch)
        except OutOfMemory as err:
            decided_by, first_bad, failure = "memory", batch, str(err)
            break
        except TimeBudgetExceeded as err:
            decided_by, failure = "time_budget", str(err)
            break
        if _over_budget(p, policy):
            over.append(p)
            decided_by, first_bad = "latency_budget", batch
            break
        good.append(p)
        if batch >= cap:
            decided_by = "user_cap" if policy.max_batch_size else "search_cap"
            break
        if policy.max_batch_size is None and _saturated(good, policy.saturation_gain, policy.saturation_steps):
            decided_by = "saturation"
            break
        batch = min(batch * 2, cap)
    if decided_by in ("memory", "latency_budget") and good and first_bad:
        lo, hi = good[-1].batch_size, first_bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                p = measure(mid)
            except OutOfMemory as err:
                hi, failure = mid, str(err)
                if decided_by == "memory":
                    first_bad = mid
                continue
            except TimeBudgetExceeded:
                break
            if _over_budget(p, policy):
                over.append(p)
                hi = mid
                continue
            good.append(p)
            lo = mid
    if not good:
        # even batch 1 failed: report it, the strategy decides (a candidate with no good batch is not deployable)
        return MaxBatchDecision([], 0, 0, 0, decided_by, None, first_bad, failure, over)
    good.sort(key=lambda p: p.batch_size)
    best = max(good, key=lambda p: p.throughput)
    largest = good[-1].batch_size
    ceiling = largest if decided_by == "memory" else None
    return MaxBatchDecision(
        profiles=good,
        max_batch_size=largest,
        knee=knee_of(good, policy.saturation_gain),
        best_batch=best.batch_size,
        decided_by=decided_by,
        ceiling=ceiling,
        first_failure=first_bad,
        failure=failure,
        over_budget=sorted(over, key=lambda p: p.batch_size),
    )


def _over_budget(p: BatchProfile, policy: BatchPolicy) -> bool:
    return policy.latency_budget_ms is not None and p.percentile_ms(policy.percentile) > policy.latency_budget_ms


def _measure_recorded(measure: Callable[[int], BatchProfile], policy: BatchPolicy) -> MaxBatchDecision:
    good, over, failure, first_bad = [], [], "", None
    for b in sorted(set(policy.batch_sizes or ())):
        try:
            p = measure(b)
        except OutOfMemory as err:
            failure, first_bad = str(err), b
            break
        except TimeBudgetExceeded as err:
            failure = str(err)
            break
        (over if _over_budget(p, policy) else good).append(p)
    if not good:
        return MaxBatchDecision([], 0, 0, 0, "recorded", None, first_bad, failure, over)
    best = max(good, key=lambda p: p.throughput)
    return MaxBatchDecision(good, good[-1].batch_size, knee_of(good, policy.saturation_gain), best.batch_size, "recorded", None, first_bad, failure, over)


def estimate_ceiling(profiles: list[BatchProfile], limit_mb: float) -> int | None:
    """Capacity ceiling from the linear growth of peak RSS with batch size (None when it cannot be fitted)."""
    pts = [(p.batch_size, p.peak_rss_mb) for p in profiles if p.peak_rss_mb > 0]
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return None
    (b0, r0), (b1, r1) = pts[0], pts[-1]
    slope = (r1 - r0) / (b1 - b0)
    if slope <= 0:
        return None
    return max(int(math.floor(b1 + (limit_mb - r1) / slope)), b1)
