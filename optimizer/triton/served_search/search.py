"""The served search: measure config variants of the chosen artifact in a tritonserver and publish the best one measured.

The in-process rules give the starting point and bound the batch sizes; the load is the user's (objective.py). The
server is started once on a private repository (the artifact's files linked, never the user's repository), and the
variants are loaded a few at a time under private names through the repository API (loader.py), warmed, measured
by perf_analyzer at the loads the objective asks for (measure.py), and unloaded. The order (points.py): the rules'
point, a coarse pass over instance layouts x max batch, a refinement of the best two (queue delay, preferred size,
max batch between measured ones), then a close call between the best two settled by interleaved re-measurement.
The published point is always one that was measured; what could not run is skipped with the reason, and the rules stand.
"""

from __future__ import annotations

import logging
import shutil
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from optimizer.errors import ConfigRuleError, PublishError, ServerError, TemplateError, ValidationError
from optimizer.events import Event, EventSink, ignore
from optimizer.machine import cpu_cores
from optimizer.model.samples import load_feeds
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch, ServedVariant
from optimizer.records.tune_result import TuneResult
from optimizer.task.core_share import CoreShare, probe
from optimizer.triton.front import VERSION_MARKER, VERSION_MARKER_TEXT, front_config, inner_name, needs_front
from optimizer.triton.local_serving import local_config, needs_translation, translation_note
from optimizer.triton.model_config import canonical, config_signature, operating_point_of, parse
from optimizer.triton.perf_analyzer import write_input_data
from optimizer.triton.publish import PublishOptions, model_files, prepare_config
from optimizer.triton.served_search.loader import VariantLoader, private_name
from optimizer.triton.served_search.measure import WARMUP_PER_SLOT, Bench, measure_level, settle_level, sweep, warm_up
from optimizer.triton.served_search.objective import Objective
from optimizer.triton.served_search.points import (
    THROUGHPUT_NOISE,
    LATENCY_GAIN,
    SearchSpace,
    better,
    close,
    coarse_grid,
    on_free_cores,
    refinements,
    seed_concurrency,
)
from optimizer.triton.server import LocalTritonServer, ToolMissing, find_triton, homes_root, prepare_home
from optimizer.vocab import Device

log = logging.getLogger(__name__)

STAND_IN_LABEL = "stand-in backend"
LOAD_GROUP = 4
"""Variants loaded at once before they are measured one after another: loads overlap each other (4 stand-in loads took
5.5 s together against 2.2 s each here), never a measurement."""
SETTLE_ROUNDS = 2
"""A close call is measured A B A B: drift between rounds hits both, and each config is measured twice."""
WAIT_PROBE_S = 1.0


@dataclass(frozen=True)
class SearchRequest:
    """What the user asked of the search: the load, the latency budget, the time it may take, where it works."""

    workdir: Path
    concurrency: int | None = None  # None: no fixed load (a latency budget, or the most throughput sustained)
    latency_budget_ms: float | None = None
    percentile: int = 95
    budget_s: float = 90.0
    cache_dir: Path | None = None
    user_max: int | None = None  # --max-batch-size: never changed by the search
    wait_for_cores_s: float = 0.0  # --wait-for-cores: how long to wait for cores other processes keep busy
    url: str | None = None  # --url: a running Triton (explicit model control) to search on instead of the bundled one
    protocol: str = "http"  # --protocol: how the variants are loaded and measured
    server_version: str = ""  # what that server said it is (remote.probe_server)

    @property
    def objective(self) -> Objective:
        return Objective(self.concurrency, self.latency_budget_ms, self.percentile)


def served_search(result: TuneResult, options: PublishOptions, request: SearchRequest, on_event: EventSink = ignore) -> ServedSearch:
    """Search the served operating point of `result`'s selected artifact; never raises for a model it cannot serve.

    Returns a ServedSearch with status "searched" (chosen = the best variant measured) or "skipped" (reason; chosen
    = the rules' point, which publishing then keeps).
    """
    t0 = time.monotonic()
    artifact = result.selected_candidate.artifact
    assert artifact is not None and artifact.platform is not None
    _, _, spec = prepare_config(result, options)
    start = operating_point_of(spec, artifact.platform.thread_parameter)
    objective = request.objective
    search = ServedSearch(status="skipped", objective=objective.kind, load=objective.describe(), latency_budget_ms=request.latency_budget_ms,
                          percentile=request.percentile, start=start, chosen=start, budget_s=request.budget_s)
    on_event(Event("serve", "start", result.selected or "", f"{start.label}; for {search.load}"))
    try:
        _search(result, options, request, search, on_event)
    except ServerError:
        raise
    except (ToolMissing, ValidationError) as err:
        if request.url:  # the user's server failed the search: nothing is published from half of it
            raise ServerError(f"the served search on {request.url} failed: {err}") from err
        search.status, search.reason = "skipped", str(err)
    finally:
        search.seconds = round(time.monotonic() - t0, 2)
    if search.status != "searched":
        search.chosen = start
        on_event(Event("serve", "skipped", result.selected or "", f"{search.reason}; the in-process rules stand"))
    else:
        on_event(Event("serve", "done", result.selected or "", _summary(search), elapsed_s=search.seconds))
    return search


def _search(result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, on_event: EventSink) -> None:
    from optimizer.triton.perf_analyzer import find_perf_analyzer

    artifact = result.selected_candidate.artifact
    assert artifact is not None and artifact.platform is not None and search.start is not None
    text, extra, _ = prepare_config(result, options)
    with ExitStack() as stack:
        where = (_remote(result, request, search, extra) if request.url else
                 stack.enter_context(_local(result, options, request, search, text, extra, on_event)))
        if where is None:  # the local server cannot serve this artifact: search.reason says why
            return
        find_perf_analyzer()
        if needs_translation(parse(text)):
            search.served_by += f"; {translation_note(parse(text))}"
        fronted = needs_front(config_signature(artifact)[1], options.io_names)
        if fronted:
            search.served_by += "; measured through the ensemble that keeps the forward() names in front of it, as published"
        input_data, search.request_mix, rows = request_mix(result, request.workdir, public_names=fronted)
        gpu = Device.of(artifact.device).is_cuda
        decision = result.selected_candidate.decision
        share, first = where.share, search.start
        if share is not None and share.reduced:
            search.measured_on = share.to_json()
            first = on_free_cores(_as_measured(search.start, decision), len(share.cores), artifact.platform.thread_parameter)
            on_event(Event("serve", "progress", result.selected or "", f"{share.summary('variant').split(': throughputs')[0]}; "
                           "the config published is the one measured there (re-export on a quiet machine, or --wait-for-cores, for every core)"))
        space = SearchSpace.of(decision, first, len(share.cores) if share else cpu_cores(), gpu, request.concurrency or 0, request.user_max)
        deadline = time.monotonic() + request.budget_s
        with VariantLoader(where.url, protocol=request.protocol, place=where.place, files=where.files, check_alive=where.check_alive) as loader:
            bench = Bench(where.url, input_data, rows, request.workdir, protocol=request.protocol)
            run = _Run(result, options, request, search, loader, bench, where.check_alive, deadline, on_event)
            best = run.measure([first], "start")[0]
            if best.status != "measured":
                search.refused = request.url is not None and best.reason.startswith("Triton could not load it")
                search.reason = f"the in-process rules' config could not be measured in {where.name}: {best.reason}"
                return
            if run.runtime == "model.py":  # a Python-based backend answered for the platform: not the native one
                search.stand_in = True
                search.served_by = search.served_by.replace("native backend", f"{STAND_IN_LABEL} (the server runs a model.py for "
                                                            f"backend {artifact.platform.backend})", 1)
            run.bench = replace(bench, window_ms=bench.window_for(best.throughput))
            search.status = "searched"
            search.stopped = run.explore(space)
            if request.url and run.gone:
                raise ServerError(f"{run.gone}; every variant it had loaded was unloaded where it could be, nothing was published")
            run.base()
    search.chosen = run.best.point
    search.concurrency = run.best.concurrency
    search.concurrency_source = ("--concurrency" if request.concurrency else
                                 f"where the published variant {'met the budget with the most throughput' if request.latency_budget_ms is not None else 'reached its peak'} in its sweep")
    _predict(search, result)
    for v in search.variants:
        v.differs = v.point.differences(search.chosen)


@dataclass
class _Where:
    """The server the variants run on: its URL, how a private name gets its files, how to tell it is still there."""

    name: str
    url: str
    check_alive: Callable[[], None]
    place: Callable[[str, bool], None] | None = None
    files: dict[str, bytes] | None = None
    share: CoreShare | None = None


@contextmanager
def _local(result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, text: str, extra: dict[str, bytes],
           on_event: EventSink) -> Iterator[_Where | None]:
    """The bundled tritonserver on a private repository of links to the artifact, pinned to the cores others leave free."""
    from optimizer.triton.validation.target import ModelTarget, local_servability

    artifact = result.selected_candidate.artifact
    repo = request.workdir / "repository"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    home = prepare_home(find_triton(), homes_root(request.cache_dir))
    reason = local_servability(ModelTarget(repo, options.name, parse(_locally(text))), home)
    if reason:
        search.reason = reason.replace("validate it", "serve it").split("; ")[0]
        yield None
        return
    search.stand_in = artifact.platform.backend in home.stand_ins()
    search.served_by = (f"{STAND_IN_LABEL}: Triton's python backend runs backends/{artifact.platform.backend}/model.py"
                        if search.stand_in else "native backend")
    share = None if Device.of(artifact.device).is_cuda else _free_cores(request, search, on_event)
    files = model_files(result)

    def place(name: str, with_files: bool) -> None:  # the private model folder: the artifact's files linked, the extra files written
        version = repo / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        if not with_files:  # an ensemble front: its version folder only
            return
        for target, source in files.items():
            (version / target).unlink(missing_ok=True)
            (version / target).symlink_to(source.resolve())
        for rel, data in extra.items():
            (repo / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / name / rel).write_bytes(data)

    with LocalTritonServer(repo, log_path=request.workdir / "tritonserver.log", home=home, cores=share.pin if share else None) as server:
        search.server = f"local tritonserver {home.version and 'from nvidia-pytriton ' + home.version} at {server.http_url}"
        yield _Where("the local server", server.http_url if request.protocol == "http" else server.grpc_url, server.check_alive, place=place,
                     share=share)


def _remote(result: TuneResult, request: SearchRequest, search: ServedSearch, extra: dict[str, bytes]) -> _Where:
    """The user's server (--url): the model's files go in every load request, since it may not see this disk."""
    from optimizer.triton.server import open_client

    assert request.url is not None
    files = {f"1/{target}": source.read_bytes() for target, source in model_files(result).items()}
    files.update(extra)
    search.server = f"Triton {request.server_version or '(version unknown)'} at {request.url} ({request.protocol}, --url)"
    search.served_by = "native backend"  # unless the first variant's config says a model.py ran it (checked after it loads)
    client = open_client(request.protocol, request.url, 10.0)

    def check_alive() -> None:
        try:
            if client.is_server_live():
                return
        except Exception:
            pass
        raise ValidationError(f"the Triton at {request.url} stopped answering")

    return _Where(f"the Triton at {request.url}", request.url, check_alive, files=files)


class _Run:
    """One search's state: what was measured, the best so far, the time left, the next private name."""

    def __init__(self, result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, loader: VariantLoader,
                 bench: Bench, check_alive: Callable[[], None], deadline: float, on_event: EventSink) -> None:
        self.result, self.options, self.request, self.search = result, options, request, search
        self.loader, self.bench, self.check_alive, self.deadline, self.on_event = loader, bench, check_alive, deadline, on_event
        self.objective = request.objective
        self.renamed = config_signature(result.selected_candidate.artifact)[1]
        self.fronted = needs_front(self.renamed, options.io_names)  # measured through the ensemble clients will call
        self.seen: dict[OperatingPoint, ServedVariant] = {}
        self.best: ServedVariant | None = None
        self.costs: list[float] = []
        self.count = 0
        self.runtime: str | None = None  # the first loaded variant's config `runtime` ("model.py": a Python-based backend)
        self.gone = ""  # why the server stopped answering, when it did

    # -- the order ---------------------------------------------------------------------------------------------------
    def explore(self, space: SearchSpace) -> str:
        """Coarse pass, refinement of the best two, settle a close call; returns why the search ended."""
        try:
            self.measure([p for p in coarse_grid(space) if p not in self.seen], "coarse")
            top = self.ranked()[:2]
            self.measure([p for v in top for p in refinements(v.point, space, set(self.seen))], "refine")
            self.settle()
        except _OutOfTime:
            return f"the time budget ({self.request.budget_s:.0f} s, --serve-search-seconds) ran out"
        except _ServerGone as err:
            self.gone = str(err)
            return f"{err}; the best variant measured before stands"
        return "every variant of the coarse pass and the refinement was measured"

    def ranked(self) -> list[ServedVariant]:
        """Measured variants, best first by the objective (each point's latest measurement)."""
        pool = [v for v in self.seen.values() if v.status == "measured" and v.throughput is not None]
        ranked: list[ServedVariant] = []
        for v in pool:
            i = next((k for k, r in enumerate(ranked) if better(v, r, self.request.latency_budget_ms, self.request.percentile)), len(ranked))
            ranked.insert(i, v)
        return ranked

    # -- measuring -----------------------------------------------------------------------------------------------------
    def measure(self, points: list[OperatingPoint], stage: str) -> list[ServedVariant]:
        """Measure points a group at a time (loaded together, measured one after another, unloaded); updates the best."""
        out: list[ServedVariant] = []
        points = list(dict.fromkeys(points))
        while points:
            fits = self._fits(len(points[:LOAD_GROUP]))
            if fits == 0:
                raise _OutOfTime()
            group, points = points[:fits], points[fits:]
            out += self._measure_group(group, stage)
        return out

    def _fits(self, wanted: int) -> int:
        """How many more variants fit in the budget at the slowest cost so far (the budget is a bound, not a target)."""
        if not self.costs:
            return wanted
        left = self.deadline - time.monotonic()
        return max(0, min(wanted, int(left // max(self.costs))))

    def _measure_group(self, group: list[OperatingPoint], stage: str) -> list[ServedVariant]:
        t0 = time.monotonic()
        variants = {self._next_name(): ServedVariant(p, stage) for p in group}
        configs = {}
        for name, v in variants.items():
            try:
                configs[name] = self._config(v.point)
            except (ConfigRuleError, TemplateError, PublishError) as err:
                v.status, v.reason = "failed", f"the config is refused: {err}"
        errors = self._load(configs)
        load_share = (time.monotonic() - t0) / max(1, len(configs))
        if self.runtime is None and any(n not in errors for n in configs):
            self.runtime = self.loader.runtime(next(n for n in configs if n not in errors))
        try:
            for name, v in variants.items():
                v.seconds = round(load_share, 2)
                if name in errors:
                    v.status, v.reason = "failed", f"Triton could not load it: {errors[name]}"
                elif v.status == "measured":
                    self._sweep(name, v)
                self._record(v)
        finally:
            self._unload(list(variants))
        return list(variants.values())

    def _load(self, configs: dict[str, str]) -> dict[str, str]:
        """Load variants by their measured names: the model itself, or its positional model and then the ensemble in front."""
        if not configs:
            return {}
        if not self.fronted:
            return self.loader.load(configs)
        errors = self.loader.load({inner_name(n): text for n, text in configs.items()})
        fronts = {n: canonical(front_config(parse(text), n, inner_name(n), self.renamed)) for n, text in configs.items() if inner_name(n) not in errors}
        errors = {n: errors[inner_name(n)] for n in configs if inner_name(n) in errors}
        errors.update(self.loader.load(fronts, files={f"1/{VERSION_MARKER}": VERSION_MARKER_TEXT}) if fronts else {})
        return errors

    def _unload(self, names: list[str]) -> None:
        """Unload variants (an ensemble before the model it serves)."""
        self.loader.unload(names)
        if self.fronted:
            self.loader.unload([inner_name(n) for n in names])

    def _sweep(self, name: str, v: ServedVariant) -> None:
        from tritonclient.utils import InferenceServerException

        seed = self.best.concurrency if self.best is not None and self.best.concurrency else seed_concurrency(v.point)
        t0 = time.monotonic()
        try:
            first = self.objective.first_level(seed)
            warm_up(self.bench, name, first, WARMUP_PER_SLOT * first)
            v.seconds = round(v.seconds + time.monotonic() - t0, 2)
            window = self.bench.window_ms
            sweep(v, self.objective, seed, lambda c: measure_level(self.bench, name, c, window), explore_down=v.stage != "coarse")
        except ValidationError as err:
            v.status, v.reason = "failed", str(err)
        except (InferenceServerException, OSError) as err:  # the server refused the warm-up, or closed the connection dying
            from optimizer.triton.server import triton_message

            v.status, v.reason = "failed", f"Triton stopped answering: {triton_message(err)}"

    def _record(self, v: ServedVariant) -> None:
        self.search.variants.append(v)
        self.costs.append(v.seconds)
        if v.status == "measured":
            top = max((x.throughput or 0.0) for x in self.seen.values()) if self.seen else None
            self.seen[v.point] = v
            if self.best is None or better(v, self.best, self.request.latency_budget_ms, self.request.percentile, top):
                self.best = v
        else:
            self.seen.setdefault(v.point, v)
        mark = (f"{v.throughput:.1f}/s p{self.request.percentile} {_lat(v, self.request.percentile):.1f} ms at concurrency {v.concurrency}"
                if v.throughput is not None else f"{v.status}: {v.reason}")
        self.on_event(Event("serve", "progress", self.result.selected or "", f"{v.stage}: {v.point.label}: {mark}"))
        try:
            self.check_alive()
        except ValidationError as err:
            raise _ServerGone(f"the server stopped: {err}") from err

    # -- a close call ----------------------------------------------------------------------------------------------------
    def settle(self) -> None:
        """When the runner-up is within the noise of repeated measurement of the best, measure both again interleaved
        (A B A B) at one load with longer windows, and keep the one that serves more (then the lower latency)."""
        ranked = self.ranked()
        if len(ranked) < 2 or not close(ranked[0], ranked[1]):
            return
        a, b = ranked[0], ranked[1]
        level = settle_level(a, b, self.objective)
        cost = 2 * SETTLE_ROUNDS * max(2.0, 3 * 2 * self.bench.window_ms / 1000.0) + max(self.costs)
        if time.monotonic() + cost > self.deadline:
            raise _OutOfTime()
        names = {self._next_name(): a, self._next_name(): b}
        errors = self._load({n: self._config(v.point) for n, v in names.items()})
        if errors:
            self._unload(list(names))
            return
        window = 2 * self.bench.window_ms
        levels: dict[str, list[LoadLevel]] = {n: [] for n in names}
        try:
            for n in names:
                warm_up(self.bench, n, level, WARMUP_PER_SLOT * level)
            for _ in range(SETTLE_ROUNDS):
                for n in names:
                    levels[n].append(measure_level(self.bench, n, level, window))
        except ValidationError:
            return
        finally:
            self._unload(list(names))
        pct = self.request.percentile
        means = {n: _mean_level(lv) for n, lv in levels.items()}
        (na, ma), (nb, mb) = means.items()
        ratio = ma.throughput / mb.throughput
        if ratio >= 1 + THROUGHPUT_NOISE:
            winner = na
        elif ratio <= 1 - THROUGHPUT_NOISE:
            winner = nb
        else:  # a tie in throughput: the lower latency at the same load, when clearly lower
            winner = nb if mb.latency(pct) < ma.latency(pct) * (1 - LATENCY_GAIN) else na
        for n, v in names.items():
            again = ServedVariant(v.point, "settle", curve=[means[n]],
                                  reason="mean of " + ", ".join(f"{lv.throughput:.1f}/s" for lv in levels[n]) + f" at concurrency {level}, interleaved")
            again.score_at(means[n])
            again.meets_budget = None if self.request.latency_budget_ms is None else means[n].latency(pct) <= self.request.latency_budget_ms
            self.search.variants.append(again)
            if n == winner:
                self.best = again
        self.search.settled = (f"{a.point.label} and {b.point.label} served within {100 * (1 - min(ratio, 1 / ratio)):.1f}% of each other, "
                               f"measured A B A B at concurrency {level}: {names[winner].point.label} kept")

    def base(self) -> None:
        """The published variant at one request at a time, when its sweep did not reach it and the budget allows: the anchor
        of validate's prediction for loads below the ones the search measured (prediction.py)."""
        best = self.best
        if best is None or best.level(1) is not None or not self.costs or time.monotonic() + max(self.costs) > self.deadline:
            return
        name = self._next_name()
        if self._load({name: self._config(best.point)}):
            self._unload([name])
            return
        try:
            warm_up(self.bench, name, 1, WARMUP_PER_SLOT)
            one = measure_level(self.bench, name, 1, self.bench.window_ms)
        except ValidationError:
            return
        finally:
            self._unload([name])
        base = ServedVariant(best.point, "base", curve=[one], reason="one request at a time: the anchor of validate's prediction below the loads the sweep measured")
        base.score_at(one)
        self.search.variants.append(base)

    # -- helpers -------------------------------------------------------------------------------------------------------------
    def _config(self, point: OperatingPoint) -> str:
        text, _, _ = prepare_config(self.result, replace(self.options, operating_point=point))
        return _locally(text)

    def _next_name(self) -> str:
        self.count += 1
        return private_name(self.options.name, self.count)


def _lat(v: ServedVariant, percentile: int) -> float:
    level = v.level(v.concurrency) if v.concurrency is not None else None
    return level.latency(percentile) if level is not None else (v.p95_ms or 0.0)


def _mean_level(levels: list[LoadLevel]) -> LoadLevel:
    """Repeated measurements of one load as one: the mean of each figure."""
    def avg(xs: list[float | None]) -> float | None:
        vals = [x for x in xs if x is not None]
        return sum(vals) / len(vals) if vals else None

    return LoadLevel(levels[0].concurrency, *(avg([getattr(lv, f) for lv in levels]) for f in ("throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "server_batch")))


def _as_measured(point: OperatingPoint, decision) -> OperatingPoint:
    """The rules' point with the batch sizes in-process profiling measured (before any scaling to cores it did not run on)."""
    if decision is None or not decision.measured_max or point.max_batch_size != decision.max_batch_size:
        return point
    measured = decision.measured_max
    preferred = tuple(dict.fromkeys(min(b, measured) for b in point.preferred if min(b, measured) > 1))
    return replace(point, max_batch_size=measured, preferred=preferred)


def _free_cores(request: SearchRequest, search: ServedSearch, on_event: EventSink) -> CoreShare:
    """The cores others leave free; with --wait-for-cores, probe again until every core is free or the wait is over."""
    share = probe()
    if share.reduced and request.wait_for_cores_s > 0:
        t0 = time.monotonic()
        on_event(Event("serve", "progress", message=f"{share.others_busy:.1f} cores busy with other processes; waiting up to "
                       f"{request.wait_for_cores_s:g} s for them (--wait-for-cores)"))
        while share.reduced and time.monotonic() - t0 < request.wait_for_cores_s:
            time.sleep(WAIT_PROBE_S)
            share = probe()
        search.waited_s = round(time.monotonic() - t0, 1)
    return share


class _OutOfTime(Exception):
    """The next variant would not finish within --serve-search-seconds."""


class _ServerGone(ValidationError):
    """The server died while a variant was measured."""


def _locally(text: str) -> str:
    """The config as the local 2.51 server can load it (torch_aoti through the pytorch stand-in; others unchanged)."""
    config = parse(text)
    return canonical(local_config(config)) if needs_translation(config) else text


def request_mix(result: TuneResult, workdir: Path, public_names: bool = False) -> tuple[Path, str, list[dict]]:
    """perf_analyzer's input: the rows in-process profiling timed (the user's first sample, else the generated
    feed with every dynamic axis at its maximum), in the config's tensor names (or, through an ensemble front, the
    forward() names clients send); and the same rows as batch-1 requests."""
    feeds = load_feeds(Path(result.reference.profile_feed))
    sig, renamed = config_signature(result.selected_candidate.artifact)
    back = {} if public_names else {original: config_name for config_name, original in renamed.items()}
    feeds = [{back.get(k, k): v for k, v in feed.items()} for feed in feeds]
    shapes = ", ".join(f"{k} {'x'.join(map(str, v.shape[1:] if sig.batching else v.shape)) or 'scalar'}" for k, v in feeds[0].items())
    path = write_input_data(workdir / "perf_analyzer_input.json", feeds, sig.batching)
    if sig.batching:
        rows = [{k: v[i:i + 1] for k, v in feed.items()} for feed in feeds for i in range(next(iter(feed.values())).shape[0])]
    else:
        rows = list(feeds)
    return path, f"the profiled sample ({shapes}), as in-process profiling and validate send it", rows[:32]


def _predict(search: ServedSearch, result: TuneResult) -> None:
    """The published config's served throughput where the search scored it, split into the in-process time at the batch
    the server formed and the server's own cost per request (validate predicts the loads the search did not measure from
    the curve and that cost)."""
    chosen = search.chosen_variant
    decision = result.selected_candidate.decision
    if chosen is None or chosen.throughput is None:
        return
    search.predicted_throughput = round(chosen.throughput, 2)
    if decision is None or not decision.profiles:  # (on a busy machine in-process profiling ran on the same free cores)
        return
    batch = chosen.server_batch or 1.0
    per_sample_ms = _per_sample_ms(decision.profiles, batch)
    search.in_process_throughput = round(1000.0 / per_sample_ms, 2)
    search.per_request_ms = round(1000.0 / chosen.throughput - per_sample_ms, 4)


def _per_sample_ms(profiles, batch: float) -> float:
    """In-process mean time per sample at `batch`, interpolated between the measured sizes (flat outside them)."""
    pts = sorted((p.batch_size, p.mean_ms / p.batch_size) for p in profiles)
    if batch <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 <= batch <= b1:
            return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
    return pts[-1][1]


def _summary(search: ServedSearch) -> str:
    chosen = search.chosen_variant
    start = next((v for v in search.variants if v.stage == "start"), None)
    if chosen is None or start is None or chosen.throughput is None or start.throughput is None:
        return "searched"
    where = " on the free cores" if search.on_free_cores else ""
    return (f"{chosen.point.label}: {chosen.throughput:.1f}/s p{search.percentile} {_lat(chosen, search.percentile):.1f} ms at concurrency "
            f"{chosen.concurrency}{where} (rules: {start.throughput:.1f}/s at concurrency {start.concurrency}; "
            f"{len(search.variants)} variants, {search.stopped})")
