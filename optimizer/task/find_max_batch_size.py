"""Max batch size, measured on each candidate itself: grow the batch until a limit, refine, explain.

Growth (1, 2, 4, ...) stops at the first of: allocation failure, the latency budget, throughput
saturation (gain under `saturation_gain` for `saturation_steps` steps in a row; only when the
size is searched, not when the user asked for one), the user's cap or the search cap, the time
budget. A memory or latency stop is refined by bisection between the
last good and the first bad size. The knee (smallest batch within `saturation_gain` of the best
throughput) and the capacity ceiling are reported separately from the published maximum.

When the size is searched (not asked for), the published maximum is the throughput peak: the
smallest batch within the measured noise of the best. Past it a saturated server forms larger
batches that serve less at several times the latency, and on a flat curve the smallest
equivalent batch answers sooner and repeats from run to run; the largest batch that fit is kept
as `largest_fit` for the served search to try. Past a saturation stop, larger batches (up to
FIT_PROBE_FACTOR x the largest measured) are run once each to check that they fit (`fit_checked`):
in-process throughput stops growing where the server's per-request cost still favours larger ones.
"""

from __future__ import annotations

import math
from typing import Callable

from optimizer.records.measurements import BatchPolicy, BatchProfile, MaxBatchDecision
from optimizer.task.core_share import CoreShare


class OutOfMemory(Exception):
    """A batch did not fit: an allocation failed (or the measuring process was killed)."""


class TimeBudgetExceeded(Exception):
    """The tuning time budget ran out before the search finished."""


def knee_of(profiles: list[BatchProfile], gain: float) -> int:
    """Smallest batch whose throughput is within `gain` of the best one."""
    best = max(p.throughput for p in profiles)
    return min(p.batch_size for p in profiles if p.throughput >= (1.0 - gain) * best)


MIN_NOISE = 0.02
MAX_NOISE = 0.10
"""The band a throughput counts as equal to the best: each profile's window spread (cv), within these bounds."""


def noise_of(p: BatchProfile) -> float:
    """The relative spread of a profile's throughput windows, bounded (an unsettled profile counts as the widest)."""
    return MAX_NOISE if p.cv < 0 else min(MAX_NOISE, max(MIN_NOISE, p.cv))


def peak_of(profiles: list[BatchProfile]) -> int:
    """Smallest batch whose throughput is within the measured noise of the best one (both profiles' spread counts)."""
    best = max(profiles, key=lambda p: p.throughput)
    return min(p.batch_size for p in profiles if p.throughput >= (1.0 - max(noise_of(best), noise_of(p))) * best.throughput)


def every_load_max(profiles: list[BatchProfile]) -> int:
    """The max batch for a backend that pads every execution to it, with no load known: the measured size whose worst
    ratio to the best size, over every load (each measured size's worth of concurrent batch-1 requests, and more than the
    largest), is highest. At `c` requests a padded max `b` computes `b` rows to answer min(c, b) of them, so it serves
    throughput(b) * min(c, b) / b.

    Why: the peak of a curve that keeps rising is a large batch, and published as the max it pads every lone request
    to that many rows, so the model serves a light load at a small fraction of what a smaller max serves."""
    sizes = sorted(p.batch_size for p in profiles)
    thr = {p.batch_size: p.throughput for p in profiles}

    def served(b: int, c: float) -> float:
        return thr[b] * min(c, b) / b

    loads = [*sizes, math.inf]
    best = {c: max(served(b, c) for b in sizes) for c in loads}
    return max(sizes, key=lambda b: (min(served(b, c) / best[c] for c in loads), thr[b]))


FIT_PROBE_FACTOR = 4
"""Past a saturation stop, batches up to this many times the largest measured are run once each to check they fit (memory,
the latency budget), so the served search may try them: on few cores the in-process curve can stop growing at a small
batch, and without larger maxima that fit the served search would have almost nothing to compare. Two doublings: two
inferences each (the first at a shape may compile), cheap beside the profile windows."""
FIT_CHECK_MAX_MS = 1000.0
"""A batch whose inference would take longer than this (the largest profiled batch's median, scaled by the rows) is not
checked: a large model's check would cost the in-process search seconds per candidate, and a max that slow is no
candidate for a served config."""


def _saturated(profiles: list[BatchProfile], gain: float, steps: int) -> bool:
    """True when each of the last `steps` sizes gained less than `gain`, or less than its own measured spread,
    over the best before it: a step counts as growth only beyond the noise it was measured with."""
    if len(profiles) <= steps:
        return False
    for i in range(len(profiles) - steps, len(profiles)):
        best_before = max(p.throughput for p in profiles[:i])
        if profiles[i].throughput >= best_before * (1.0 + max(gain, noise_of(profiles[i]))):
            return False
    return True


def find_max_batch_size(measure: Callable[[int], BatchProfile], policy: BatchPolicy, batching: bool = True,
                        fits: Callable[[int], float] | None = None, fit_cost_scale: float = 1.0) -> MaxBatchDecision:
    """Run the search with `measure(batch) -> BatchProfile` (raising OutOfMemory / TimeBudgetExceeded); `fits(batch)` runs
    one inference and returns its milliseconds (raising as `measure`), for the fit check past a saturation stop;
    `fit_cost_scale`: how much dearer the request `fits` runs is than the profiled one."""
    if not batching:
        p = measure(1)
        return MaxBatchDecision([p], 0, 1, 1, "no_batching", peak=1, largest_fit=0, search_stop="no_batching")
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
    checked = _check_fit(fits, good[-1], policy, fit_cost_scale) if fits is not None and decided_by == "saturation" else []
    peak = peak_of(good)
    capped = policy.max_batch_size is None and peak < largest  # searched, not asked for: never past the peak
    return MaxBatchDecision(
        profiles=good,
        max_batch_size=peak if capped else largest,
        knee=knee_of(good, policy.saturation_gain),
        best_batch=best.batch_size,
        decided_by="peak" if capped else decided_by,
        ceiling=ceiling,
        first_failure=first_bad,
        failure=failure,
        over_budget=sorted(over, key=lambda p: p.batch_size),
        peak=peak,
        largest_fit=max([largest, *checked]),
        search_stop=decided_by,
        fit_checked=checked,
    )


def _check_fit(fits: Callable[[int], float], largest: BatchProfile, policy: BatchPolicy, scale: float = 1.0) -> list[int]:
    """The batches past the `largest` profiled (doubling, up to FIT_PROBE_FACTOR x and the cap) that ran within memory
    and the latency budget; the first that does not, or would take over FIT_CHECK_MAX_MS (the profiled time scaled by
    the rows and by `scale`), ends the check."""
    checked, batch = [], largest.batch_size * 2
    while batch <= min(policy.cap, FIT_PROBE_FACTOR * largest.batch_size):
        if largest.p50_ms * scale * batch / largest.batch_size > FIT_CHECK_MAX_MS:
            break
        try:
            ms = fits(batch)
        except (OutOfMemory, TimeBudgetExceeded):
            break
        if policy.latency_budget_ms is not None and ms > policy.latency_budget_ms:
            break
        checked.append(batch)
        batch *= 2
    return checked


SCALABLE = frozenset({"peak", "saturation", "search_cap", "time_budget"})
"""Decisions set by the throughput curve, which fewer threads flatten; memory, a latency budget or the user's size are not scaled."""


def scaled_for_cores(decision: MaxBatchDecision, share: CoreShare, cap: int) -> MaxBatchDecision:
    """A max batch searched on fewer cores than the server has, scaled to all of them (task/core_share.py), never past
    the largest batch profiled in-process (a size never measured is never published) nor `cap`; the peak (the rules'
    preferred size) is scaled with it, so the max and the preferred size keep their measured relation."""
    if not share.reduced or decision.decided_by not in SCALABLE or decision.max_batch_size <= 0:
        return decision
    profiled = max((p.batch_size for p in decision.profiles), default=0)  # not the sizes only run once (fit_checked)
    ceiling = min(cap, max(profiled, decision.max_batch_size))
    scaled = min(share.to_all_cores(decision.max_batch_size), ceiling)
    if scaled == decision.max_batch_size:
        return decision
    decision.measured_max, decision.scaled_by = decision.max_batch_size, round(share.factor, 3)
    decision.max_batch_size = scaled
    if decision.peak:
        decision.peak = min(share.to_all_cores(decision.peak), scaled)
    return decision


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
    return MaxBatchDecision(good, good[-1].batch_size, knee_of(good, policy.saturation_gain), best.batch_size, "recorded", None, first_bad, failure, over,
                            peak=peak_of(good), largest_fit=good[-1].batch_size, search_stop="recorded")


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
