"""The load a served config is chosen for, in the user's terms, and how one variant's curve is scored against it.

- `--concurrency N`: the most throughput at N concurrent requests; the percentile latency breaks ties.
- `--concurrency LOW:HIGH`: every load of the ladder from LOW to HIGH counts, scored as with no load given.
- `--latency-budget-ms MS` (at `--percentile`): the most throughput at any load whose percentile latency meets MS
  (Model Analyzer's constraint semantics); with `--concurrency` too, at N within MS.
- neither: the load is not known, so the config must hold up at every load, a lone client included. Every variant is
  swept over one ladder of loads (1, 4, 16, 64, ... concurrent requests, up while throughput grows more than the noise).
  At each load a variant's score is the geometric mean of its throughput and its p95 latency, each relative to the best
  variant at that load; the variant whose worst score is highest wins (`robust_ratios`). A config that makes a lone
  request wait out a fill delay, or compute a padded batch, scores low where that happens.

The in-process peak may seed where a sweep starts under a latency budget; it never sets the load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.records.served_search import OBJECTIVE_SENTENCE, LoadLevel  # noqa: F401  (re-exported: the objective in words)

SWEEP_GAIN = 0.05
"""A heavier load must serve this much more to count as growth: perf_analyzer's spread between windows on a shared CPU."""
MAX_SWEEP_CONCURRENCY = 256
LADDER_START, LADDER_STEP = 1, 4
"""The loads every variant is measured at when none is given: 1, 4, 16, 64, 256 (log-spaced: a lone client, a light, a
medium and a heavy load each have a measurement, in 4-5 levels a variant)."""
ALWAYS_UP_TO = LADDER_START * LADDER_STEP ** 2
"""No load given, every variant is measured at the ladder's loads up to this one (1, 4, 16) whatever its curve does: a
light and a medium load besides the lone client, where batches can form."""
LATENCY_WEIGHT = 0.5
"""The share of the p95 latency in a load's score (the rest is throughput): the two weigh alike."""
OUT_OF_RUNNING = 0.15
OUT_OF_RUNNING_BELOW = 0.5
"""No load given: a variant whose worst score at the loads it measured is below half the best and OUT_OF_RUNNING below
the leader's worst stops climbing the ladder: more loads can only lower its worst score, and the floor keeps a variant
within the noise of a good one climbing."""
LATENCY_DOUBLED = 2.2
"""A doubled load whose latency grew more than this much queued instead of being served: the sweep stops there."""


def ladder(low: int = LADDER_START, high: int = MAX_SWEEP_CONCURRENCY) -> list[int]:
    """The ladder's loads from `low` (x LADDER_STEP) up to `high`, `high` included."""
    loads, c = [], max(1, low)
    while c < high:
        loads.append(c)
        c *= LADDER_STEP
    return [*loads, high] if high not in loads else loads


@dataclass(frozen=True)
class Objective:
    """What the served config is for: a fixed load, a range of loads, a latency budget, or any load."""

    concurrency: int | None = None
    latency_budget_ms: float | None = None
    percentile: int = 95
    load_range: tuple[int, int] | None = None  # --concurrency LOW:HIGH

    @property
    def kind(self) -> str:
        """One of records.served_search.OBJECTIVES."""
        if self.concurrency:
            return "concurrency"
        if self.load_range:
            return "range"
        return "latency" if self.latency_budget_ms is not None else "any-load"

    @property
    def robust(self) -> bool:
        """Whether every load of a ladder counts (no load given, or a range): the worst score decides."""
        return self.kind in ("any-load", "range")

    @property
    def loads(self) -> list[int]:
        """The ladder a robust objective is scored over ([] for the others)."""
        if self.load_range:
            return ladder(*self.load_range)
        return ladder() if self.kind == "any-load" else []

    def describe(self) -> str:
        """The load the choice is for, in one line (report.md and the export's log say it)."""
        budget = f"p{self.percentile} <= {self.latency_budget_ms:g} ms" if self.latency_budget_ms is not None else ""
        if self.concurrency:
            return f"the most throughput at concurrency {self.concurrency} (--concurrency)" + (f" with {budget}" if budget else "")
        if self.load_range:
            low, high = self.load_range
            return (f"every load from {low} to {high} concurrent requests (--concurrency {low}:{high}): the variant whose worst score "
                    f"(throughput and p{self.percentile} latency against the best at each of {', '.join(map(str, self.loads))}) is highest")
        if budget:
            return f"the most throughput at any concurrency whose {budget} (--latency-budget-ms)"
        return ("any load (none was given: no --concurrency or --latency-budget-ms): the variant whose worst score over the loads "
                f"{', '.join(map(str, ladder()[:4]))}, ... concurrent requests is highest, a load's score being the geometric mean "
                f"of its throughput and its p{self.percentile} latency against the best variant there")

    def first_level(self, seed: int) -> int:
        """Where a variant's measurement starts: the target load; with a budget the seed (where the best variant so far
        peaked); else the ladder's first load, the same for every variant so their curves compare load by load."""
        if self.concurrency:
            return self.concurrency
        if self.robust:
            return self.loads[0]
        return max(1, min(MAX_SWEEP_CONCURRENCY, seed))

    def next_level(self, curve: list[LoadLevel]) -> int | None:
        """The next concurrency to measure given the curve so far (in measurement order), or None when it is known enough.

        A range: every load of its ladder. No load given: up the ladder to ALWAYS_UP_TO, then while a load serves more
        than the one below it. Otherwise up (doubling) while throughput grows by more than the noise
        and the latency stays within budget; when the first step up did not grow, one step down from the start to find
        the smallest load that sustains the peak. With a budget the start is halved until it meets the budget."""
        if self.concurrency or not curve:
            return None
        if self.robust:
            loads = self.loads
            last = curve[-1]
            later = [c for c in loads if c > last.concurrency]
            if not later:
                return None
            if self.load_range or last.concurrency < ALWAYS_UP_TO:
                return later[0]
            grew = last.throughput > curve[-2].throughput * (1 + SWEEP_GAIN)
            return later[0] if grew else None
        done = {lv.concurrency for lv in curve}
        first, last = curve[0], curve[-1]
        if self.latency_budget_ms is not None and not self._meets(last):
            if last.concurrency > 1 and not any(self._meets(lv) for lv in curve):
                lower = last.concurrency // 2 if last.concurrency <= first.concurrency else None
                return lower if lower and lower not in done else None
            return None  # the level above the last one that met the budget does not: the sweep has found the edge
        if len(curve) == 1 or last.concurrency > curve[-2].concurrency:  # going up
            grew = len(curve) == 1 or last.throughput > curve[-2].throughput * (1 + SWEEP_GAIN)
            doubled = len(curve) > 1 and last.latency(self.percentile) > LATENCY_DOUBLED * curve[-2].latency(self.percentile)
            if grew and not doubled and last.concurrency * 2 <= MAX_SWEEP_CONCURRENCY:
                return last.concurrency * 2
        down = first.concurrency // 2
        if len(curve) >= 2 and curve[1].throughput <= first.throughput * (1 + SWEEP_GAIN) and down >= 1 and down not in done:
            return down  # the start was already at the plateau: does half the load sustain it too?
        return None

    def score(self, curve: list[LoadLevel]) -> tuple[LoadLevel | None, bool]:
        """The level that counts for this objective and whether it meets the budget (True without one).

        concurrency: the level at N. latency: the most throughput among levels within the budget (none within: the
        lowest latency, marked as not meeting). Robust: the smallest load that serves within the noise of the peak (the
        knee), the figures a table shows; the choice itself is made on every load (robust_ratios)."""
        if not curve:
            return None, False
        if self.concurrency:
            level = next((lv for lv in curve if lv.concurrency == self.concurrency), None)
            return level, level is not None and self._meets(level)
        within = [lv for lv in curve if self._meets(lv)]
        if not within:
            return min(curve, key=lambda lv: lv.latency(self.percentile)), False
        peak = max(lv.throughput for lv in within)
        knee = min((lv for lv in within if lv.throughput >= peak * (1 - SWEEP_GAIN / 2)), key=lambda lv: lv.concurrency)
        return knee, True

    def _meets(self, level: LoadLevel) -> bool:
        return self.latency_budget_ms is None or level.latency(self.percentile) <= self.latency_budget_ms


def served_at(curve: list[LoadLevel], c: int) -> float | None:
    """What a curve served at load `c`: its last level at or below `c` (flat past its plateau), None below its first."""
    below = [lv for lv in curve if lv.concurrency <= c]
    return max(below, key=lambda lv: lv.concurrency).throughput if below else None


def latency_at_load(curve: list[LoadLevel], c: int, percentile: int = 95) -> float | None:
    """A curve's latency at load `c`: its last level at or below `c`, grown in proportion to the load past it (a closed
    loop that serves no more at a heavier load keeps each request longer: Little's law); None below its first level."""
    below = [lv for lv in curve if lv.concurrency <= c]
    if not below:
        return None
    last = max(below, key=lambda lv: lv.concurrency)
    return last.latency(percentile) * c / last.concurrency


def load_score(throughput: float, latency_ms: float, best_throughput: float, best_latency_ms: float) -> float:
    """One load's score: the geometric mean (LATENCY_WEIGHT) of throughput and latency, each relative to the best there."""
    if best_throughput <= 0 or throughput <= 0:
        return 0.0
    thr = throughput / best_throughput
    lat = best_latency_ms / latency_ms if latency_ms > 0 and best_latency_ms > 0 else 1.0
    return math.exp((1 - LATENCY_WEIGHT) * math.log(thr) + LATENCY_WEIGHT * math.log(min(lat, 1.0)))


def robust_ratios(curves: dict[object, list[LoadLevel]], percentile: int = 95, loads: list[int] | None = None,
                  skip: dict[object, set[int]] | None = None) -> dict[object, tuple[float, int]]:
    """Each curve's worst score (load_score against the most throughput and the lowest latency any curve had at the same
    load) and the load where it is worst.

    The loads are every level any curve measured (or `loads`); above a curve's last level its throughput is that level's
    and its latency grows with the load (latency_at_load); a load below a curve's first level does not count for it, nor
    do the loads `skip` names for it (a level set aside is not stood in for by the one below)."""
    loads = sorted(loads or {lv.concurrency for curve in curves.values() for lv in curve})
    skip = skip or {}
    figures = {key: {c: (t, latency_at_load(curve, c, percentile)) for c in loads
                     if c not in skip.get(key, ()) and (t := served_at(curve, c)) is not None}
               for key, curve in curves.items()}
    best_t = {c: max((f[c][0] for f in figures.values() if c in f), default=0.0) for c in loads}
    best_l = {c: min((f[c][1] for f in figures.values() if c in f and f[c][1]), default=0.0) for c in loads}
    out = {}
    for key, fig in figures.items():
        scores = [(load_score(t, lat or 0.0, best_t[c], best_l[c]), c) for c, (t, lat) in fig.items() if best_t[c] > 0]
        out[key] = min(scores) if scores else (0.0, 0)
    return out


def worst_so_far(curve: list[LoadLevel], others: list[list[LoadLevel]], percentile: int = 95) -> tuple[float, int]:
    """A partial curve's worst score against every curve (itself included) at each load it measured, and where."""
    scores = []
    for lv in curve:
        rivals = [(t, latency_at_load(o, lv.concurrency, percentile)) for o in others if (t := served_at(o, lv.concurrency)) is not None]
        best_t = max([lv.throughput, *(t for t, _ in rivals)])
        best_l = min([lv.latency(percentile), *(lat for _, lat in rivals if lat)])
        if best_t > 0:
            scores.append((load_score(lv.throughput, lv.latency(percentile), best_t, best_l), lv.concurrency))
    return min(scores, default=(0.0, 0))
