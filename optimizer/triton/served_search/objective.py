"""The load a served config is chosen for, in the user's terms, and how one variant's curve is scored against it.

- `--concurrency N`: the most throughput at N concurrent requests; the percentile latency breaks ties.
- `--latency-budget-ms MS` (at `--percentile`): the most throughput at any load whose percentile latency meets MS
  (Model Analyzer's constraint semantics); with `--concurrency` too, at N within MS.
- neither: the load is not known, so the config must hold up at any load. Every variant is swept over one ladder of
  loads (4, 16, 64, ... concurrent requests, until throughput grows less than the noise) and the variant whose worst
  ratio to the best measured at each load is highest wins (`robust_ratios`). Measured here: the bundled CNN's
  OpenVINO winner at its most sustained throughput (max 16, 1075/s at concurrency 128) served 0.66x the best grid
  point at concurrency 16, because the openvino backend pads every batch to max_batch_size; the single figure
  Model Analyzer's default objective ranks by hides that.

The in-process peak may seed where a sweep starts under a latency budget; it never sets the load.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.records.served_search import LoadLevel

SWEEP_GAIN = 0.05
"""A doubled load must serve this much more to count as growth: perf_analyzer's spread between windows here is 3-5%."""
MAX_SWEEP_CONCURRENCY = 256
LADDER_START, LADDER_STEP = 4, 4
"""The loads every variant is measured at when none is given: 4, 16, 64, 256 (log-spaced, so a light, a medium and a
heavy load each have a measurement; a step of 4 keeps a variant's sweep to 3-4 levels)."""
OUT_OF_RUNNING = 0.15
OUT_OF_RUNNING_BELOW = 0.5
"""No load given: a variant whose worst ratio at the loads it measured is below half the best and OUT_OF_RUNNING below
the leader's worst ratio stops climbing the ladder. More loads can only lower its worst ratio; the leader's drops too as
others are measured (early on it is 1.0, the only curve), so the floor keeps a variant within reach of a good one
climbing (one config measured twice differs by up to 10% here). Why: on the bundled CNN each 2 x 1-thread layout
climbed to 256 (10 s) after serving 0.14x-0.45x the best at concurrency 4."""
LATENCY_DOUBLED = 2.2
"""A doubled load whose latency grew more than this much queued instead of being served: the sweep stops there."""


@dataclass(frozen=True)
class Objective:
    """What the served config is for: a fixed load, a latency budget, or the most throughput sustained."""

    concurrency: int | None = None
    latency_budget_ms: float | None = None
    percentile: int = 95

    @property
    def kind(self) -> str:
        """One of records.served_search.OBJECTIVES."""
        if self.concurrency:
            return "concurrency"
        return "latency" if self.latency_budget_ms is not None else "max-throughput"

    def describe(self) -> str:
        """The load the choice is for, in one line (report.md and the export's log say it)."""
        budget = f"p{self.percentile} <= {self.latency_budget_ms:g} ms" if self.latency_budget_ms is not None else ""
        if self.concurrency:
            return f"the most throughput at concurrency {self.concurrency} (--concurrency)" + (f" with {budget}" if budget else "")
        if budget:
            return f"the most throughput at any concurrency whose {budget} (--latency-budget-ms)"
        return ("any load (none was given: no --concurrency or --latency-budget-ms): the variant closest to the best at every load "
                f"of the ladder {LADDER_START}, {LADDER_START * LADDER_STEP}, {LADDER_START * LADDER_STEP ** 2}, ... concurrent requests")

    def first_level(self, seed: int) -> int:
        """Where a variant's measurement starts: the target load; with a budget the seed (where the best variant so far
        peaked); else the ladder's first load, the same for every variant so their curves compare load by load."""
        if self.concurrency:
            return self.concurrency
        if self.kind == "max-throughput":
            return LADDER_START
        return max(1, min(MAX_SWEEP_CONCURRENCY, seed))

    def next_level(self, curve: list[LoadLevel]) -> int | None:
        """The next concurrency to measure given the curve so far (in measurement order), or None when it is known enough.

        Up (doubling) while throughput grows by more than the noise and the latency stays within budget; when the first
        step up did not grow, one step down from the start to find the smallest load that sustains the peak. With a
        budget the start is halved until it meets the budget."""
        if self.concurrency or not curve:
            return None
        if self.kind == "max-throughput":  # the ladder, up while a load serves more than the one below it
            last = curve[-1]
            grew = len(curve) == 1 or last.throughput > curve[-2].throughput * (1 + SWEEP_GAIN)
            up = last.concurrency * LADDER_STEP
            return up if grew and up <= MAX_SWEEP_CONCURRENCY else None
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
        lowest latency, marked as not meeting). max-throughput: the smallest load that serves within the noise of the
        peak (the knee), so its latency is the one a user at that throughput sees."""
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


def robust_ratios(curves: dict[object, list[LoadLevel]]) -> dict[object, tuple[float, int]]:
    """Each curve's worst ratio to the most any curve served at the same load, and the load where it is worst.

    The loads are every level any curve measured; above a curve's last level its throughput is taken as that level's
    (a closed loop past its plateau serves the same, only slower), and a load below a curve's first level does not
    count for it (unmeasured, and the ladder starts every curve at the same load)."""
    loads = sorted({lv.concurrency for curve in curves.values() for lv in curve})
    best = {c: max((t for curve in curves.values() if (t := served_at(curve, c)) is not None), default=0.0) for c in loads}
    out = {}
    for key, curve in curves.items():
        ratios = [(t / best[c], c) for c in loads if best[c] > 0 and (t := served_at(curve, c)) is not None]
        out[key] = min(ratios) if ratios else (0.0, 0)
    return out


def worst_so_far(curve: list[LoadLevel], others: list[list[LoadLevel]]) -> tuple[float, int]:
    """A partial curve's worst ratio to the most any curve (itself included) served at each load it measured, and where."""
    ratios = []
    for lv in curve:
        best = max([lv.throughput, *(t for other in others if (t := served_at(other, lv.concurrency)) is not None)])
        if best > 0:
            ratios.append((lv.throughput / best, lv.concurrency))
    return min(ratios, default=(0.0, 0))
