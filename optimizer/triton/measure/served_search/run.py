"""One served search's run: the order of its stages, loading and measuring variants a group at a time, the best so far.

The stages (points.py says which points): the rules' start, the coarse pass, the refinement of the best two (then, with
time left, of the others that could still win), a close call settled by interleaved re-measurement (A B B A), and the
published variant at one request at a time (the anchor of validate's prediction), measured while the settling still has
it loaded. The budget is a bound: a group that would not finish in it is not started. A group's unloading overlaps the
next group's loading (VariantLoader.unload), never a measurement.

Over 400 lines because every stage reads and updates one state (what was measured, the best, the time left, the
private names), which the tests drive through this module against a made-up server.
"""

from __future__ import annotations

import time
from dataclasses import replace
from itertools import zip_longest
from typing import Callable

from optimizer.errors import ConfigRuleError, PublishError, TemplateError, ValidationError
from optimizer.events import Event, EventSink
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch, ServedVariant
from optimizer.records.tune_result import TuneResult
from optimizer.task.load_watch import LoadWatch, wait_for_quiet
from optimizer.triton.front import VERSION_MARKER, VERSION_MARKER_TEXT, front_config, inner_name, needs_front
from optimizer.triton.model_config import canonical, config_signature, parse
from optimizer.triton.publish import PublishOptions, prepare_config
from optimizer.triton.served_search.answers import wrong_answers
from optimizer.triton.served_search.loader import VariantLoader, private_name, server_gone
from optimizer.triton.served_search.measure import WARMUP_PER_SLOT, Bench, mean_level, measure_level, settle_level, sweep, warm_up
from optimizer.triton.served_search.objective import OUT_OF_RUNNING, OUT_OF_RUNNING_BELOW, robust_ratios, worst_so_far
from optimizer.triton.served_search.points import (LATENCY_GAIN, THROUGHPUT_NOISE, SearchSpace, better, close, coarse_grid, delay_tried,
                                                   fill_delay_us, fill_level, latency_at, padded_later, refinements, seed_concurrency)
from optimizer.triton.served_search.request import SearchRequest
from optimizer.triton.served_search.servers import locally

LOAD_GROUP = 4
"""Variants loaded at once before they are measured one after another: loads overlap each other (4 stand-in loads took
5.5 s together against 2.2 s each here), never a measurement."""
SETTLE_ROUNDS = 2
"""A close call is measured A B B A: drift between rounds hits both, and each config is measured twice."""
REFINE_ROUNDS = 3
"""Refinement rounds at most: a round refines the best two, which a round can replace (on the bundled CNN a queue delay
that filled the batch made max 4 the runner-up, and its own neighbours were then unmeasured)."""
DISTURBED = 0.3
"""Cores of other processes' load, above what the probe saw as the search began, that mark a measurement disturbed: it
is taken again once the load falls back (QUIET_WAIT_S at most), DISTURBED_RETRIES times at most, and the least disturbed
one counts. Why: under 2 s on / 3 s off bursts the bundled transformer's search published variants the bursts had missed
(0.77-0.82x of the quiet choice, benchmarks/noisy_choice.py). A steady load the probe saw is the baseline, not a
disturbance (the search then runs beside it, search.BESIDE_LOAD); a quiet machine's own noise stays under 0.1 core. A
load that does not fall back within QUIET_WAIT_S has become the machine's: it is the baseline from then on, since
measuring again beside it would give the same figures."""
STABLE_WINDOWS = 3  # perf_analyzer reports the mean of its last three stable windows (measure.measure_level)
EXIT_S = 0.25  # perf_analyzer's report and exit after its last window
DISTURBED_RETRIES = 2
QUIET_WAIT_S = 3.0
REMEASURE_SHARE = 0.25
"""Of the budget, the most that waiting and measuring again may take: past it a disturbed measurement stands, so a
machine busy on and off still gets its variants measured. That time is added to the budget (the search takes up to
1.25x it on a busy machine), so that the repeats themselves do not cut the search short: under 2 s on / 3 s off bursts
the bundled CNN's searches spent their budget before the refinement found the queue delay the quiet search had
published, and served 0.67x of it (benchmarks/noisy_choice.py). The bursts still slow every variant they reach, so a
busy search measures fewer variants than a quiet one (10-12 against 15 for the CNN after this)."""
BURST_SLOWDOWN = 4.0
"""The most another process's load is taken to slow a served variant; a disturbed level below the best undisturbed one
at its load by more is not measured again (SearchRun._out_of_reach). Measured beside one spinning core on two: the
CNN's served variants ran at 0.6-0.9x of their idle figures, and a transformer's 1 instance x 2 threads at 0.56-0.78x
of 2 x 1 (README, "Beside another job"); 4x leaves a margin. Why: under bursts the CNN's searches spent the time for
repeats on max 16 and 32 at concurrency 4 (110-250/s beside a best of 1200/s there), and a refinement that mattered
(max 4 with a queue delay, 1.5x the rest at that load on the quiet machine) then stood at its disturbed figure, lost,
and the published config served 0.70x of the quiet choice (benchmarks/noisy_choice.py; with this rule the CNN still
gave 0.76x under bursts, for the refinement's order: SearchRun._to_refine, SUSPECT)."""
FILL_LIFT = 2.0
REFINE_LIFT = 1.5
"""The most a refinement is taken to lift a variant, with the time left (SearchRun._time_left): a fill delay lifted
the bundled transformer's max 4 on 2 x 1 thread 1.96x at concurrency 4 (498/s -> 978/s); the rules' delay, a preferred
size or a max between two measured ones moved a variant by 1.08x at most in this machine's CNN and transformer searches,
so REFINE_LIFT leaves a margin."""
SUSPECT = DISTURBED / 2
"""Others' load above the baseline that makes a level a lower bound for the order of the refinement (not for repeats or
the published choice, which keep DISTURBED): a burst gets only its share of cores the server and perf_analyzer already
fill, so near saturation it reads low. Under bursts the bundled CNN's max 4 read 817/s at concurrency 64 (1522/s quiet)
with 0.28 cores of others' load, ranked low on it, and max 2 was published at 0.78x of the quiet choice."""
UNKNOWN_PLATFORM = "unexpected platform type"
"""Triton's words for a platform its core does not know (2.51 and torch_aoti)."""


class SearchRun:
    """One search's state: what was measured, the best so far, the time left, the next private name."""

    def __init__(self, result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, loader: VariantLoader,
                 bench: Bench, check_alive: Callable[[], None], deadline: float, on_event: EventSink, baseline: float | None = None) -> None:
        self.result, self.options, self.request, self.search = result, options, request, search
        self.loader, self.bench, self.check_alive, self.deadline, self.on_event = loader, bench, check_alive, deadline, on_event
        self.objective = request.objective
        self.renamed = config_signature(result.selected_candidate.artifact)[1]
        self.fronted = needs_front(self.renamed, options.io_names)  # measured through the ensemble clients will call
        self.seen: dict[OperatingPoint, ServedVariant] = {}
        self.best: ServedVariant | None = None
        self.costs: list[float] = []  # seconds per variant measured after the start (the start loads alone, so costs more)
        self.start_cost = 0.0
        self.count = 0
        self.runtime: str | None = None  # the first loaded variant's config `runtime` ("model.py": a Python-based backend)
        self.translate = request.url is None  # the bundled 2.51 core needs torch_aoti translated; a user's server decides by loading
        self.gone = ""  # why the server stopped answering, when it did
        self.robust: dict[OperatingPoint, tuple[float, int]] = {}  # no load given: each point's worst ratio to the best, and where
        self.explore_deadline = deadline  # the coarse pass and the refinement stop here, leaving the settling its time
        self.baseline = baseline  # others' load (cores) the probe saw as the search began; None: not watched (the user's server)
        self.retried_s = 0.0  # waiting for others' load to fall and measuring again (_level)
        self.parked: dict[OperatingPoint, str] = {}  # settled variants still loaded, by point (_remeasure)
        self.results: dict[str, TuneResult] = {"": result}  # by OperatingPoint.candidate: another kind's candidate ("" the selected)
        self.spaces: dict[str, SearchSpace] = {}  # another candidate's own search space (the selected's is explore's)
        self.checked: set[str] = set()  # the candidates whose answers the server was checked on
        self.candidate_of: dict[str, str] = {}  # private name -> the candidate its variant serves
        self.on_start: Callable[[str], None] | None = None  # called with the start variant's name while it is loaded

    # -- the order ---------------------------------------------------------------------------------------------------
    def explore(self, space: SearchSpace) -> str:
        """Coarse pass, refinement of the best two (repeated while it changes them), settle a close call; returns why the
        search ended.

        The coarse pass and the refinement stop early enough to leave the settling its time. Why: on the bundled
        transformer a search that spent its whole budget exploring published max 4 on one short window each, and the
        grid then served max 8 better at concurrency 16. When nothing was close enough to settle, the time kept for it
        goes back to the refinement (on the CNN the reserve had ended the exploration at 61 s of 90, then went unused)."""
        every = "every variant of the coarse pass and the refinement was measured"
        out_of_time = f"the time budget ({self.request.budget_s:.0f} s, --serve-search-seconds) ran out"
        stopped = every
        try:
            try:
                self.explore_deadline = self.deadline - self._settle_reserve()
                self._explore(space)
            except OutOfTime:
                stopped = out_of_time
            finally:
                self.explore_deadline = self.deadline
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
        `_to_refine`, not in the ranking) has its fill delay measured before a close call is settled; a settling picks
        between two variants within 10% of each other, the delay had lifted its variant 1.5x at the light load. Why:
        under bursts the bundled CNN's search spent its budget in the coarse pass, settled two max-2 variants and
        published max 2, max 4's delay untried (benchmarks/noisy_choice.py)."""
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
        first (_time_left). Why the last: the bundled CNN's largest fit of 8 leaves a coarse pass of 3 maxima x 2 layouts,
        and its search had ended after 11 variants in 70 s of a 90 s budget, its third best and below never tried with a
        queue delay. With no load given, a padding backend's maxima above PADDED_FIRST come last, with the time left."""
        grid = [p for p in coarse_grid(space) if p not in self.seen]
        later = [p for p in grid if padded_later(p, space)]  # a padding backend's large maxima, with the time left (PADDED_FIRST)
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

    def _to_refine(self, space: SearchSpace, ratios: dict[int, tuple[float, int]] | None = None) -> list[ServedVariant]:
        """Measured variants in the order their refinements are tried: the objective's ranking; with no load given, by
        what each could serve, not by what its worst level happened to show. A level another process's load reached
        (SUSPECT: kept when the repeats ran out, or below their threshold) is a lower bound and does not rank it; a
        variant whose batches did not fill at the ladder's lightest load ranks by its other loads until its fill delay
        is measured (the delay is its likeliest gain, and the light load is where it fails). Why: under bursts the
        bundled CNN's max 4 ranked third or fourth, on its concurrency-4 level (1085/s without a delay, max 2 1470/s)
        and a concurrency-64 level a burst had halved, the 900 us delay that lifted it on the quiet machine was never
        measured, and max 2 served 0.75x of the quiet choice (benchmarks/noisy_choice.py). `ratios`: _refine_ratios, when
        the caller has them."""
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
            aside = {lv.concurrency for lv in v.curve if self._disturbed(lv, SUSPECT)}
            if self._pending_fill(v, space) is not None and (light := fill_level(v)) is not None:
                aside.add(light.concurrency)
            curves[id(v)], skip[id(v)] = [lv for lv in v.curve if lv.concurrency not in aside], aside
        return robust_ratios({k: c for k, c in curves.items() if c}, self.request.percentile, skip=skip)

    def _time_left(self, space: SearchSpace) -> list[OperatingPoint]:
        """With time left after the best two, the refinements of every other variant that could still win, best first:
        all of them where its score times REFINE_LIFT reaches the leader's, only its fill delay where only FILL_LIFT does
        (a delay that fills its batches, once measured, is a variant of its own and refined if it comes within reach).
        The score: the throughput at the load; with no load given, the worst ratio to the best, a pending fill delay's
        light load set aside (_refine_ratios). With a latency budget, every variant (a refinement can bring one under it).
        Why: with --concurrency 16 the bundled CNN's search spent 4 of its 17 variants refining 2 x 1-thread variants that
        served 0.55-0.59x the best, and none of them came above 0.56x."""
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
        """Seconds a settling takes: both variants, every round, at each of `loads` loads (the ladder with the search's
        window, a target load with twice it), and one load."""
        if self.objective.robust:
            per_level = max(1.5, 3 * self.bench.window_ms / 1000.0)
        else:
            per_level = max(2.0, 3 * 2 * self.bench.window_ms / 1000.0)
        return 2 * SETTLE_ROUNDS * loads * per_level + self._variant_cost()

    def ranked(self) -> list[ServedVariant]:
        """Measured variants, best first by the objective (each point's latest measurement)."""
        pool = [v for v in self.seen.values() if v.status == "measured" and v.throughput is not None]
        if self.objective.robust:
            return self._robust(pool)
        ranked: list[ServedVariant] = []
        for v in pool:
            i = next((k for k, r in enumerate(ranked) if better(v, r, self.request.latency_budget_ms, self.request.percentile)), len(ranked))
            ranked.insert(i, v)
        return ranked

    def _robust(self, pool: list[ServedVariant]) -> list[ServedVariant]:
        """No load given: highest worst ratio to the best at each load of the ladder first; ratios within the noise of
        the leader's go to the one that sustains more (its peak)."""
        if not pool:
            return []
        ratios = robust_ratios({id(v): v.curve for v in pool}, self.request.percentile)
        self.robust = {v.point: ratios[id(v)] for v in pool}
        top = max(r for r, _ in ratios.values())
        lead = [v for v in pool if ratios[id(v)][0] >= top - THROUGHPUT_NOISE]
        rest = [v for v in pool if ratios[id(v)][0] < top - THROUGHPUT_NOISE]
        return (sorted(lead, key=lambda v: -max(lv.throughput for lv in v.curve))
                + sorted(rest, key=lambda v: -ratios[id(v)][0]))

    def _stop_climbing(self, curve: list[LoadLevel]) -> str:
        """Why a variant's sweep ends before the objective is done with it ("" to go on): the time budget ran out (one
        transformer variant's four loads once took 80 s of a 90 s budget), or it is out of the running."""
        if time.monotonic() >= self.explore_deadline:
            return f"stopped climbing at concurrency {curve[-1].concurrency}: the time budget ran out"
        return self._out_of_running(curve) if self.objective.robust else ""

    def _out_of_running(self, curve: list[LoadLevel]) -> str:
        """No load given: why a variant's ladder stops early ("" while it can still win): its worst ratio at the loads it
        measured is already below half and OUT_OF_RUNNING below the leader's, and more loads can only lower it."""
        if self.best is None or self.best.point not in self.robust:
            return ""
        worst, at = worst_so_far(curve, [v.curve for v in self.seen.values() if v.status == "measured"], self.request.percentile)
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
            fits = self._fits(len(points[:LOAD_GROUP]))
            if fits == 0:
                raise OutOfTime()
            group, points = points[:fits], points[fits:]
            out += self._measure_group(group, stage)
        return out

    def measure_apart(self, points: list[OperatingPoint], bench: Bench, mark: str) -> list[ServedVariant]:
        """Measure points under another request mix (`bench`, e.g. the padded traffic), marked `mark` and kept out of the
        ranking: the search's own best and its curves stay those of the traffic as it comes."""
        kept = (self.bench, dict(self.seen), self.best, dict(self.robust))
        self.bench = replace(bench, window_ms=self.bench.window_ms)
        out: list[ServedVariant] = []
        try:
            out = self.measure(points, mark)
        except OutOfTime:
            pass
        finally:
            self.bench, self.seen, self.best, self.robust = kept
            for v in self.search.variants:
                if v.stage == mark:
                    v.traffic = mark
        return [v for v in self.search.variants if v.stage == mark]

    def _fits(self, wanted: int) -> int:
        """How many more variants fit in the budget at the slowest cost so far (the budget is a bound, not a target)."""
        cost = self._variant_cost()
        if not cost:
            return wanted
        left = self.explore_deadline - time.monotonic()
        return max(0, min(wanted, int(left // cost)))

    def _variant_cost(self) -> float:
        """The slowest variant measured after the start (whose lone load took 15 s against 9 s for a loaded group's
        share on the CNN here), else the start's."""
        return max(self.costs) if self.costs else self.start_cost

    def _measure_group(self, group: list[OperatingPoint], stage: str) -> list[ServedVariant]:
        t0 = time.monotonic()
        variants = {self._next_name(p.candidate): ServedVariant(p, stage) for p in group}
        configs = {}
        for name, v in variants.items():
            try:
                configs[name] = self._config(v.point)
            except (ConfigRuleError, TemplateError, PublishError) as err:
                v.status, v.reason = "failed", f"the config is refused: {err}"
        errors = self._load(configs)
        if stage == "start" and not self.translate and any(UNKNOWN_PLATFORM in e for e in errors.values()):
            self.translate = True  # the user's server predates torch_aoti: serve it as the bundled server does, through pytorch
            self._unload(list(variants))
            configs = {n: self._config(variants[n].point) for n in configs}
            errors = self._load(configs)
        if configs and len(errors) == len(configs) and all(server_gone(e) for e in errors.values()):
            self._unload(list(variants))
            raise ServerGone(f"every load of a group failed ({next(iter(errors.values()))}): the server at {self.loader.url} stopped answering")
        load_share = (time.monotonic() - t0) / max(1, len(configs))
        if self.runtime is None and any(n not in errors for n in configs):
            self.runtime = self.loader.runtime(next(n for n in configs if n not in errors))
        try:
            for name, v in variants.items():
                v.seconds, retried = round(load_share, 2), self.retried_s
                if name in errors:
                    v.status, v.reason = "failed", f"Triton could not load it: {errors[name]}"
                elif v.status == "measured" and v.point.candidate not in self.checked and (wrong := self._wrong_answers(name)):
                    v.status, v.reason = "failed", f"its answers are wrong: {wrong}"
                elif v.status == "measured":
                    self.checked.add(v.point.candidate)
                    if stage == "start" and self.on_start is not None:
                        self.on_start(name)
                    self._sweep(name, v)
                self._record(v, self.retried_s - retried)
        finally:
            self._unload(list(variants), wait=False)
        return list(variants.values())

    def _load(self, configs: dict[str, str]) -> dict[str, str]:
        """Load variants by their measured names: the model itself, or its positional model and then the ensemble in front;
        each from the files of the candidate it serves."""
        errors: dict[str, str] = {}
        for candidate in dict.fromkeys(self.candidate_of.get(n, "") for n in configs):
            group = {n: t for n, t in configs.items() if self.candidate_of.get(n, "") == candidate}
            errors.update(self._load_from(group, candidate))
        return errors

    def _load_from(self, configs: dict[str, str], candidate: str) -> dict[str, str]:
        if not configs:
            return {}
        source = {"candidate": candidate} if candidate else {}
        if not self.fronted:
            return self.loader.load(configs, **source)
        errors = self.loader.load({inner_name(n): text for n, text in configs.items()}, **source)
        fronts = {n: canonical(front_config(parse(text), n, inner_name(n), self.renamed)) for n, text in configs.items() if inner_name(n) not in errors}
        errors = {n: errors[inner_name(n)] for n in configs if inner_name(n) in errors}
        errors.update(self.loader.load(fronts, files={f"1/{VERSION_MARKER}": VERSION_MARKER_TEXT}) if fronts else {})
        return errors

    def _unload(self, names: list[str], wait: bool = True) -> None:
        """Unload variants (an ensemble before the model it serves); `wait` False leaves waiting for the model to the next
        load (VariantLoader.unload: the two overlap)."""
        if self.fronted:
            self.loader.unload(names)
            names = [inner_name(n) for n in names]
        self.loader.unload(names, wait=wait)

    def _wrong_answers(self, name: str) -> str:
        """Before any variant of a candidate counts: "" when the server answers the export's samples within its tolerances
        (answers.py)."""
        result = self.results[self.candidate_of.get(name, "")]
        return wrong_answers(result, self.request.protocol, self.bench.url, self.bench.timeout_s, name, self.renamed, self.fronted)

    def _sweep(self, name: str, v: ServedVariant) -> None:
        from tritonclient.utils import InferenceServerException

        seed = self.best.concurrency if self.best is not None and self.best.concurrency else seed_concurrency(v.point)
        t0 = time.monotonic()
        try:
            first = self.objective.first_level(seed)
            warm_up(self.bench, name, first, WARMUP_PER_SLOT * first)
            v.seconds = round(v.seconds + time.monotonic() - t0, 2)
            window = self.bench.window_ms
            sweep(v, self.objective, seed, lambda c: self._level(name, c, window), explore_down=v.stage != "coarse",
                  stop=self._stop_climbing)
        except ValidationError as err:
            v.status, v.reason = "failed", str(err)
        except (InferenceServerException, OSError) as err:  # the server refused the warm-up, or closed the connection dying
            from optimizer.triton.server import triton_message

            v.status, v.reason = "failed", f"Triton stopped answering: {triton_message(err)}"

    def _record(self, v: ServedVariant, retried_s: float = 0.0) -> None:
        """Keep a measured (or failed) variant, its cost for planning the rest (less any measuring again that others'
        load forced: a burst does not make the next variants dearer), and the best so far."""
        self.search.variants.append(v)
        if v.stage == "start":
            self.start_cost = v.seconds - retried_s
        else:
            self.costs.append(v.seconds - retried_s)
        if v.status == "measured" and self.objective.robust:
            self.seen[v.point] = v
            self.best = self.ranked()[0]
        elif v.status == "measured":
            top = max((x.throughput or 0.0) for x in self.seen.values()) if self.seen else None
            self.seen[v.point] = v
            if self.best is None or better(v, self.best, self.request.latency_budget_ms, self.request.percentile, top):
                self.best = v
        else:
            self.seen.setdefault(v.point, v)
        mark = (f"{v.throughput:.1f}/s p{self.request.percentile} {latency_at(v, self.request.percentile):.1f} ms at concurrency {v.concurrency}"
                if v.throughput is not None else f"{v.status}: {v.reason}")
        self.on_event(Event("serve", "progress", self.result.selected or "", f"{v.stage}: {v.point.label}: {mark}"))
        try:
            self.check_alive()
        except ValidationError as err:
            raise ServerGone(f"the server stopped: {err}") from err

    def _level(self, name: str, concurrency: int, window_ms: int) -> LoadLevel:
        """One load measured while other processes' CPU is watched; taken again when their load rose during it (DISTURBED)
        and the time left allows: the measurement least reached by it counts."""
        if self.baseline is None:
            return measure_level(self.bench, name, concurrency, window_ms)
        kept: LoadLevel | None = None
        for attempt in range(1 + DISTURBED_RETRIES):
            t0 = time.monotonic()
            with LoadWatch() as watch:
                level = measure_level(self.bench, name, concurrency, window_ms)
            # the figures are perf_analyzer's last STABLE_WINDOWS windows, ending as it exits: judge the load over those
            level, took = replace(level, others_busy=watch.peak_within(STABLE_WINDOWS * window_ms / 1000.0 + EXIT_S)), time.monotonic() - t0
            if attempt:
                self._retook(took)
            if kept is None or (level.others_busy or 0.0) < (kept.others_busy or 0.0):
                kept = level
            limit = self.baseline + DISTURBED
            if (kept.others_busy or 0.0) <= limit or attempt == DISTURBED_RETRIES or self._out_of_reach(kept):
                break
            if (time.monotonic() + QUIET_WAIT_S + took > self.explore_deadline
                    or self.retried_s + QUIET_WAIT_S + took > REMEASURE_SHARE * self.request.budget_s):
                break
            t1 = time.monotonic()
            seen = wait_for_quiet(limit, QUIET_WAIT_S)
            self._retook(time.monotonic() - t1)
            if seen is not None and seen > limit:  # the load stayed: it is the machine's now, and the baseline
                self.baseline = max(self.baseline, seen - DISTURBED / 2)
                break
            self.search.remeasured += 1
        return kept

    def _disturbed(self, level: LoadLevel, margin: float = DISTURBED) -> bool:
        """Whether others' load reached `level` by more than `margin` cores above the baseline (it is a lower bound)."""
        return self.baseline is not None and (level.others_busy or 0.0) > self.baseline + margin

    def _out_of_reach(self, level: LoadLevel) -> bool:
        """Whether a disturbed level stays below the most any variant served undisturbed at its load even if the load had
        slowed it BURST_SLOWDOWN times: taking it again cannot change the choice, and the time for repeats
        (REMEASURE_SHARE) goes to levels that can. Not with a latency budget: there a disturbed level's latency decides
        whether the variant meets it."""
        if self.objective.latency_budget_ms is not None or self.baseline is None:
            return False
        clean = [lv.throughput for v in self.seen.values() for lv in v.curve if lv.concurrency == level.concurrency and not self._disturbed(lv)]
        return bool(clean) and level.throughput * BURST_SLOWDOWN < max(clean) * (1 - THROUGHPUT_NOISE)

    def _retook(self, seconds: float) -> None:
        """Time spent waiting out others' load and measuring again: it moves the deadlines back (REMEASURE_SHARE)."""
        self.retried_s += seconds
        self.deadline += seconds
        self.explore_deadline += seconds
        self.search.retried_s = round(self.retried_s, 1)

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
        if time.monotonic() + self._settle_cost(1) > self.deadline:
            raise OutOfTime()
        if (measured := self._remeasure([a, b], [level], 2 * self.bench.window_ms)) is None:
            return
        names, levels = {"a": a, "b": b}, {"a": measured[0][level], "b": measured[1][level]}
        pct = self.request.percentile
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
            again.meets_budget = None if self.request.latency_budget_ms is None else means[n].latency(pct) <= self.request.latency_budget_ms
            self.search.variants.append(again)
            if n == winner:
                self.best = again
        self._keep(self.best.point)
        self.search.settled = (f"{a.point.label} and {b.point.label} served within {100 * (1 - min(ratio, 1 / ratio)):.1f}% of each other, "
                               f"measured A B B A at concurrency {level}: {names[winner].point.label} kept")

    def _settle_ladder(self, ranked: list[ServedVariant]) -> None:
        """No load given and the two best within the noise of each other's worst ratio: measure both again, interleaved
        (A B B A), at every load of the ladder both measured, and rank again on the means (one short window a load
        moved a single measurement by 15-25% here, enough to swap a max that pads for one that does not)."""
        if len(ranked) < 2:
            return
        a, b = ranked[0], ranked[1]
        if self.robust[b.point][0] < self.robust[a.point][0] - THROUGHPUT_NOISE:
            return
        loads = sorted({lv.concurrency for lv in a.curve} & {lv.concurrency for lv in b.curve})
        if not loads or time.monotonic() + self._settle_cost(len(loads)) > self.deadline:
            raise OutOfTime()
        if (measured := self._remeasure([a, b], loads, self.bench.window_ms)) is None:
            return
        names, levels = {"a": a, "b": b}, dict(zip(("a", "b"), measured))
        for n, v in names.items():
            again = ServedVariant(v.point, "settle", curve=[mean_level(levels[n][c]) for c in loads],
                                  reason=f"mean of {SETTLE_ROUNDS} interleaved measurements at each of concurrency {', '.join(map(str, loads))}")
            again.score_at(self.objective.score(again.curve)[0])
            self.search.variants.append(again)
            self.seen[v.point] = again
        # the winner is one of the two: a third measured once would otherwise win by the luck the settling took out of
        # these two (the bundled CNN published its start, 0.88x at its worst load, after its two best were measured again)
        self.best = next(v for v in self.ranked() if v.point in (a.point, b.point))
        self._keep(self.best.point)
        worst = {v.point: self.robust[v.point][0] for v in names.values()}
        self.search.settled = (f"{a.point.label} (worst {worst[a.point]:.2f}x the best) and {b.point.label} (worst {worst[b.point]:.2f}x) "
                               f"measured again A B B A at concurrency {', '.join(map(str, loads))}: {self.best.point.label} kept")

    def _remeasure(self, pair: list[ServedVariant], loads: list[int], window_ms: int) -> list[dict[int, list[LoadLevel]]] | None:
        """Load two variants side by side under new names and measure each SETTLE_ROUNDS times at every load, in A B B A
        order; per variant, its measurements per load. None when either does not load or a measurement fails. Both stay
        loaded (`parked`) for the published one's lone request (base); the other goes when the choice is made (_keep)."""
        names = [self._next_name(v.point.candidate) for v in pair]
        if self._load({n: self._config(v.point) for n, v in zip(names, pair)}):
            self._unload(names)
            return None
        levels: dict[str, dict[int, list[LoadLevel]]] = {n: {c: [] for c in loads} for n in names}
        try:
            for n in names:
                warm_up(self.bench, n, loads[-1], WARMUP_PER_SLOT * loads[-1])
            for r in range(SETTLE_ROUNDS):
                for n in (names if r % 2 == 0 else names[::-1]):
                    for c in loads:
                        levels[n][c].append(self._level(n, c, window_ms))
        except ValidationError:
            self._unload(names, wait=False)
            return None
        self.parked = {v.point: n for n, v in zip(names, pair)}
        return [levels[n] for n in names]

    def _keep(self, point: OperatingPoint | None) -> None:
        """Unload the parked variants but the one at `point` (None: all of them, without waiting: nothing is measured
        after); the one kept is measured next (base), so the others are waited for."""
        gone = [n for p, n in self.parked.items() if p != point]
        self.parked = {p: n for p, n in self.parked.items() if p == point}
        self._unload(gone, wait=point is not None)

    def base(self) -> None:
        """The published variant at one request at a time, when its sweep did not reach it and the budget allows: the anchor
        of validate's prediction for loads below the ones the search measured (prediction.py). A settled choice is still
        loaded (parked): measured there, without a load of its own (1.5 s of the CNN's 4.7 s base)."""
        best = self.best
        try:
            if best is None or best.level(1) is not None:
                return
            name = self.parked.get(best.point)
            cost = self._level_cost() if name else self._variant_cost()
            if not cost or time.monotonic() + cost > self.deadline:
                return
            if name is None:
                name = self._next_name(best.point.candidate)
                self.parked[best.point] = name
                if self._load({name: self._config(best.point)}):
                    return
            try:
                warm_up(self.bench, name, 1, WARMUP_PER_SLOT)
                one = self._level(name, 1, self.bench.window_ms)
            except ValidationError:
                return
        finally:
            self._keep(None)
        base = ServedVariant(best.point, "base", curve=[one], reason="one request at a time: the anchor of validate's prediction below the loads the sweep measured")
        base.score_at(one)
        self.search.variants.append(base)

    def _level_cost(self) -> float:
        """Seconds one level of a loaded variant takes at the search's window: three stable windows, perf_analyzer's exit,
        and a second for its start and the warm-up."""
        return STABLE_WINDOWS * self.bench.window_ms / 1000.0 + EXIT_S + 1.0

    # -- helpers -------------------------------------------------------------------------------------------------------------
    def _config(self, point: OperatingPoint) -> str:
        text, _, _ = prepare_config(self.results[point.candidate], replace(self.options, operating_point=replace(point, candidate="")))
        return locally(text) if self.translate else text

    def _next_name(self, candidate: str = "") -> str:
        self.count += 1
        name = private_name(self.options.name, self.count)
        self.candidate_of[name] = candidate
        return name


class OutOfTime(Exception):
    """The next variant would not finish within --serve-search-seconds."""


class ServerGone(ValidationError):
    """The server died while a variant was measured."""
