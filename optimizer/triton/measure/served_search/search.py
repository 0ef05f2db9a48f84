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
import time
from dataclasses import replace
from pathlib import Path

from optimizer.errors import ServerError, ValidationError
from optimizer.events import Event, EventSink, ignore
from optimizer.model.samples import load_feeds
from optimizer.model.signature import Signature
from optimizer.model.traffic import Traffic
from optimizer.records.capacity import arrivals_label
from optimizer.records.served_search import OperatingPoint, ServedSearch
from optimizer.records.tune_result import TuneResult
from optimizer.triton.config.front import needs_front
from optimizer.triton.runtime.local_serving import needs_translation, translation_note
from optimizer.triton.config.model_config import parse
from optimizer.triton.config.spec import batching_plan, config_signature, operating_point_of
from optimizer.triton.repository.publish import PublishOptions, prepare_config
from optimizer.triton.measure.served_search.cache import ServedSearchCache, search_key
from optimizer.triton.measure.served_search.kinds import enter_other_kind, other_kind, other_kind_candidates, why_no_other_kind
from optimizer.triton.measure.served_search.clock import BudgetClock
from optimizer.triton.measure.served_search.measure import request_mix
from optimizer.triton.measure.served_search.measurer import VariantMeasurer
from optimizer.triton.measure.served_search.open_loop import OpenLoopStage, open_loop_reserve
from optimizer.triton.measure.served_search.padding import PaddingTrial, padded_answers, padding_reserve, padding_trial
from optimizer.triton.measure.served_search.points import HELD_LAYOUT, SearchSpace, latency_at
from optimizer.triton.measure.served_search.request import SearchRequest
from optimizer.triton.measure.served_search.run import SearchRun
from optimizer.triton.measure.served_search.servers import STAND_IN_LABEL, Rig
from optimizer.triton.runtime.install import ToolMissing, find_triton, homes_root, prepare_home
from optimizer.vocab import Device

log = logging.getLogger(__name__)

BESIDE_LOAD = ("other processes kept {busy:.1f} of {cores} cores busy as the served search began; the server runs on every core "
               "beside them, as it will be deployed, and every variant is measured beside that load: throughputs are below an "
               "idle machine's, the instance layout is the rules' (not compared beside the load) and the batcher's choice can differ "
               "from a quiet export's (export on a quiet machine, or give --wait-for-cores)")
"""Why the served search is not pinned to the free cores as in-process measurement is: a server pinned there can only
measure layouts for fewer cores, and its choice would be for a machine the model is not deployed on. The other load does
not meet every instance layout alike, so beside it the layout is held at the rules' (points.HELD_LAYOUT); the record of
what this cost is benchmarks/noisy_choice.py's."""

__all__ = ["SearchRequest", "served_search", "request_mix", "Rig", "STAND_IN_LABEL"]


def served_search(result: TuneResult, options: PublishOptions, request: SearchRequest, on_event: EventSink = ignore,
                  rig: Rig | None = None) -> ServedSearch:
    """Search the served operating point of `result`'s selected artifact; never raises for a model the bundled server
    cannot serve. On the user's server (--url) a failure that is the server's (gone, refusing the search) raises
    ServerError: nothing is published from half a search there.

    Returns a ServedSearch with status "searched" (chosen = the best variant measured) or "skipped" (reason; chosen
    = the rules' point, which publishing then keeps; `refused` when the user's server would not load the artifact).
    `rig` says where the variants run and what measures them (servers.Rig: the bundled server or --url).
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
    cache, key = _cache_for(result, options, request)
    cached = cache.load(key) if cache is not None else None
    if cached is not None:
        on_event(Event("serve", "done", result.selected or "", f"{_summary(cached)}; reused from the search measured {cached.cached_from}"))
        return cached
    try:
        _search(result, options, request, search, on_event, rig or Rig())
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
        if cache is not None:
            cache.store(key, search)
    return search


def _cache_for(result: TuneResult, options: PublishOptions, request: SearchRequest) -> tuple[ServedSearchCache | None, str]:
    """The cache and this search's key (None: --no-cache, or nothing to key it by)."""
    if not request.use_cache or request.cache_dir is None:
        return None, ""
    if request.url:
        build = f"{request.url} {request.server_version}"
    else:
        try:
            build = prepare_home(find_triton(), homes_root(request.cache_dir)).root.name
        except ToolMissing:
            return None, ""
    try:
        gpu = Device.of(result.selected_candidate.artifact.device).is_cuda
        others = tuple(other_kind_candidates(result, options, request, gpu)[:1])
        key = search_key(result, prepare_config(result, options)[0], request, build, options.io_names, others)
    except OSError as err:  # a file of the artifact or the request mix is gone: measure
        log.warning("the served search is not cached: %s", err)
        return None, ""
    return ServedSearchCache(request.cache_dir), key


def _search(result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, on_event: EventSink, rig: Rig) -> None:
    artifact = result.selected_candidate.artifact
    assert artifact is not None and artifact.platform is not None and search.start is not None
    text, extra, _ = prepare_config(result, options)
    with rig.server(result, options, request, search, text, extra, on_event) as where:
        if where is None:  # the local server cannot serve this artifact: search.reason says why
            return
        if needs_translation(parse(text)):
            search.served_by += f"; {translation_note(parse(text))}"
        fronted = needs_front(config_signature(artifact)[1], options.io_names)
        if fronted:
            search.served_by += "; measured through the ensemble that keeps the forward() names in front of it, as published"
        input_data, search.request_mix, rows = request_mix(result, request.workdir, public_names=fronted)
        trace = trace_input(result, request.workdir, fronted) if request.open_loop else None
        bench = rig.bench(where, input_data, rows, request, *([trace[1]] if trace else []))
        if trace:
            bench = replace(bench, rate_input=trace[0])
        gpu = Device.of(artifact.device).is_cuda
        decision = result.selected_candidate.decision
        share, first = where.share, search.start
        beside = share is not None and share.reduced
        if beside:  # the server runs on every core beside the other load, as deployed: see BESIDE_LOAD
            search.measured_on = share.to_json()
            first = _as_measured(search.start, decision)
            on_event(Event("serve", "progress", result.selected or "", BESIDE_LOAD.format(busy=share.others_busy, cores=len(share.available))))
        # the rules' delay at the in-process peak: SearchSpace.of keeps it for a start that cannot carry one (max 1)
        rules_delay = (batching_plan(decision, decision.peak, request.latency_budget_ms, request.percentile).max_queue_delay_microseconds
                       if decision is not None and (decision.peak or 0) > 1 else None)
        space = SearchSpace.of(decision, first, rig.cores(), gpu, request.concurrency or 0, request.user_max, beside_load=beside,
                               rules_delay_us=rules_delay, pads=artifact.platform.pads_batch, loads=tuple(request.objective.loads))
        if space.layout is not None:
            search.held_layout = HELD_LAYOUT
        sig = Signature.from_json(result.signature)
        traffic = run_traffic(result)
        padding = traffic is not None and sig.batching and sig.is_dynamic and len(traffic.histogram(sig)) > 1
        clock = BudgetClock.starting_now(request.budget_s, bench.now)
        with rig.loader(where, request) as loader:
            measurer = VariantMeasurer(result, options, request.objective, loader, bench, where.check_alive, clock,
                                       baseline=share.others_busy if share is not None else None, translate=request.url is None)
            run = SearchRun(search, request.objective, request.percentile, request.latency_budget_ms, clock, measurer, on_event, result.selected or "")
            trial = PaddingTrial([f"{n}[{i + 1}]" for n, i in Traffic.axes_of(sig)], traffic.bucket_edges(sig)) if padding else None
            if trial is not None:  # while the start is loaded: do padded requests get the same answers?
                measurer.on_start = lambda name: setattr(trial, "answers", padded_answers(run, name, traffic, sig, trial.edges, fronted))
            best = run.measure([first], "start")[0]
            if best.status != "measured":
                search.refused = request.url is not None and best.reason.startswith(("Triton could not load it", "its answers are wrong"))
                search.reason = f"the in-process rules' config could not be measured in {where.name}: {best.reason}"
                return
            if measurer.runtime == "model.py":  # a Python-based backend answered for the platform: not the native one
                search.stand_in = True
                search.served_by = search.served_by.replace("native backend", f"{STAND_IN_LABEL} (the server runs a model.py for "
                                                            f"backend {artifact.platform.backend})", 1)
            measurer.bench = replace(bench, window_ms=bench.window_for(best.throughput))
            search.status = "searched"
            if trial is not None and request.rate_objective:  # its gain would be measured closed-loop, where the rate is not
                search.client_padding = {"advised": False, "why": "padding is not tried under --rate: the choice is made open-loop, on the traffic as it comes"}
                trial = None
            padded_later = trial is not None and not trial.answers
            with clock.holding_back(lambda: padding_reserve(clock, request.budget_s) if padded_later else 0.0):
                other = other_kind(result, options, request, gpu) if not beside else None
                if other is None:
                    search.kinds = "no candidate of the other kind (padding or not) entered: " + (
                        "the search runs beside other processes' load" if beside else why_no_other_kind(result))
                else:
                    enter_other_kind(run, other, where, options, request, search, space)
                with clock.holding_back(lambda: open_loop_reserve(request.rate_objective, clock.variant_cost()) if request.open_loop else 0.0):
                    search.stopped = run.explore(space)
                if request.url and run.gone:
                    raise ServerError(f"{run.gone}; every variant it had loaded was unloaded where it could be, nothing was published")
                if request.open_loop and not run.gone:
                    OpenLoopStage(run, request, search, space).run_stage()
                run.measure_lone_request()
            if trial is not None:
                search.client_padding = padding_trial(run, trial, request, fronted).to_json()
            elif traffic is not None:
                search.client_padding = {"advised": False, "why": "the traffic comes in one shape" if sig.is_dynamic else "the model has no dynamic axis"}
            search.remeasured, search.retried_s = measurer.remeasured, round(clock.retried_s, 1)
    search.chosen = run.best.point
    if search.padded:
        search.chosen = OperatingPoint.from_json(search.client_padding["point"])
        if search.capacity is not None:  # measured on the variant before padding: not the published one's
            search.capacity = None
            search.reason = "the capacity was measured before padding was advised; validate --rate measures the published config"
    if request.rate_objective:
        search.objective, search.load = "rate", _rate_load(request, search)
    search.candidate = search.chosen.candidate
    search.concurrency = run.best.concurrency
    if run.best.point in run.robust:
        worst, at = run.robust[run.best.point]
        search.load += f"; it served {worst:.2f}x the best variant measured at its worst load (concurrency {at})"
    for v in search.variants:  # each variant's worst score under a robust objective, for the report and the tests
        if v.point in run.robust and v.stage != "padded":
            v.worst, v.worst_at = round(run.robust[v.point][0], 4), run.robust[v.point][1]
    search.concurrency_source = ("--concurrency" if request.concurrency else
                                 f"where the published variant {'met the budget with the most throughput' if request.latency_budget_ms is not None else 'reached its peak'} in its sweep")
    _predict(search, result)
    for v in search.variants:
        v.differs = v.point.differences(search.chosen)


def trace_input(result: TuneResult, workdir: Path, public_names: bool) -> tuple[Path, tuple[float, ...]] | None:
    """A traffic with timestamps: perf_analyzer's input data in the trace's order (in the names the server is sent) and
    the timestamps, so open-loop runs replay its schedule; None for a traffic without them."""
    from optimizer.triton.runtime.perf_analyzer_input import trace_of, write_input_data

    trace = trace_of(result)
    if trace is None:
        return None
    feeds, stamps = trace
    sig, renamed = config_signature(result.selected_candidate.artifact)
    back = {} if public_names else {original: config_name for config_name, original in renamed.items()}
    feeds = [{back.get(k, k): v for k, v in feed.items()} for feed in feeds]
    path = write_input_data(workdir / "perf_analyzer_trace.json", feeds, sig.batching, max_entries=len(stamps))
    return path, tuple(stamps)


def _rate_load(request: SearchRequest, search: ServedSearch) -> str:
    """What an open-loop choice was for, in one line."""
    arrivals = "the trace's schedule, scaled" if search.capacity and search.capacity.get("arrivals") == "trace" else arrivals_label(request.arrivals)
    if request.latency_budget_ms is not None:
        at = f"--rate {request.rate:g}" if request.rate is not None else "--rate max"
        return (f"the highest request rate held within p{request.percentile} <= {request.latency_budget_ms:g} ms ({at}, --latency-budget-ms), "
                f"open-loop under {arrivals}: the finalists of a closed-loop pass measured at rates a grid step apart")
    return (f"the lowest p{request.percentile} latency at {request.rate:g} requests/s (--rate), open-loop under {arrivals}, "
            "among the finalists of a closed-loop pass that keep up with it")


def run_traffic(result: TuneResult) -> Traffic | None:
    """The run's traffic (None in a report written before it was recorded)."""
    path = result.reference.traffic
    if not path or not Path(path).is_file():
        return None
    summary = result.traffic or {}
    return Traffic(tuple(load_feeds(Path(path))), summary.get("source", "file"), summary.get("origin", "the traffic"))


def _as_measured(point: OperatingPoint, decision) -> OperatingPoint:
    """The rules' point with the batch sizes in-process profiling measured (before any scaling to cores it did not run on)."""
    if decision is None or not decision.measured_max or point.max_batch_size != decision.max_batch_size:
        return point
    measured = decision.measured_max
    preferred = tuple(dict.fromkeys(min(b, measured) for b in point.preferred if min(b, measured) > 1))
    return replace(point, max_batch_size=measured, preferred=preferred)


def _predict(search: ServedSearch, result: TuneResult) -> None:
    """The published config's served throughput where the search scored it, split into the in-process time at the batch
    the server formed and the server's own cost per request (validate predicts the loads the search did not measure from
    the curve and that cost)."""
    chosen = search.chosen_variant
    decision = result.selected_candidate.decision
    if chosen is None or chosen.throughput is None:
        return
    search.predicted_throughput = round(chosen.throughput, 2)
    if chosen.point.candidate:  # another kind's candidate won: its own in-process curve
        decision = next((c.decision for c in result.candidates if c.name == chosen.point.candidate), None)
    if decision is None or not decision.profiles:  # (on a busy machine in-process profiling ran on the same free cores)
        return
    batch = chosen.server_batch or 1.0
    per_sample_ms = _per_sample_ms(decision.profiles, batch)
    search.in_process_throughput = round(1000.0 / per_sample_ms, 2)
    # never below 0: instances in parallel can serve more per second than the one in-process runner did, which is no
    # negative cost (and a lone request's prediction, in-process time + this cost, must not undercut in-process time)
    search.per_request_ms = round(max(0.0, 1000.0 / chosen.throughput - per_sample_ms), 4)


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
    where = " beside other processes' load" if search.beside_load else ""
    return (f"{chosen.point.label}: {chosen.throughput:.1f}/s p{search.percentile} {latency_at(chosen, search.percentile):.1f} ms at concurrency "
            f"{chosen.concurrency}{where} (rules: {start.throughput:.1f}/s at concurrency {start.concurrency}; "
            f"{search.count_text()}, {search.stopped})")
