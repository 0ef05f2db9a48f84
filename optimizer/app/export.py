"""The export use case: plan -> load -> signature -> reference -> tune -> publish -> report (-> validate).

It reads as a list of phase calls; each phase lives in its own module.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from optimizer.app.plan import RunPlan, plan_run
from optimizer.errors import ConfigRuleError, PublishError, ServerError, SettingsError, TemplateError
from optimizer.events import Event, EventSink, ignore
from optimizer.model.reference import resolve_signature
from optimizer.model.samples import batch_sizes_of, calibration_file, load_feeds, load_npz
from optimizer.model.source import load_model
from optimizer.model.traffic import traffic_for
from optimizer.records.served_search import ServedSearch
from optimizer.records.tune_result import TuneResult, Unpublished
from optimizer.report.json_report import write_report
from optimizer.report.markdown import write_report_files
from optimizer.settings import ExportSettings
from optimizer.task.accuracy_gate import check_on_reference
from optimizer.task.context import TuneContext
from optimizer.task.isolation import refuse_unguarded_main
from optimizer.task.profiling import ProfileSettings
from optimizer.task.reference_set import prepare_reference
from optimizer.triton.repository.publish import PublishOptions, check_target, publish
from optimizer.triton.repository.atomic import Published, check_model_name, outside_repository

log = logging.getLogger(__name__)

SERVE_SEARCH_SHARE = 0.4
MIN_SERVE_SEARCH_S = 90.0
"""Without --serve-search-seconds the search may take 40% of the tuning time, at least 90 s: enough for the coarse pass and
a refinement of a small model; a larger model's tuning time buys its search more."""
RATE_SEARCH_EXTRA = 1.5
"""With --rate the default budget is 50% longer: the finalists' open-loop runs (several seconds each: a screening run and
a challenging run each, the capacities, the claim's half rung) come on top of a closed-loop pass that still needs its
coarse grid."""


@dataclass
class ExportOutcome:
    """What a run produced: the tuning result, where the model landed and where the report is."""

    result: TuneResult
    published: Published | None
    report_path: Path
    validation: Any = None


def export(settings: ExportSettings | None = None, *, module: Any = None, example_inputs: Any = None, on_event: EventSink = ignore) -> ExportOutcome:
    """Tune MODEL (or `module`) and publish the winner into the repository. See ExportSettings for every option."""
    settings = settings or ExportSettings()
    t0 = time.perf_counter()
    refuse_unguarded_main()  # before anything is written: its children would run the caller's script again
    # 1. every check that needs no model, once
    plan = plan_run(settings)
    strategy = plan.strategy

    # 2. load
    on_event(Event("load", "start", message=settings.model or "bundled example"))
    model = load_model(settings.model, module, example_inputs, Path(settings.report_dir or "aitune-reports") / ".source", settings.name)
    name = settings.name if settings.name is not None else check_model_name(model.name)  # plan_run checked --name
    check_target(plan.repository, name, settings.version, settings.overwrite, settings.io_names)
    report_dir = outside_repository(Path(settings.report_dir) if settings.report_dir else Path("aitune-reports") / name,
                                    Path(settings.repository), "--report-dir")  # never inside the repository
    on_event(Event("load", "done", message=f"{model.name} ({model.format})", elapsed_s=time.perf_counter() - t0))

    # 3. signature and reference
    on_event(Event("signature", "start"))
    signature = resolve_signature(model, plan.input_specs, plan.value_ranges, plan.output_names, settings.batching)
    user_feeds = load_npz(Path(settings.samples), signature) if settings.samples else []
    traffic = traffic_for(signature, settings.traffic, user_feeds, Path(settings.samples).name if settings.samples else None)
    on_event(Event("signature", "done", message=signature.describe()))
    work = report_dir / "work"
    recorded = tuple(batch_sizes_of(user_feeds)) if user_feeds and signature.batching else ()
    on_event(Event("reference", "start"))
    try:
        reference = prepare_reference(model, signature, user_feeds, report_dir / "samples", traffic)
        state_dict = model.snapshot_weights(work)
    except OSError as err:
        raise SettingsError(f"could not write the report folder {str(report_dir)!r}: {err.strerror or err}; choose another --report-dir.") from err
    calibration = calibration_file(settings.calibration_samples, signature, user_feeds, report_dir / "samples")
    if plan.accuracy.check:  # a check that raises or answers garbage on the reference itself stops the run now
        check_on_reference(plan.accuracy.check, load_feeds(Path(reference.outputs)), signature.output_names)
    on_event(Event("reference", "done", message="; ".join(reference.points)))

    # 4. tune
    ctx = TuneContext(
        model=model,
        signature=signature,
        reference=reference,
        workdir=work,
        device=plan.device,
        precision=settings.precision,
        recorded_batch_sizes=recorded,
        build_timeout_s=settings.build_timeout_s,
        profile_timeout_s=settings.profile_timeout_s,
        time_budget_s=settings.time_budget_s,
        profile=ProfileSettings(),
        tolerances=plan.tolerances,
        state_dict=state_dict,
        on_event=on_event,
        cache=plan.cache,
        cache_root=plan.cache_root,
        accuracy=plan.accuracy,
        calibration=calibration,
    )
    result = strategy.tune(ctx)
    result.traffic = traffic.summary(signature).to_json()
    report_path = report_dir / "report.json"
    stop = result.why_not_published(name, report_path)

    # 5. serve search and publish (unless tuning ended the run), then the report, written once for every outcome
    published: Published | None = None
    if stop is None:
        options = PublishOptions(plan.repository, name, settings.version, settings.overwrite, settings.warmup,
                                 Path(settings.template_dir) if settings.template_dir else None, report_dir=report_dir,
                                 cache_dir=plan.cache_root, io_names=settings.io_names)
        try:
            search, published = _search_and_publish(result, settings, plan, options, work, on_event)
        except (PublishError, TemplateError, ConfigRuleError) as err:  # the tuning results are kept in the report
            stop = Unpublished(err, render=True)
        else:
            on_event(Event("publish", "done", result.selected, f"{published.model_dir} version {published.version}"))
            from optimizer.fleet.manifests import record_manifests

            record_manifests(report_dir, published, settings.triton_release)  # kserve/inferenceservice.yaml beside the report
    write_report(report_path, result, settings, published)  # the one writer of report.json, for every way a tuned run ends
    rendered = write_report_files(report_path) if stop is None or stop.render else None  # report.md and the plots beside it
    if stop is not None:
        raise stop.error
    on_event(Event("report", "done", message=f"{report_path} (+ {', '.join(p.name for p in [rendered.markdown, *rendered.plots.values()])})"))
    validation = None
    if settings.validate:  # 6. prove it in a real Triton (validation.json beside report.json)
        from optimizer.triton.measure.validation import validate

        validation = validate(plan.repository, name, concurrency=settings.validate_concurrency, report_dir=report_dir,
                              on_event=on_event, cache_dir=plan.cache_root)  # over the search's protocol (validate reads it from the report)
        write_report_files(report_path)  # again, now with the validation section
    return ExportOutcome(result, published, report_path, validation)


def _search_and_publish(result: TuneResult, settings: ExportSettings, plan: RunPlan, options: PublishOptions, work: Path,
                        on_event: EventSink) -> tuple[ServedSearch, Published]:
    """The served search from the rules' operating point, then the model published at the point it chose."""
    _padded_max_for_every_load(result, plan.user_max)  # the rules' point: what is published when no search runs, and where one starts
    search = _serve_search(settings, plan, result, options, work, on_event)
    if search.status == "searched" and search.candidate:
        _served_choice_of_other_kind(result, search)
    point = replace(search.chosen, candidate="") if search.status == "searched" and search.chosen is not None else None
    options = replace(options, served_search=search, operating_point=point)
    on_event(Event("publish", "start", result.selected))
    return search, publish(result, options)


def _padded_max_for_every_load(result: TuneResult, user_max: int | None) -> None:
    """The rules' max for a backend that pads every execution to max_batch_size: the one that holds up at every load
    (find_max_batch_size.every_load_max), not the in-process peak. It is published when no served search chooses, and
    the search starts from it (a short budget may measure only the start); a max the user gave or the samples recorded stays."""
    from optimizer.task.find_max_batch_size import every_load_max

    cand = result.selected_candidate
    platform = cand.artifact.platform if cand.artifact is not None else None
    decision = cand.decision
    if (platform is None or not platform.pads_batch or decision is None or not decision.profiles or user_max is not None
            or decision.decided_by == "recorded" or result.max_batch_size <= 1):
        return
    chosen = every_load_max([p for p in decision.profiles if p.batch_size <= result.max_batch_size])
    if chosen < result.max_batch_size:
        result.selection_reason += (f"; max_batch_size {chosen}, not the in-process peak {result.max_batch_size}: the {platform.backend} backend "
                                    f"computes max_batch_size rows for every execution, and {chosen} is the measured size closest to the best "
                                    "at every load (the served search, when it runs, starts there; --concurrency N tunes it for one load)")
        result.max_batch_size = chosen


def _served_choice_of_other_kind(result: TuneResult, search: ServedSearch) -> None:
    """The served search measured another kind's candidate best under the traffic and load: it is published instead of
    the in-process pick, and the report says why."""
    won = next(c for c in result.candidates if c.name == search.candidate)
    chosen = search.chosen_variant
    how = f" ({chosen.point.label}: {chosen.throughput:.1f}/s at concurrency {chosen.concurrency})" if chosen is not None and chosen.throughput else ""
    result.selection_reason += (f"; the served search then measured {won.name} better than {result.selected} under the traffic and the load "
                                f"it is tuned for{how}, so {won.name} is published")
    result.selected, result.max_batch_size = won.name, won.decision.max_batch_size


def _serve_search(settings: ExportSettings, plan: RunPlan, result: TuneResult, options: PublishOptions, work: Path,
                  on_event: EventSink) -> ServedSearch:
    """The served operating point: measured in the bundled server, or in the user's (--url),
    unless --serve-search off. A candidate the user's server refuses to load is passed over for the next one, with the
    server's own words in the report."""
    if settings.serve_search == "off":
        return ServedSearch(status="off", reason="--serve-search off: the in-process rules stand")
    from optimizer.triton.measure.served_search import SearchRequest, served_search
    from optimizer.triton.measure.served_search.request import LOCAL_PROTOCOL

    rate, rate_max = settings.rate_target()
    budget = settings.serve_search_seconds or max(MIN_SERVE_SEARCH_S, SERVE_SEARCH_SHARE * result.tune_seconds) * (
        RATE_SEARCH_EXTRA if rate is not None or rate_max else 1.0)
    concurrency, load_range = plan.load
    request = SearchRequest(work / "served_search", concurrency, settings.latency_budget_ms, result.percentile, budget, plan.cache_root,
                            user_max=plan.user_max, wait_for_cores_s=settings.wait_for_cores_s, url=settings.url,
                            protocol=settings.protocol if settings.url else LOCAL_PROTOCOL, server_version=plan.server.describe().split(" at ")[0] if plan.server is not None else "",
                            use_cache=settings.cache, load_range=load_range, rate=rate, rate_max=rate_max, arrivals=settings.arrivals,
                            headroom=settings.headroom)
    tried = {result.selected}
    while True:
        search = served_search(result, options, request, on_event)
        following = _next_candidate(result, tried) if search.refused else None
        if search.refused and following is None:
            raise ServerError(f"the Triton at {settings.url} refused every candidate; the last: {result.selected}: {search.reason}. "
                              "Export for another --backend, or serve it on a Triton release that has the backend.")
        if following is None:
            if WRONG_ANSWERS in search.reason:  # published all the same (a stand-in may differ from the native backend): say so
                result.warnings.append(f"{result.selected} was published with the in-process rules, but {search.reason}; "
                                       "check it with `aitune-export validate` (or --url on the Triton you deploy to) before serving it.")
            return search
        refused = result.selected_candidate
        refused.reason = f"{refused.reason}; refused by the Triton at {settings.url}: {search.reason}".lstrip("; ")
        on_event(Event("serve", "progress", refused.name, f"the server at {settings.url} refused it; trying {following.name}"))
        result.selected, result.max_batch_size = following.name, following.decision.max_batch_size
        _padded_max_for_every_load(result, plan.user_max)
        tried.add(following.name)


WRONG_ANSWERS = "its answers are wrong"
"""How the served search's start check words a variant whose answers are not the reference's (served_search/measurer.py)."""


def _next_candidate(result: TuneResult, tried: set[str | None]) -> Any:
    """The fastest passed candidate not tried on the user's server yet (None: none left)."""
    left = [c for c in result.candidates if c.passed and c.name not in tried and c.artifact is not None and c.decision is not None
            and c.decision.profiles]
    return max(left, key=lambda c: c.decision.best.throughput, default=None)
