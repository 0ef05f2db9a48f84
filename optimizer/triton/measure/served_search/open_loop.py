"""The served search's open-loop stage: the finalists' capacities under independent arrivals, and the published choice.

Closed-loop clients never queue more requests than there are clients, so the closed-loop pass only picks the batchers.
With a latency budget the finalists are two batchers in two instance layouts (requests side by side, or one at a time
with more threads; _highest_capacity says which); each is screened with one run at one rate, the best screened is driven
open-loop at rates on one grid (measure/capacity.py) and the others challenge it; the highest capacity wins (equal
capacities: the lower percentile latency at that rate). With --rate R and no budget, the closed-loop best, the best with
another layout and the best that batches differently are driven at R: the lowest percentile latency among those that
keep up with R wins. With a latency budget alone (no rate) the choice stays closed-loop and only the published config's
capacity is measured, for the report. Finalists compare rung for rung; the published config's claim is then refined to
the half rung above it.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import replace
from typing import Callable

from optimizer.events import Event
from optimizer.records.capacity import HELD_THROUGHPUT, Capacity, RateLevel, arrivals_label
from optimizer.records.served_search import OperatingPoint, ServedVariant
from optimizer.triton.measure.capacity import MAX_RATE_RUNS, capacity_of, drain_s, find_capacity, refine, rung, rung_of, seed_rate
from optimizer.triton.measure.served_search.clock import OutOfTime
from optimizer.triton.measure.served_search.points import SearchSpace, layouts
from optimizer.triton.runtime.perf_analyzer_rate import RATE_WINDOW_MS, RATE_WINDOWS, rate_window_ms

FINALISTS = 3
"""Variants measured open-loop at most: with a budget the best's batcher in two layouts and a larger or another batching;
with a rate alone the closed-loop best, the best with another instance layout, the best that batches differently."""
FILLED = 0.9
"""A batcher whose closed-loop batches average this share of its max or more is full: the clients filled it, so the
question open-loop is whether bursts fill a larger one."""
BURST_QUEUE = 4
"""Requests a server's queue holds on average at 90% utilisation under Poisson arrivals (M/D/1: rho^2 / (2 (1 - rho)),
4.05): the least max a larger batcher gets, one that the bursts near capacity fill."""
RUN_OVERHEAD_S = 1.5
"""perf_analyzer's start and exit around an open-loop run's windows."""
EXPECTED_RUNS = 4
"""Runs a finalist's capacity usually takes from its closed-loop seed, its bounding failure confirmed (the reserve is
planned on it)."""
LOAD_S = 3.0
"""Loading and warming a finalist again."""
REFINE_EXPECTED_RUNS = 2
"""Runs the published claim's half rung usually takes (one when held, two when its failure is confirmed)."""


def run_cost_s() -> float:
    """Seconds one open-loop run takes."""
    return RATE_WINDOWS * RATE_WINDOW_MS / 1000.0 + RUN_OVERHEAD_S


def open_loop_reserve(rate_objective: bool, variant_cost_s: float = 0.0) -> float:
    """Seconds the closed-loop exploration leaves for this stage: the published config's capacity; under a rate objective
    the other finalists' screening runs and two closed-loop variants (`variant_cost_s` each: finalists the pass did not
    measure), one run of each challenger that held its screen (a rung above the leader's capacity: whether it can win;
    more only when time is left); then the published claim's half rung (the finalist loaded again under a rate
    objective). Closed-loop time picks the batchers: a reserve that leaves the pass one or two variants leaves it little
    to offer."""
    if not rate_objective:
        return EXPECTED_RUNS * run_cost_s() + LOAD_S + REFINE_EXPECTED_RUNS * run_cost_s()
    runs = EXPECTED_RUNS + 2 * (FINALISTS - 1) + REFINE_EXPECTED_RUNS
    return runs * run_cost_s() + (FINALISTS + 2) * LOAD_S + 2 * variant_cost_s


def layout(point: OperatingPoint) -> tuple[int, int | None]:
    """How a point serves requests: its instances and the threads each runs."""
    return point.instances, point.threads


def batching(point: OperatingPoint) -> tuple[bool, bool]:
    """Whether a point batches, and whether it waits for a batch to fill."""
    return point.max_batch_size > 1, point.queue_delay_us > 0


def finalists(ranked: list[ServedVariant], count: int = FINALISTS) -> list[ServedVariant]:
    """The closed-loop best, then the best with another instance layout (N waiting clients never have more than N requests
    in flight, so whether requests run side by side or one at a time with more threads shows under independent arrivals),
    then the best that batches differently (a delay or a max where the best has none, or the other way round), then the
    next best."""
    if not ranked:
        return []
    first = ranked[0]
    picked = [first]
    for differs in (lambda v: layout(v.point) != layout(first.point), lambda v: batching(v.point) != batching(first.point)):
        other = next((v for v in ranked[1:] if differs(v) and v not in picked), None)
        picked += [other] if other is not None else []
    picked += [v for v in ranked[1:] if v not in picked]
    return picked[:count]


class OpenLoopStage:
    """Measures finalists open-loop on the search's server and sets the run's best to the one chosen."""

    def __init__(self, run, request, search, space: SearchSpace) -> None:
        self.run, self.request, self.search, self.space = run, request, search, space
        self.pct, self.budget = request.percentile, request.latency_budget_ms
        self.capacities: list[tuple[ServedVariant, Capacity]] = []

    def _say(self, message: str) -> None:
        self.run.on_event(Event("serve", "progress", self.run.label, message))

    def _out_of_time(self, seconds: float) -> bool:
        return self.run.clock.passed(seconds)

    def _measure(self, name: str) -> Callable[[float], RateLevel]:
        bench = self.run.bench

        def measure(rate: float) -> RateLevel:
            with bench.watch() as watch:
                level = bench.measure_rate(name, rate)
            level.others_busy = watch.peak_within(RATE_WINDOWS * RATE_WINDOW_MS / 1000.0)
            mark = "held" if level.judge(self.budget, self.pct).held else f"not held: {level.why}"
            self._say(f"open-loop {rate:g}/s ({arrivals_label(self.arrivals)}): {level.throughput:.1f}/s p{self.pct} "
                      f"{level.latency(self.pct):.1f} ms, {mark}")
            return level

        return measure

    @property
    def arrivals(self) -> str:
        return "trace" if self.run.bench.trace_ms else self.request.arrivals

    def capacity(self, v: ServedVariant, seed: float, budget: float | None = None, runs: int = MAX_RATE_RUNS,
                 refined: bool = False, floor: float | None = None, prior: RateLevel | None = None) -> Capacity | None:
        """`v`'s capacity from `seed` requests/s (None when it does not load again); `refined`: its claim to the half rung;
        `floor`: a challenger's search stops below the leader's capacity; `prior`: its screening run."""
        with self.run.measurer.loaded(v.point) as name:
            if name is None:
                return None
            return self._search(name, v, seed, budget, runs, refined, floor, prior)

    def _search(self, name: str, v: ServedVariant, seed: float, budget: float | None, runs: int = MAX_RATE_RUNS,
                refined: bool = False, floor: float | None = None, prior: RateLevel | None = None) -> Capacity:
        cap = find_capacity(self._measure(name), budget, self.pct, self.arrivals, seed, max_runs=runs, out_of_time=self._out_of_time,
                            run_cost_s=run_cost_s(), drain=self.run.bench.drain, floor=floor, prior=prior)
        if refined:
            cap = self._refine(name, cap)
        return self._stands(v, cap, seed)

    def _stands(self, v: ServedVariant, cap: Capacity, seed: float) -> Capacity:
        cap.point, cap.window_ms, cap.windows = v.point.label, rate_window_ms(cap.rate_per_s or seed), RATE_WINDOWS
        self.capacities.append((v, cap))
        self._say(f"{v.point.label}: {cap.describe()}")
        return cap

    def _refine(self, name: str, cap: Capacity) -> Capacity:
        return refine(self._measure(name), cap, out_of_time=self._out_of_time, run_cost_s=run_cost_s(), drain=self.run.bench.drain)

    def refined(self, v: ServedVariant, cap: Capacity | None) -> Capacity | None:
        """The published config's claim refined to the half rung (loaded again), when time is left; as it was otherwise."""
        if cap is None or not cap.bounded or self._out_of_time(run_cost_s() + LOAD_S):
            return cap
        with self.run.measurer.loaded(v.point) as name:
            if name is None:
                return cap
            fine = self._refine(name, cap)
        if fine is not cap:
            self.capacities = [(u, fine if c is cap else c) for u, c in self.capacities]
            self._say(f"{v.point.label}, the claim refined: {fine.describe()}")
        return fine

    def closed_seed(self, v: ServedVariant, budget: float | None) -> float:
        return seed_rate([(lv.throughput, lv.latency(self.pct)) for lv in v.curve], budget)

    # -- the stage -----------------------------------------------------------------------------------------------------
    def run_stage(self) -> None:
        """Measure, choose, and record the published config's capacity in the search."""
        best = self.run.best
        if best is None:
            return
        if not self.request.rate_objective:  # a latency budget alone: the closed-loop choice stands, its capacity is stated
            cap = self.capacity(best, self.closed_seed(best, self.budget), self.budget, refined=True)
            self._record(best, cap)
            return
        if self.budget is not None:
            chosen, cap = self._highest_capacity()
        else:
            self._other_layout()
            chosen, cap = self._lowest_latency_at_rate(finalists(self.run.ranked()), self.request.rate)
        self._record(chosen, self.refined(chosen, cap))

    def _farthest_layout(self, point: OperatingPoint) -> OperatingPoint | None:
        """`point`'s batcher in the instance layout farthest from its own; None with one layout only (one core, or beside
        other processes' load: HELD_LAYOUT)."""
        others = [lay for lay in layouts(self.run.spaces.get(point.candidate, self.space)) if lay != layout(point)]
        if not others:
            return None
        n, t = max(others, key=lambda lay: abs(math.log2(lay[0]) - math.log2(point.instances)))
        return replace(point, instances=n, threads=t)

    def _other_layout(self) -> None:
        """The closed-loop best's batcher in the instance layout farthest from its own, measured closed-loop when the pass did
        not (a short pass, or another kind's candidate entering, can spend it on one layout; a pass that tried the other
        layout may have tried it with a smaller batcher only): under independent arrivals the layout can decide more than
        the batcher, and only a measured variant can be a finalist."""
        ranked = self.run.ranked()
        if ranked and (twin := self._farthest_layout(ranked[0].point)) is not None:
            self._measured(twin)

    def _measured(self, point: OperatingPoint) -> ServedVariant | None:
        """`point` measured closed-loop unless the pass did; None when it failed there, fails now or does not fit."""
        known = next((v for v in self.run.ranked() if v.point == point), None)
        if known is not None or any(v.point == point for v in self.run.search.variants):
            return known
        try:
            self.run.measure([point], "refine")
        except OutOfTime:
            return None
        return next((v for v in self.run.ranked() if v.point == point), None)

    def _finalist(self, point: OperatingPoint | None) -> ServedVariant | None:
        """`point` as a finalist (_measured), when its screening run still leaves the leader its search and its claim's
        half rung."""
        if point is None:
            return None
        known = any(v.point == point for v in self.run.ranked())
        later = (EXPECTED_RUNS - 1 + REFINE_EXPECTED_RUNS) * run_cost_s() + LOAD_S
        if self._out_of_time((0.0 if known else self.run.clock.variant_cost()) + run_cost_s() + LOAD_S + later):
            return None
        return self._measured(point)

    def _other_batcher(self, best: ServedVariant) -> OperatingPoint | None:
        """The third finalist's batcher: for a best that batches, a larger max when its batches filled it, else the best
        other batching of its model file the pass measured, else max 1; for a best of max 1, that other batching first, then
        the larger max (the pass may have measured max 1 only, when another kind's candidates took its time)."""
        other = next((v.point for v in self.run.ranked()
                      if v.point.candidate == best.point.candidate and batching(v.point) != batching(best.point)), None)
        larger = self._larger_batcher(best)
        if best.point.max_batch_size == 1:
            return other or larger
        return larger or other or replace(best.point, max_batch_size=1, preferred=(), queue_delay_us=0)

    def _larger_batcher(self, best: ServedVariant) -> OperatingPoint | None:
        """Twice the best's max, at least BURST_QUEUE (no preferred sizes, its delay, within the largest batch that fit),
        when its closed-loop batches filled it (max 1 always does) and the user fixed no max: clients cap the batches
        the pass sees, so a batcher they filled ranks above larger ones that bursts of independent arrivals fill too."""
        point, space = best.point, self.run.spaces.get(best.point.candidate, self.space)
        m = point.max_batch_size
        if not space.batching or space.fixed_max or m < 1 or (m > 1 and (best.server_batch or 0.0) < FILLED * m):
            return None
        larger = min(max(2 * m, BURST_QUEUE), space.largest_fit)
        return replace(point, max_batch_size=larger, preferred=()) if larger > m else None

    def _highest_capacity(self) -> tuple[ServedVariant, Capacity | None]:
        """Highest capacity within the budget. The finalists are two batchers in two instance layouts: the closed-loop
        best's batcher in its layout and in the farthest one, then another batcher in the layout that screened better
        (_other_batcher: a larger max when the best's batches filled it, or another batching). Each is screened with one
        run at one rate (the best's seed): one run tells a config at 20 ms from one at 300 ms, which closed-loop clients
        cannot. The best screened (_screen_key) is searched from its screening run. A challenger that failed a rate the
        leader held is dropped (latency only grows with the rate); the others start a rung above the leader's capacity
        (one run says whether they can win) and stop once they fail the leader's. Equal capacities go to the lower
        percentile latency at that rate."""
        best = self.run.ranked()[0]
        with Screening(self, rung(rung_of(self.closed_seed(best, self.budget)))) as screen:
            screen.take(best)
            screen.take(self._finalist(self._farthest_layout(best.point)))
            if screen.leader is not None and (third := self._other_batcher(best)) is not None:
                n, threads = layout(screen.leader.point)
                screen.take(self._finalist(replace(third, instances=n, threads=threads)))
            lead = screen.search_leader()
        screened = screen.screened
        if not screened:
            return best, None
        leader = screened[0][0]
        for v, level in screened[1:]:
            if not level.held and screened[0][1].held:
                break  # it fails a rate the leader holds: it cannot win (sorted: nor can the rest)
            if self._out_of_time(run_cost_s() + LOAD_S):
                break
            if lead is not None and lead.rate_per_s:
                seed, floor = rung(rung_of(lead.rate_per_s) + 1), lead.rate_per_s
            else:
                seed, floor = level.offered, None
            cap = self.capacity(v, seed, self.budget, floor=floor, prior=level)
            if cap is not None and _beats(cap, lead, self.pct):
                leader, lead = v, cap
        searched = [u for u, _ in self.capacities]
        for v, level in screened:  # dropped after its screen (or out of time): its one run, in the report's finalists
            if v not in searched:
                self._stands(v, capacity_of({rung_of(level.offered): level}, self.budget, self.pct, self.arrivals), level.offered)
        return leader, lead

    def _lowest_latency_at_rate(self, pool: list[ServedVariant], rate: float) -> tuple[ServedVariant, Capacity | None]:
        """--rate R without a budget: each finalist at R; of those that keep up, the lowest percentile latency. When none
        keeps up, R needs several replicas: the highest rate kept up with (no latency target) decides."""
        at_rate: list[tuple[ServedVariant, RateLevel]] = []
        for k, v in enumerate(pool):
            if k and self._out_of_time(run_cost_s() + LOAD_S):
                break
            with self.run.measurer.loaded(v.point) as name:
                if name is not None:
                    at_rate.append((v, self._measure(name)(rate)))
                    if wait := drain_s(at_rate[-1][1], run_cost_s()):  # what it queued must not meet the next finalist
                        self.run.bench.drain(wait)
        kept = [(v, lv) for v, lv in at_rate if lv.throughput >= HELD_THROUGHPUT * lv.offered]
        if kept:
            v, level = min(kept, key=lambda p: p[1].latency(self.pct))
            cap = Capacity(None, None, self.pct, self.arrivals, 1, [level], bounded=False)
            cap = self._kept_up_with(v, rate, cap)
            return v, cap
        best = max(at_rate, key=lambda p: p[1].throughput, default=None)
        if best is None:
            return pool[0], None
        v, level = best
        return v, self.capacity(v, level.throughput * 0.95)

    def _kept_up_with(self, v: ServedVariant, rate: float, at_rate: Capacity) -> Capacity:
        """The highest rate `v` keeps up with (no latency target), from R up, for the replica count; R itself when the
        time is out."""
        if self._out_of_time(EXPECTED_RUNS * run_cost_s() + LOAD_S):
            return replace(at_rate, rate_per_s=rung(rung_of(rate, down=True)), bounded=False)
        cap = self.capacity(v, rate)
        if cap is None:
            return at_rate
        cap.curve = sorted([*at_rate.curve, *cap.curve], key=lambda lv: lv.offered)
        cap.runs += at_rate.runs
        return cap

    def _record(self, chosen: ServedVariant, cap: Capacity | None) -> None:
        search, request = self.search, self.request
        if self.request.rate_objective:
            self.run.best = chosen
        search.open_loop = [{"point": v.point.to_json(), "label": v.point.label, "capacity": c.to_json()} for v, c in self.capacities]
        if cap is None:
            search.capacity = None
            return
        cap.target_rate, cap.headroom = request.rate, request.headroom
        cap.point = chosen.point.label
        search.capacity = cap.to_json()


class Screening:
    """Finalists' runs at one rate, best first (_screen_key). The best so far stays loaded (the one that screened worse is
    unloaded at once), so the finalist searched first is not loaded twice."""

    def __init__(self, stage: OpenLoopStage, rate: float) -> None:
        self.stage, self.rate = stage, rate
        self.screened: list[tuple[ServedVariant, RateLevel]] = []
        self._kept: tuple[ServedVariant, RateLevel, str, ExitStack] | None = None

    def __enter__(self) -> Screening:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._kept is not None:
            self._kept[3].close()
            self._kept = None

    @property
    def leader(self) -> ServedVariant | None:
        return self.screened[0][0] if self.screened else None

    def take(self, v: ServedVariant | None) -> None:
        """`v` loaded and driven once at the rate (nothing when it is None, screened already, or does not load)."""
        stage = self.stage
        if v is None or any(u.point == v.point for u, _ in self.screened):
            return
        stack = ExitStack()
        name = stack.enter_context(stage.run.measurer.loaded(v.point))
        if name is None:
            stack.close()
            return
        with ExitStack() as on_error:  # unloaded if the run raises; kept (or not) below once it is measured
            on_error.push(stack)
            level = stage._measure(name)(self.rate).judge(stage.budget, stage.pct)
            if wait := drain_s(level, run_cost_s()):
                stage.run.bench.drain(wait)
            on_error.pop_all()
        self.screened = sorted([*self.screened, (v, level)], key=lambda p: _screen_key(p[1], stage.pct))
        worse: tuple[ServedVariant, RateLevel, str, ExitStack] | None = (v, level, name, stack)
        if self._kept is None or _screen_key(level, stage.pct) < _screen_key(self._kept[1], stage.pct):
            worse, self._kept = self._kept, worse
        if worse is not None:
            worse[3].close()

    def search_leader(self) -> Capacity | None:
        """The best screened's capacity, searched on from its screening run while it is still loaded."""
        if self._kept is None:
            return None
        stage = self.stage
        stage._say(f"screened at {self.rate:g}/s: " + ", ".join(
            f"{v.point.label} {'held' if lv.held else 'not held'} (p{stage.pct} {lv.latency(stage.pct):.1f} ms, {lv.throughput:.1f}/s)"
            for v, lv in self.screened))
        v, level, name, _ = self._kept
        return stage._search(name, v, self.rate, stage.budget, prior=level)


def _screen_key(level: RateLevel, percentile: int) -> tuple[int, float]:
    """Held, then kept up (over the budget), then fell behind; within the first two the lower percentile latency, within
    the last the higher throughput (a queue that grew through the run makes its latency say how long the run was)."""
    if level.held:
        return 0, level.latency(percentile)
    if level.throughput >= HELD_THROUGHPUT * level.offered:
        return 1, level.latency(percentile)
    return 2, -level.throughput


def _beats(cap: Capacity, lead: Capacity | None, percentile: int) -> bool:
    """Whether `cap` is a higher capacity than `lead` (equal: a lower percentile latency at the rate both held)."""
    if lead is None or lead.rate_per_s is None:
        return cap.rate_per_s is not None
    if cap.rate_per_s is None or cap.rate_per_s < lead.rate_per_s:
        return False
    if cap.rate_per_s > lead.rate_per_s:
        return True
    mine, theirs = cap.held_level, lead.held_level
    return mine is not None and theirs is not None and mine.latency(percentile) < theirs.latency(percentile)
