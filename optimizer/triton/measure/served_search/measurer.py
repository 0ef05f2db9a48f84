"""Loading and measuring variants: private names, a group loaded at a time, the answer check, the sweep of loads, and
measuring again what other processes' load reached.

The stage policy (run.py) says which points to measure and in what order; this module turns a point into a config,
loads it under a private name (from the files of the candidate it serves), warms it, measures it at the loads the
objective asks for, and unloads it. A group's unloading overlaps the next group's loading, never a measurement.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator

from optimizer.errors import ConfigRuleError, PublishError, TemplateError, ValidationError
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedVariant
from optimizer.records.tune_result import TuneResult
from optimizer.triton.config.front import VERSION_MARKER, VERSION_MARKER_TEXT, front_config, inner_name, needs_front
from optimizer.triton.config.model_config import canonical, parse
from optimizer.triton.config.spec import config_signature
from optimizer.triton.measure.served_search.clock import EXIT_S, STABLE_WINDOWS, BudgetClock
from optimizer.triton.measure.served_search.loader import private_name, server_gone
from optimizer.triton.measure.served_search.measure import WARMUP_PER_SLOT, Bench, sweep
from optimizer.triton.measure.served_search.objective import Objective
from optimizer.triton.measure.served_search.servers import locally
from optimizer.triton.repository.publish import PublishOptions, prepare_config

LOAD_GROUP = 4
"""Variants loaded at once before they are measured one after another: loads overlap each other, never a measurement."""
SETTLE_ROUNDS = 2
"""A close call is measured A B B A: drift between rounds hits both, and each config is measured twice."""
DISTURBED = 0.3
"""Cores of other processes' load, above what the probe saw as the search began, that mark a measurement disturbed: it is
taken again once the load falls back (QUIET_WAIT_S at most, DISTURBED_RETRIES times at most) and the least disturbed one
counts. A quiet machine's own noise stays well under it. A load that does not fall back within QUIET_WAIT_S has become the
machine's: it is the baseline from then on, since measuring again beside it would give the same figures."""
DISTURBED_RETRIES = 2
QUIET_WAIT_S = 3.0
UNKNOWN_PLATFORM = "unexpected platform type"
"""Triton's words for a platform its core does not know (2.51 and torch_aoti)."""


class ServerGone(ValidationError):
    """The server died while a variant was measured."""


class VariantMeasurer:
    """Turns operating points into loaded, measured variants on one server."""

    def __init__(self, result: TuneResult, options: PublishOptions, objective: Objective, loader: Any, bench: Bench,
                 check_alive: Callable[[], None], clock: BudgetClock, baseline: float | None = None, translate: bool = True) -> None:
        self.result, self.options, self.objective = result, options, objective
        self.loader, self.bench, self.check_alive, self.clock = loader, bench, check_alive, clock
        self.renamed = config_signature(result.selected_candidate.artifact)[1]
        self.fronted = needs_front(self.renamed, options.io_names)  # measured through the ensemble clients will call
        self.results: dict[str, TuneResult] = {"": result}  # by OperatingPoint.candidate ("" the selected one)
        self.candidate_of: dict[str, str] = {}  # private name -> the candidate its variant serves
        self.checked: set[str] = set()  # the candidates whose answers the server was checked on
        self.on_start: Callable[[str], None] | None = None  # called with the start variant's name while it is loaded
        self.runtime: str | None = None  # the first loaded variant's config `runtime` ("model.py": a Python-based backend)
        self.translate = translate  # the bundled 2.51 core needs torch_aoti translated; a user's server decides by loading
        self.baseline = baseline  # others' load (cores) the probe saw as the search began; None: not watched
        self.remeasured = 0  # measurements taken again because others' load reached them
        self.parked: dict[OperatingPoint, str] = {}  # variants still loaded after a settling, by point
        self.count = 0

    # -- configs and names ---------------------------------------------------------------------------------------------
    def config(self, point: OperatingPoint) -> str:
        """The config a point is loaded with: exactly what publishing would write for its candidate."""
        text, _, _ = prepare_config(self.results[point.candidate], replace(self.options, operating_point=replace(point, candidate="")))
        return locally(text) if self.translate else text

    def next_name(self, candidate: str = "") -> str:
        """A fresh private name for a variant of `candidate`."""
        self.count += 1
        name = private_name(self.options.name, self.count)
        self.candidate_of[name] = candidate
        return name

    # -- loading -------------------------------------------------------------------------------------------------------
    def load(self, configs: dict[str, str]) -> dict[str, str]:
        """Load variants by their private names, each from its candidate's files (an ensemble in front where clients need
        one); name -> Triton's error for those that failed."""
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

    def unload(self, names: list[str], wait: bool = True) -> None:
        """Unload variants (an ensemble before the model it serves); `wait` False leaves waiting to the next load."""
        if self.fronted:
            self.loader.unload(names)
            names = [inner_name(n) for n in names]
        self.loader.unload(names, wait=wait)

    # -- one group -----------------------------------------------------------------------------------------------------
    def measure_group(self, group: list[OperatingPoint], stage: str, seed: Callable[[OperatingPoint], int],
                      stop: Callable[[list[LoadLevel]], str], record: Callable[[ServedVariant, float], None]) -> list[ServedVariant]:
        """Load `group` together, check a new candidate's answers, sweep each variant and `record` it (with the seconds
        others' load made it wait), then unload the group without waiting for it."""
        t0 = self.clock.now()
        variants = {self.next_name(p.candidate): ServedVariant(p, stage) for p in group}
        configs = {}
        for name, v in variants.items():
            try:
                configs[name] = self.config(v.point)
            except (ConfigRuleError, TemplateError, PublishError) as err:
                v.status, v.reason = "failed", f"the config is refused: {err}"
        errors = self.load(configs)
        if stage == "start" and not self.translate and any(UNKNOWN_PLATFORM in e for e in errors.values()):
            self.translate = True  # the user's server predates torch_aoti: serve it as the bundled server does, through pytorch
            self.unload(list(variants))
            configs = {n: self.config(variants[n].point) for n in configs}
            errors = self.load(configs)
        if configs and len(errors) == len(configs) and all(server_gone(e) for e in errors.values()):
            self.unload(list(variants))
            raise ServerGone(f"every load of a group failed ({next(iter(errors.values()))}): the server at {self.loader.url} stopped answering")
        load_share = (self.clock.now() - t0) / max(1, len(configs))
        if self.runtime is None and any(n not in errors for n in configs):
            self.runtime = self.loader.runtime(next(n for n in configs if n not in errors))
        try:
            for name, v in variants.items():
                v.seconds, retried = round(load_share, 2), self.clock.retried_s
                if name in errors:
                    v.status, v.reason = "failed", f"Triton could not load it: {errors[name]}"
                elif v.status == "measured" and v.point.candidate not in self.checked and (wrong := self.wrong_answers(name)):
                    v.status, v.reason = "failed", f"its answers are wrong: {wrong}"
                elif v.status == "measured":
                    self.checked.add(v.point.candidate)
                    if stage == "start" and self.on_start is not None:
                        self.on_start(name)
                    self.sweep(name, v, seed(v.point), stop)
                record(v, self.clock.retried_s - retried)
                try:
                    self.check_alive()
                except ValidationError as err:
                    raise ServerGone(f"the server stopped: {err}") from err
        finally:
            self.unload(list(variants), wait=False)
        return list(variants.values())

    def wrong_answers(self, name: str) -> str:
        """Before any variant of a candidate counts: "" when the server answers the export's samples within its tolerances."""
        return self.bench.wrong_answers(self.results[self.candidate_of.get(name, "")], name, self.renamed, self.fronted)

    def sweep(self, name: str, v: ServedVariant, seed: int, stop: Callable[[list[LoadLevel]], str]) -> None:
        """Warm a loaded variant and measure it at the loads the objective asks for (measure.sweep)."""
        from tritonclient.utils import InferenceServerException

        t0 = self.clock.now()
        try:
            first = self.objective.first_level(seed)
            self.bench.warm(name, first, WARMUP_PER_SLOT * first)
            v.seconds = round(v.seconds + self.clock.now() - t0, 2)
            window = self.bench.window_ms
            sweep(v, self.objective, seed, lambda c: self.level(name, c, window), explore_down=v.stage != "coarse", stop=stop, now=self.clock.now)
        except ValidationError as err:
            v.status, v.reason = "failed", str(err)
        except (InferenceServerException, OSError) as err:  # the server refused the warm-up, or closed the connection dying
            from optimizer.triton.runtime.server import triton_message

            v.status, v.reason = "failed", f"Triton stopped answering: {triton_message(err)}"

    # -- one level, watched for others' load ---------------------------------------------------------------------------
    out_of_reach: Callable[[LoadLevel], bool] = staticmethod(lambda level: False)
    """Set by the stage policy: whether a disturbed level could not change the choice even if measured again."""

    def level(self, name: str, concurrency: int, window_ms: int) -> LoadLevel:
        """One load measured while other processes' CPU is watched; taken again when their load rose during it (DISTURBED)
        and the time left allows: the measurement least reached by it counts."""
        if self.baseline is None:
            return self.bench.measure(name, concurrency, window_ms)
        kept: LoadLevel | None = None
        for attempt in range(1 + DISTURBED_RETRIES):
            t0 = self.clock.now()
            with self.bench.watch() as watch:
                level = self.bench.measure(name, concurrency, window_ms)
            # the figures are perf_analyzer's last STABLE_WINDOWS windows, ending as it exits: judge the load over those
            level, took = replace(level, others_busy=watch.peak_within(STABLE_WINDOWS * window_ms / 1000.0 + EXIT_S)), self.clock.now() - t0
            if attempt:
                self.clock.add_retake(took)
            if kept is None or (level.others_busy or 0.0) < (kept.others_busy or 0.0):
                kept = level
            limit = self.baseline + DISTURBED
            if (kept.others_busy or 0.0) <= limit or attempt == DISTURBED_RETRIES or self.out_of_reach(kept):
                break
            if not self.clock.may_retake(QUIET_WAIT_S + took):
                break
            t1 = self.clock.now()
            seen = self.bench.wait_for_quiet(limit, QUIET_WAIT_S)
            self.clock.add_retake(self.clock.now() - t1)
            if seen is not None and seen > limit:  # the load stayed: it is the machine's now, and the baseline
                self.baseline = max(self.baseline, seen - DISTURBED / 2)
                break
            self.remeasured += 1
        return kept

    def disturbed(self, level: LoadLevel, margin: float = DISTURBED) -> bool:
        """Whether others' load reached `level` by more than `margin` cores above the baseline (it is a lower bound)."""
        return self.baseline is not None and (level.others_busy or 0.0) > self.baseline + margin

    # -- two side by side ----------------------------------------------------------------------------------------------
    def remeasure(self, pair: list[ServedVariant], loads: list[int], window_ms: int) -> list[dict[int, list[LoadLevel]]] | None:
        """Load two variants side by side under new names and measure each SETTLE_ROUNDS times at every load, in A B B A
        order; per variant, its measurements per load. None when either does not load or a measurement fails. Both stay
        loaded (`parked`) until `keep_only` says which one goes on."""
        names = [self.next_name(v.point.candidate) for v in pair]
        if self.load({n: self.config(v.point) for n, v in zip(names, pair)}):
            self.unload(names)
            return None
        levels: dict[str, dict[int, list[LoadLevel]]] = {n: {c: [] for c in loads} for n in names}
        try:
            for n in names:
                self.bench.warm(n, loads[-1], WARMUP_PER_SLOT * loads[-1])
            for r in range(SETTLE_ROUNDS):
                for n in (names if r % 2 == 0 else names[::-1]):
                    for c in loads:
                        levels[n][c].append(self.level(n, c, window_ms))
        except ValidationError:
            self.unload(names, wait=False)
            return None
        self.parked = {v.point: n for n, v in zip(names, pair)}
        return [levels[n] for n in names]

    def keep_only(self, point: OperatingPoint | None) -> None:
        """Unload the parked variants but the one at `point` (None: all of them, without waiting: nothing is measured
        after); the one kept is measured next, so the others are waited for."""
        gone = [n for p, n in self.parked.items() if p != point]
        self.parked = {p: n for p, n in self.parked.items() if p == point}
        self.unload(gone, wait=point is not None)

    @contextmanager
    def loaded(self, point: OperatingPoint, warm_requests: int = 4 * WARMUP_PER_SLOT) -> Iterator[str | None]:
        """`point` loaded under a fresh private name (or the name a settling parked it under) and warmed, for open-loop
        runs; None when it does not load. Unloaded afterwards."""
        name = self.parked.pop(point, None)
        if name is None:
            name = self.next_name(point.candidate)
            if self.load({name: self.config(point)}):
                self.unload([name], wait=False)
                yield None
                return
        try:
            self.bench.warm(name, 4, warm_requests)
            yield name
        finally:
            self.unload([name], wait=True)

    def lone_request(self, point: OperatingPoint, cost: float) -> LoadLevel | None:
        """`point` at one request at a time, loaded again unless a settling left it parked; None when it does not fit the
        budget (`cost` seconds) or fails."""
        name = self.parked.get(point)
        if self.clock.passed(self.clock.level_cost(self.bench.window_ms) if name else cost):
            return None
        if name is None:
            name = self.next_name(point.candidate)
            self.parked[point] = name
            if self.load({name: self.config(point)}):
                return None
        try:
            self.bench.warm(name, 1, WARMUP_PER_SLOT)
            return self.level(name, 1, self.bench.window_ms)
        except ValidationError:
            return None
