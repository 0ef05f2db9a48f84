"""The served search's stage policy: which variants to measure, in what order, and which one is best so far.

The stages (points.py says which points): the rules' start, the coarse pass, the refinement of the best two (then, with
time left, of the others that could still win), a close call settled by interleaved re-measurement (A B B A), and the
published variant at one request at a time (the anchor of validate's prediction). Time is the clock's (clock.py);
loading and measuring a variant is the measurer's (measurer.py).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import zip_longest

from optimizer.events import Event, EventSink
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch, ServedVariant
from optimizer.triton.measure.served_search.clock import BudgetClock, OutOfTime
from optimizer.triton.measure.served_search.measure import Bench, mean_level, settle_level
from optimizer.triton.measure.served_search.measurer import DISTURBED, LOAD_GROUP, SETTLE_ROUNDS, ServerGone, VariantMeasurer
from optimizer.triton.measure.served_search.objective import OUT_OF_RUNNING, OUT_OF_RUNNING_BELOW, Objective, robust_ratios, worst_so_far
from optimizer.triton.measure.served_search.points import (LATENCY_GAIN, THROUGHPUT_NOISE, SearchSpace, better, close, coarse_grid, delay_tried,
                                                           fill_delay_us, fill_level, latency_at, padded_later, refinements, seed_concurrency)

__all__ = ["SearchRun", "OutOfTime", "ServerGone", "LOAD_GROUP"]

REFINE_ROUNDS = 3
"""Refinement rounds at most: a round refines the best two, which a round can replace (a queue delay that fills the batch
can make a new runner-up whose own neighbours are then unmeasured)."""
BURST_SLOWDOWN = 4.0
"""The most another process's load is taken to slow a served variant: a disturbed level below the best undisturbed one at
its load by more is not measured again (_out_of_reach), so the time for repeats goes to levels that can change the choice."""
FILL_LIFT = 2.0
REFINE_LIFT = 1.5
"""The most a refinement is taken to lift a variant (_time_left): a fill delay can about double a variant at a light load;
the rules' delay, a preferred size or a max between two measured ones move it far less."""
SUSPECT = DISTURBED / 2
"""Others' load above the baseline that makes a level a lower bound for the order of the refinement (not for repeats or
the published choice, which keep DISTURBED): near saturation a burst gets only its share of the cores, so it reads low."""


class SearchRun:
    """What was measured, the best so far, and the order of the stages."""

    def __init__(self, search: ServedSearch, objective: Objective, percentile: int, latency_budget_ms: float | None, clock: BudgetClock,
                 measurer: VariantMeasurer, on_event: EventSink, label: str = "") -> None:
        self.search, self.objective, self.percentile, self.budget_ms = search, objective, percentile, latency_budget_ms
        self.clock, self.measurer, self.on_event, self.label = clock, measurer, on_event, label
        self.seen: dict[OperatingPoint, ServedVariant] = {}
        self.best: ServedVariant | None = None
        self.robust: dict[OperatingPoint, tuple[float, int]] = {}  # robust objectives: each point's worst score, and where
        self.spaces: dict[str, SearchSpace] = {}  # another candidate's own search space (the selected's is explore's)
        self.gone = ""  # why the server stopped answering, when it did
        measurer.out_of_reach = self._out_of_reach

    @property
    def bench(self) -> Bench:
        return self.measurer.bench

    # -- the order ---------------------------------------------------------------------------------------------------
    def explore(self, space: SearchSpace) -> str:
        """Coarse pass, refinement of the best two (repeated while it changes them), settle a close call; returns why the
        search ended.

        The coarse pass and the refinement stop early enough to leave the settling its time. Why: a search that spends
        its whole budget exploring picks between close variants on one short window each, which the noise can decide.
        When nothing was close enough to settle, the time kept for it goes back to the refinement, so a reserve that is
        not needed does not end the exploration early."""
        every = "every variant of the coarse pass and the refinement was measured"
        out_of_time = f"the time budget ({self.clock.budget_s:.0f} s, --serve-search-seconds) ran out"
        stopped = every
        try:
            try:
                with self.clock.keeping(self._settle_reserve()):
                    self._explore(space)
            except OutOfTime:
                stopped = out_of_time
            try:
                if stopped == out_of_time:
                    self._likeliest_gain(space)
                self.settle()
                if not self.search.settled and stopped == out_of_time:  # nothing to settle: the time kept for it explores
                    stopped = every
                    self._explore(space)
            except OutOfTime:
                stopped = out_of_time
        except ServerGone as err:
            self.gone = str(err)
            return f"{err}; the best variant measured before stands"
        return stopped

    def _likeliest_gain(self, space: SearchSpace) -> None:
        """The exploration ran out of time: with no load given, a variant that could serve more than the best (first in
        `_to_refine`, not in the ranking) has its fill delay measured before a close call is settled. Why: a settling
        only picks between two variants within the noise (CLOSE) of each other, while a fill delay can lift its variant
        far more at the light load (FILL_LIFT), so under other processes' load, when the budget ends in the coarse pass,
        the delay is the likelier gain (see benchmarks/noisy_choice.py and its record in benchmarks/results/)."""
        if not self.objective.robust:
            return
        order, ranked = self._to_refine(space), self.ranked()
        if not order or order[0].point == ranked[0].point:
            return
        if (filled := self._pending_fill(order[0], space)) is not None:
            self.measure([filled], "refine")

    def _pending_fill(self, v: ServedVariant, space: SearchSpace) -> OperatingPoint | None:
        """`v` with the queue delay that would fill its batches at the lightest load, when that is not measured yet."""
        delay = fill_delay_us(v, self._space(v, space))
        filled = replace(v.point, queue_delay_us=delay) if delay is not None else None
        return filled if filled is not None and not delay_tried(filled, set(self.seen)) else None

    def _explore(self, space: SearchSpace) -> None:
        """What the coarse pass has not measured yet, then the refinement around the best two, again while a round
        replaced them (REFINE_ROUNDS at most), then with time left around every other variant that could still win, best
        first (_time_left). Why the last: a small model's coarse pass and refinement can end well inside the budget,
        and the time left is best spent on the variants that could still win with a queue delay, rather than unused.
        With no load given, a padding backend's maxima above PADDED_FIRST come last, with the time left."""
        grid = self._coarse_points(space)
        later = [p for p in grid if padded_later(p, self.spaces.get(p.candidate, space))]  # with the time left (PADDED_FIRST)
        self.measure([p for p in grid if p not in later], "coarse")
        for _ in range(REFINE_ROUNDS):
            if not self._refine(self._to_refine(space)[:2], space):
                break
        if rest := self._time_left(space):  # time left: around every other variant that could still win
            self.measure(rest, "refine")
            self._refine(self._to_refine(space)[:2], space)  # which may have made a new best two
        if later:
            self.measure(later, "coarse")
            self._refine(self._to_refine(space)[:2], space)

    def _coarse_points(self, space: SearchSpace) -> list[OperatingPoint]:
        """The coarse pass of every candidate in the search (the selected one's and another kind's), the candidate whose
        variant ranks highest first: when the other kind already leads, its layouts and maxima are measured before the
        selected one's."""
        grids = {"": coarse_grid(space), **{c: [replace(p, candidate=c) for p in coarse_grid(own)] for c, own in self.spaces.items()}}
        ranked = self.ranked()
        order = sorted(grids, key=lambda c: next((i for i, v in enumerate(ranked) if v.point.candidate == c), len(ranked)))
        return [p for c in order for p in grids[c] if p not in self.seen]

    def _to_refine(self, space: SearchSpace, ratios: dict[int, tuple[float, int]] | None = None) -> list[ServedVariant]:
        """Measured variants in the order their refinements are tried: the objective's ranking; with no load given, by
        what each could serve, not by what its worst level happened to show. A level another process's load reached
        (SUSPECT: kept when the repeats ran out, or below their threshold) is a lower bound and does not rank it; a
        variant whose batches did not fill at the ladder's lightest load ranks by its other loads until its fill delay
        is measured (the delay is its likeliest gain, and the light load is where it fails). Why: ranked by a light level
        its delay would lift, or by a level a burst of other load pulled down, a variant that could win falls behind and
        its refinement is never measured (see benchmarks/noisy_choice.py and its record in benchmarks/results/).
        `ratios`: _refine_ratios, when the caller has them."""
        ranked = self.ranked()
        if not self.objective.robust:
            return ranked
        ratios = self._refine_ratios(space) if ratios is None else ratios
        return sorted(ranked, key=lambda v: -ratios.get(id(v), (0.0, 0))[0])  # stable: the objective's order breaks ties

    def _refine_ratios(self, space: SearchSpace) -> dict[int, tuple[float, int]]:
        """No load given: each measured variant's worst ratio to the best (by id), from the levels that rank it for the
        refinement (_to_refine)."""
        curves, skip = {}, {}
        for v in self.ranked():
            aside = {lv.concurrency for lv in v.curve if self.measurer.disturbed(lv, SUSPECT)}
            if self._pending_fill(v, space) is not None and (light := fill_level(v)) is not None:
                aside.add(light.concurrency)
            curves[id(v)], skip[id(v)] = [lv for lv in v.curve if lv.concurrency not in aside], aside
        return robust_ratios({k: c for k, c in curves.items() if c}, self.percentile, skip=skip)

    def _time_left(self, space: SearchSpace) -> list[OperatingPoint]:
        """With time left after the best two, the refinements of every other variant that could still win, best first:
        all of them where its score times REFINE_LIFT reaches the leader's, only its fill delay where only FILL_LIFT does
        (a delay that fills its batches, once measured, is a variant of its own and refined if it comes within reach).
        The score: the throughput at the load; with no load given, the worst ratio to the best, a pending fill delay's
        light load set aside (_refine_ratios). With a latency budget, every variant (a refinement can bring one under it).
        Why: a refinement lifts a variant by a bounded amount (REFINE_LIFT, FILL_LIFT), so refining one that stays below
        the leader even then spends the budget on variants that cannot be published."""
        if self.objective.robust:
            ratios = self._refine_ratios(space)
            rest = self._to_refine(space, ratios)[2:]
            score = {v.point: ratios.get(id(v), (0.0, 0))[0] for v in self.seen.values()}
        else:
            rest = self._to_refine(space)[2:]
            score = {v.point: v.throughput or 0.0 for v in self.seen.values() if v.status == "measured"}
        lead = max(score.values(), default=0.0)
        todo: list[OperatingPoint] = []
        for v in rest:
            reach = score.get(v.point, 0.0)
            if self.objective.latency_budget_ms is not None or reach * REFINE_LIFT >= lead:
                todo += self._refinements(v, space)
            elif not self.objective.robust and reach * FILL_LIFT >= lead and (filled := self._pending_fill(v, space)):
                todo.append(filled)
        return [p for p in dict.fromkeys(todo) if p not in self.seen]

    def _space(self, v: ServedVariant, space: SearchSpace) -> SearchSpace:
        """The space of the candidate `v` serves (another kind's has its own peak, fit and padding)."""
        return self.spaces.get(v.point.candidate, space)

    def _refinements(self, v: ServedVariant, space: SearchSpace) -> list[OperatingPoint]:
        """refinements() around `v` in its candidate's space, against what was measured of that candidate."""
        own = self._space(v, space)
        return [replace(p, candidate=v.point.candidate) for p in
                refinements(replace(v.point, candidate=""), own, {replace(p, candidate="") for p in self.seen if p.candidate == v.point.candidate},
                            fill_delay_us(v, own))]

    def _refine(self, top: list[ServedVariant], space: SearchSpace) -> bool:
        """Measure the refinements around `top`, interleaved (the first's likeliest, the second's, ...); False if none is left."""
        each = [self._refinements(v, space) for v in top]
        todo = [p for rank in zip_longest(*each) for p in rank if p is not None]
        if todo:
            self.measure(todo, "refine")
        return bool(todo)

    def _settle_reserve(self) -> float:
        """Seconds kept for settling a close call: at the target load, or at three loads of the ladder."""
        return self._settle_cost(3 if self.objective.robust else 1)

    def _settle_cost(self, loads: int) -> float:
        return self.clock.settle_cost(loads, self.objective.robust, self.bench.window_ms)

    def ranked(self) -> list[ServedVariant]:
        """Measured variants, best first by the objective (each point's latest measurement)."""
        pool = [v for v in self.seen.values() if v.status == "measured" and v.throughput is not None]
        if self.objective.robust:
            return self._robust(pool)
        ranked: list[ServedVariant] = []
        for v in pool:
            i = next((k for k, r in enumerate(ranked) if better(v, r, self.budget_ms, self.percentile)), len(ranked))
            ranked.insert(i, v)
        return ranked

    def _robust(self, pool: list[ServedVariant]) -> list[ServedVariant]:
        """No load given: highest worst ratio to the best at each load of the ladder first; ratios within the noise of
        the leader's go to the one that sustains more (its peak)."""
        if not pool:
            return []
        ratios = robust_ratios({id(v): v.curve for v in pool}, self.percentile)
        self.robust = {v.point: ratios[id(v)] for v in pool}
        top = max(r for r, _ in ratios.values())
        lead = [v for v in pool if ratios[id(v)][0] >= top - THROUGHPUT_NOISE]
        rest = [v for v in pool if ratios[id(v)][0] < top - THROUGHPUT_NOISE]
        return (sorted(lead, key=lambda v: -max(lv.throughput for lv in v.curve))
                + sorted(rest, key=lambda v: -ratios[id(v)][0]))

    def _stop_climbing(self, curve: list[LoadLevel]) -> str:
        """Why a variant's sweep ends before the objective is done with it ("" to go on): the time budget ran out (a slow
        model's heavy loads can take most of the budget on one variant), or it is out of the running."""
        if self.clock.passed(explore=True):
            return f"stopped climbing at concurrency {curve[-1].concurrency}: the time budget ran out"
        return self._out_of_running(curve) if self.objective.robust else ""

    def _out_of_running(self, curve: list[LoadLevel]) -> str:
        """No load given: why a variant's ladder stops early ("" while it can still win): its worst ratio at the loads it
        measured is already below half and OUT_OF_RUNNING below the leader's, and more loads can only lower it."""
        if self.best is None or self.best.point not in self.robust:
            return ""
        worst, at = worst_so_far(curve, [v.curve for v in self.seen.values() if v.status == "measured"], self.percentile)
        lead = self.robust[self.best.point][0]
        if worst >= min(lead - OUT_OF_RUNNING, OUT_OF_RUNNING_BELOW):
            return ""
        return (f"stopped climbing at concurrency {curve[-1].concurrency}: {worst:.2f}x the best at concurrency {at}, "
                f"out of the running (the leader's worst is {lead:.2f}x)")

    # -- measuring -----------------------------------------------------------------------------------------------------
    def measure(self, points: list[OperatingPoint], stage: str) -> list[ServedVariant]:
        """Measure points a group at a time (loaded together, measured one after another, unloaded); updates the best."""
        out: list[ServedVariant] = []
        points = list(dict.fromkeys(points))
        while points:
            fits = self.clock.fits(len(points[:LOAD_GROUP]))
            if fits == 0:
                raise OutOfTime()
            group, points = points[:fits], points[fits:]
            out += self.measurer.measure_group(group, stage, self._seed, self._stop_climbing, self._record)
        return out

    def measure_apart(self, points: list[OperatingPoint], bench: Bench, mark: str) -> list[ServedVariant]:
        """Measure points under another request mix (`bench`, e.g. the padded traffic), marked `mark` and kept out of the
        ranking: the search's own best and its curves stay those of the traffic as it comes."""
        kept = (self.measurer.bench, dict(self.seen), self.best, dict(self.robust))
        self.measurer.bench = replace(bench, window_ms=self.bench.window_ms)
        try:
            self.measure(points, mark)
        except OutOfTime:
            pass
        finally:
            self.measurer.bench, self.seen, self.best, self.robust = kept
            for v in self.search.variants:
                if v.stage == mark:
                    v.traffic = mark
        return [v for v in self.search.variants if v.stage == mark]

    def _seed(self, point: OperatingPoint) -> int:
        return self.best.concurrency if self.best is not None and self.best.concurrency else seed_concurrency(point)

    def _record(self, v: ServedVariant, retried_s: float = 0.0) -> None:
        """Keep a measured (or failed) variant, its cost for planning the rest (less any measuring again that others'
        load forced: a burst does not make the next variants dearer), and the best so far."""
        self.search.variants.append(v)
        self.clock.record_cost(v.stage == "start", v.seconds - retried_s)
        if v.status == "measured" and self.objective.robust:
            self.seen[v.point] = v
            self.best = self.ranked()[0]
        elif v.status == "measured":
            top = max((x.throughput or 0.0) for x in self.seen.values()) if self.seen else None
            self.seen[v.point] = v
            if self.best is None or better(v, self.best, self.budget_ms, self.percentile, top):
                self.best = v
        else:
            self.seen.setdefault(v.point, v)
        mark = (f"{v.throughput:.1f}/s p{self.percentile} {latency_at(v, self.percentile):.1f} ms at concurrency {v.concurrency}"
                if v.throughput is not None else f"{v.status}: {v.reason}")
        self.on_event(Event("serve", "progress", self.label, f"{v.stage}: {v.point.label}: {mark}"))

    def _out_of_reach(self, level: LoadLevel) -> bool:
        """Whether a disturbed level stays below the most any variant served undisturbed at its load even if the load had
        slowed it BURST_SLOWDOWN times: taking it again cannot change the choice. Not with a latency budget: there a
        disturbed level's latency decides whether the variant meets it."""
        if self.budget_ms is not None or self.measurer.baseline is None:
            return False
        clean = [lv.throughput for v in self.seen.values() for lv in v.curve if lv.concurrency == level.concurrency and not self.measurer.disturbed(lv)]
        return bool(clean) and level.throughput * BURST_SLOWDOWN < max(clean) * (1 - THROUGHPUT_NOISE)

    # -- a close call ----------------------------------------------------------------------------------------------------
    def settle(self) -> None:
        """When the runner-up is within the noise of repeated measurement of the best, measure both again interleaved
        (A B B A) at one load with longer windows, and keep the one that serves more (then the lower latency)."""
        ranked = self.ranked()
        if self.objective.robust:  # ranked against every variant at every load, not one level
            return self._settle_ladder(ranked)
        if len(ranked) < 2 or not close(ranked[0], ranked[1]):
            return
        a, b = ranked[0], ranked[1]
        level = settle_level(a, b, self.objective)
        if self.clock.passed(self._settle_cost(1)):
            raise OutOfTime()
        if (measured := self.measurer.remeasure([a, b], [level], 2 * self.bench.window_ms)) is None:
            return
        names, levels = {"a": a, "b": b}, {"a": measured[0][level], "b": measured[1][level]}
        pct = self.percentile
        means = {n: mean_level(lv) for n, lv in levels.items()}
        (na, ma), (nb, mb) = means.items()
        ratio = ma.throughput / mb.throughput
        # beyond the noise the faster; a tie in throughput goes to a clearly lower latency at the same load
        winner = na if ratio >= 1 + THROUGHPUT_NOISE else nb if ratio <= 1 - THROUGHPUT_NOISE else (
            nb if mb.latency(pct) < ma.latency(pct) * (1 - LATENCY_GAIN) else na)
        for n, v in names.items():
            again = ServedVariant(v.point, "settle", curve=[means[n]],
                                  reason="mean of " + ", ".join(f"{lv.throughput:.1f}/s" for lv in levels[n]) + f" at concurrency {level}, interleaved")
            again.score_at(means[n])
            again.meets_budget = None if self.budget_ms is None else means[n].latency(pct) <= self.budget_ms
            self.search.variants.append(again)
            if n == winner:
                self.best = again
        self.measurer.keep_only(self.best.point)
        self.search.settled = (f"{a.point.label} and {b.point.label} served within {100 * (1 - min(ratio, 1 / ratio)):.1f}% of each other, "
                               f"measured A B B A at concurrency {level}: {names[winner].point.label} kept")

    def _settle_ladder(self, ranked: list[ServedVariant]) -> None:
        """No load given and the two best within the noise of each other's worst ratio: measure both again, interleaved
        (A B B A), at every load of the ladder both measured, and rank again on the means (one short window a load
        moves a single measurement enough to swap a max that pads for one that does not)."""
        if len(ranked) < 2:
            return
        a, b = ranked[0], ranked[1]
        if self.robust[b.point][0] < self.robust[a.point][0] - THROUGHPUT_NOISE:
            return
        loads = sorted({lv.concurrency for lv in a.curve} & {lv.concurrency for lv in b.curve})
        if not loads or self.clock.passed(self._settle_cost(len(loads))):
            raise OutOfTime()
        if (measured := self.measurer.remeasure([a, b], loads, self.bench.window_ms)) is None:
            return
        names, levels = {"a": a, "b": b}, dict(zip(("a", "b"), measured))
        for n, v in names.items():
            again = ServedVariant(v.point, "settle", curve=[mean_level(levels[n][c]) for c in loads],
                                  reason=f"mean of {SETTLE_ROUNDS} interleaved measurements at each of concurrency {', '.join(map(str, loads))}")
            again.score_at(self.objective.score(again.curve)[0])
            self.search.variants.append(again)
            self.seen[v.point] = again
        # the winner is one of the two: a third measured once would otherwise win by the luck the settling took out of these two
        self.best = next(v for v in self.ranked() if v.point in (a.point, b.point))
        self.measurer.keep_only(self.best.point)
        worst = {v.point: self.robust[v.point][0] for v in names.values()}
        self.search.settled = (f"{a.point.label} (worst {worst[a.point]:.2f}x the best) and {b.point.label} (worst {worst[b.point]:.2f}x) "
                               f"measured again A B B A at concurrency {', '.join(map(str, loads))}: {self.best.point.label} kept")

    def measure_lone_request(self) -> None:
        """The published variant at one request at a time, when its sweep did not reach it and the budget allows: the
        anchor of validate's prediction below the loads the search measured (prediction.py). A settled choice is still
        loaded (parked): measured there, without a load of its own."""
        best = self.best
        one = None
        try:
            cost = self.clock.variant_cost()
            if best is not None and best.level(1) is None and cost:
                one = self.measurer.lone_request(best.point, cost)
        finally:
            self.measurer.keep_only(None)
        if best is None or one is None:
            return
        base = ServedVariant(best.point, "base", curve=[one], reason="one request at a time: the anchor of validate's prediction below the loads the sweep measured")
        base.score_at(one)
        self.search.variants.append(base)
