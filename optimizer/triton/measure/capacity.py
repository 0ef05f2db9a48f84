"""The capacity of a loaded config: the highest offered rate it holds within a latency target, found open-loop.

Rates lie on one grid (RATE_STEP apart, the same for every config and every run), so two configs' capacities compare rung
for rung and a claim can be measured again at exactly the rate it names. The search starts near a seed (what the config
served closed-loop within the budget, which bounds it from above), climbs a rung while the rate is held and steps down
while it is not, and stops when a held rung has a failed one right above it. A rate the server could not keep up with
sends the search straight to the rung below what it did serve. One run near saturation is a coin that lands either way
(a queue that a burst starts may or may not drain within the windows), so the failed rung that would bound the capacity
is measured again and bounds it only when most of its runs (two of two, or two of three) fail; one that the server fell
far behind on bounds it at once, unless it measured slower than a rung above it did (latency only grows with the rate,
so that was a disturbance: another process, a stall). Configs compare rung for rung; the published config's claim is then
refined to the half rung between its capacity and the failure above it (`refine`), so the figure a fleet is sized from
lies within 9% of what the config holds rather than 19%. The served search and validate share it.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable

from optimizer.records.capacity import Capacity, RateLevel

RATE_STEP = 2 ** 0.25
"""Neighbouring rungs of the rate grid are 19% apart: about the spread of one open-loop run near saturation on two
cores, so a finer grid would rank configs by noise."""
MAX_RATE_RUNS = 5
"""Runs a capacity search may take (it usually brackets the capacity in 2-4 from a closed-loop seed)."""
SEED_SHARE = 0.7
"""The seed: this share of what the config served closed-loop within the budget (open-loop bursts queue where N waiting
clients never do, so the capacity lies below the closed-loop figure)."""
FAST_CLIMB = 0.5
"""A rate held with its percentile latency under this share of the budget climbs two rungs at once."""
SLOW_DESCENT = 8.0
"""A rate not held, with nothing held yet, whose percentile latency is this many times the budget (the server kept up, but
its queue did not drain) steps down two rungs at once: one rung lower would not bring it within."""
LOWEST_RATE = 0.5
"""Requests per second below which the search gives up: a config that holds no rate above it has no capacity to state."""
MAX_DRAIN_S = 10.0
"""The longest wait after a rate that was not held: requests a run left queued in the server are still served after
perf_analyzer exits, and the next run's first window would pay for them."""


def drain_s(level: RateLevel, run_s: float) -> float:
    """Seconds to wait after `level` for the server to work off what it queued: the backlog the shortfall left over the run,
    or its p99 (a request's wait in the queue), whichever is longer; 0 after a rate that was held."""
    if level.held:
        return 0.0
    backlog = max(0.0, level.offered - level.throughput) * run_s / max(level.throughput, 1.0)
    return min(MAX_DRAIN_S, max(backlog, level.p99_ms / 1000.0))


REFINE_RUNS = 3
"""Runs the half rung may take: one when it is held or the server fell far behind, two or three when it fails near the
edge (as a bounding rung, its failure counts only when most of its runs fail)."""


def rung(k: float) -> float:
    """The rate of rung `k` (k = 0 is 1 request/s; k + 0.5 is the half rung above k), to three significant digits."""
    value = RATE_STEP ** k
    digits = 2 - int(math.floor(math.log10(value)))
    return round(value, digits)


def rung_of(rate: float, down: bool = False) -> int:
    """The rung nearest `rate` (the one at or below it with `down`)."""
    k = math.log(max(rate, 1e-9)) / math.log(RATE_STEP)
    return math.floor(k + 1e-9) if down else round(k)


def half_rung_of(rate: float) -> float:
    """The rung or half rung nearest `rate` (k or k + 0.5)."""
    return round(2 * math.log(max(rate, 1e-9)) / math.log(RATE_STEP)) / 2


def find_capacity(measure: Callable[[float], RateLevel], latency_budget_ms: float | None, percentile: int, arrivals: str, seed: float,
                  max_runs: int = MAX_RATE_RUNS, out_of_time: Callable[[float], bool] = lambda seconds: False,
                  run_cost_s: float = 0.0, drain: Callable[[float], None] = time.sleep, floor: float | None = None,
                  prior: RateLevel | None = None) -> Capacity:
    """Search the capacity from `seed` requests/s; `measure(rate)` runs one open-loop measurement. Stops after `max_runs`
    runs, or when `out_of_time(run_cost_s)` says the next run would not fit, or when the next rate would lie below
    `floor` (a challenger that fails the leader's capacity cannot beat it: where it lies below is not worth the runs);
    `bounded` says whether a failed rung lies right above the capacity. After a rate that was not held, `drain(seconds)`
    lets the server work off its queue. `prior`: a run taken already (a screening run, drained), counted as the first;
    the search goes on from it when it lies at the seed's rung."""
    levels: dict[int, RateLevel] = {}  # per rung, the run that stands for it (of its majority)
    votes: dict[int, list[bool]] = {}  # per rung, held or not, run by run
    runs = 0
    k = rung_of(max(seed, LOWEST_RATE))
    if prior is not None and rung_of(prior.offered) != k:  # a run elsewhere: on the curve, the search starts at the seed
        j, level = rung_of(prior.offered), prior.judge(latency_budget_ms, percentile)
        votes[j], levels[j], runs, prior = [level.held], level, 1, None
    while runs < max_runs and rung(k) >= LOWEST_RATE and not (runs and out_of_time(run_cost_s)):
        if prior is not None:
            level, prior = prior.judge(latency_budget_ms, percentile), None
        else:
            level = measure(rung(k)).judge(latency_budget_ms, percentile)
            if wait := drain_s(level, run_cost_s):
                drain(wait)
        runs += 1
        votes.setdefault(k, []).append(level.held)
        held_k = 2 * sum(votes[k]) > len(votes[k])
        if level.held == held_k:  # a tie keeps the failed run
            levels[k] = level
        held = [j for j, lv in levels.items() if lv.held]
        failed = [j for j, lv in levels.items() if not lv.held]
        top = max((j for j in held if not failed or j < min(failed)), default=None)
        if failed and top is not None and min(failed) == top + 1:
            if not undecided(levels, votes, top + 1, percentile):
                break  # bracketed: held, and the rung above not
            k = top + 1
            continue
        if levels[k].held:
            fast = latency_budget_ms is not None and levels[k].latency(percentile) < FAST_CLIMB * latency_budget_ms
            k = k + (2 if fast and not failed else 1)
            if failed and k >= min(failed):
                k = min(failed) - 1 if min(failed) - 1 not in levels else top + 1
        elif level.throughput < 0.9 * level.offered:  # far behind: the rung below what it did serve
            k = min(k - 1, rung_of(level.throughput * 0.95, down=True))
        elif not held and latency_budget_ms is not None and level.latency(percentile) >= SLOW_DESCENT * latency_budget_ms:
            k = k - 2
        else:
            k = k - 1
        while k in levels and levels[k].held and (k + 1) not in levels:
            k += 1
        if k in levels or (floor is not None and k < rung_of(floor)):
            break
    return capacity_of(levels, latency_budget_ms, percentile, arrivals, runs)


def refine(measure: Callable[[float], RateLevel], cap: Capacity, max_runs: int = REFINE_RUNS,
           out_of_time: Callable[[float], bool] = lambda seconds: False, run_cost_s: float = 0.0,
           drain: Callable[[float], None] = time.sleep) -> Capacity:
    """`cap` with its claim at the half rung above it when that is held, by the same rules as a rung: one held run holds
    it; a failure counts only when most runs fail, at once when the server fell far behind (and was not out of line). A
    capacity with no failure above it, or none at all, is returned as it is."""
    if not cap.bounded or not cap.rate_per_s:
        return cap
    levels: dict[float, RateLevel] = {half_rung_of(lv.offered): lv for lv in cap.curve}
    half = half_rung_of(cap.rate_per_s) + 0.5
    if half % 1 == 0 or half in levels:  # refined already: the claim is a half rung, or its half rung was measured
        return cap
    budget, percentile = cap.latency_budget_ms, cap.percentile
    votes: dict[float, list[bool]] = {half: []}
    while len(votes[half]) < max_runs and not out_of_time(run_cost_s):
        level = measure(rung(half)).judge(budget, percentile)
        votes[half].append(level.held)
        if level.held == (2 * sum(votes[half]) > len(votes[half])):  # the run that stands for the majority (a tie: failed)
            levels[half] = level
        if wait := drain_s(level, run_cost_s):
            drain(wait)
        if votes[half] == [True] or not undecided(levels, votes, half, percentile):
            break
    if not votes[half]:
        return cap
    held = half in levels and levels[half].held
    return replace(cap, rate_per_s=rung(half) if held else cap.rate_per_s, runs=cap.runs + len(votes[half]),
                   curve=[levels[j] for j in sorted(levels)])


def undecided(levels: dict[float, RateLevel], votes: dict[float, list[bool]], j: float, percentile: int) -> bool:
    """Whether failed rung j, right above the capacity, needs another run: one failure, unless the server fell far behind
    at a rate no slower than the rungs above; or one of each."""
    tally = votes[j]
    if len(tally) == 1:
        far_behind = levels[j].throughput < 0.9 * levels[j].offered
        return not far_behind or out_of_line(levels, j, percentile)
    return len(tally) == 2 and tally[0] != tally[1]


def out_of_line(levels: dict[float, RateLevel], j: float, percentile: int) -> bool:
    """Whether rung j was measured slower (at the percentile) than a higher rung was."""
    return any(i > j and lv.latency(percentile) < levels[j].latency(percentile) for i, lv in levels.items())


def capacity_of(levels: dict[int, RateLevel], latency_budget_ms: float | None, percentile: int, arrivals: str,
                runs: int | None = None) -> Capacity:
    """The highest held rung below the lowest failed one (a held rung above a failure is taken as the noise it is);
    `runs`: the measurements taken (a rung measured again counts twice), len(levels) when not given."""
    failed = [j for j, lv in levels.items() if not lv.held]
    held = [j for j, lv in levels.items() if lv.held and (not failed or j < min(failed))]
    top = max(held, default=None)
    curve = [levels[j] for j in sorted(levels)]
    return Capacity(rung(top) if top is not None else None, latency_budget_ms, percentile, arrivals, runs or len(levels), curve,
                    bounded=bool(failed) and top is not None and min(failed) == top + 1)


def seed_rate(closed_loop: list[tuple[float, float]], latency_budget_ms: float | None) -> float:
    """Where a capacity search starts, from a config's closed-loop levels (throughput, percentile latency): SEED_SHARE of
    the most it served within the budget; with none within, half of what its lightest load served."""
    within = [t for t, lat in closed_loop if latency_budget_ms is None or lat <= latency_budget_ms]
    if within:
        return SEED_SHARE * max(within)
    return 0.5 * min((t for t, _ in closed_loop), default=2 * LOWEST_RATE)
