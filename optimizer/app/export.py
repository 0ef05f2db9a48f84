"""The export use case: plan -> load -> signature -> reference -> tune -> publish -> report (-> validate).

It reads as a list of phase calls; each phase lives in its own module.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from optimizer.app.plan import plan_run
from optimizer.errors import (
    ConfigRuleError,
    Interrupted,
    NoCandidateError,
    OptimizerError,
    PublishError,
    ServerError,
    SettingsError,
    TemplateError,
)
from optimizer.events import Event, EventSink, ignore
from optimizer.model.reference import resolve_signature
from optimizer.model.samples import batch_sizes_of, load_npz, save_feeds
from optimizer.model.signature import Signature
from optimizer.model.loaded_model import LoadedModel
from optimizer.model.source import from_module, load_model
from optimizer.model.traffic import traffic_for
from optimizer.records.served_search import ServedSearch
from optimizer.records.tune_result import TuneResult
from optimizer.report.json_report import write_report
from optimizer.report.markdown import write_report_files
from optimizer.settings import ExportSettings
from optimizer.task.cache import ArtifactCache
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


@dataclass
class ExportOutcome:
    """What a run produced: the tuning result, where the model landed and where the report is."""

    result: TuneResult
    published: Published | None
    report_path: Path
    validation: Any = None


def _calibration(settings: ExportSettings, signature: Signature, user_feeds: list[Any], directory: Path) -> str | None:
    """The .npz INT8 candidates are calibrated on: --calibration-samples, else the user's --samples; None when the
    run has only generated inputs (then no INT8 candidate is built)."""
    feeds = load_npz(Path(settings.calibration_samples), signature) if settings.calibration_samples else user_feeds
    if not feeds:
        return None
    path = directory / "calibration.npz"
    save_feeds(path, feeds)
    return str(path)


def check_on_reference(spec: str, reference: Any, names: list[str]) -> None:
    """Call the user's --accuracy-check with the reference as both arguments: one that raises or returns garbage
    is a SettingsError (exit 2) before anything is built."""
    from optimizer.model.samples import load_feeds
    from optimizer.task.accuracy_gate import load_check, run_check

    outputs = [{n: o[n] for n in names} for o in load_feeds(Path(reference.outputs))]
    run_check(load_check(spec), spec, outputs, [dict(o) for o in outputs])


def report_dir_for(settings: ExportSettings, name: str) -> Path:
    """The report folder: --report-dir or aitune-reports/NAME; never inside the repository."""
    path = Path(settings.report_dir) if settings.report_dir else Path("aitune-reports") / name
    return outside_repository(path, Path(settings.repository), "--report-dir")


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
    model = _load(settings, module, example_inputs)
    name = settings.name if settings.name is not None else check_model_name(model.name)  # plan_run checked --name
    check_target(plan.repository, name, settings.version, settings.overwrite, settings.io_names)
    report_dir = report_dir_for(settings, name)
    on_event(Event("load", "done", message=f"{model.name} ({model.format})", elapsed_s=time.perf_counter() - t0))

    # 3. signature and reference
    on_event(Event("signature", "start"))
    signature = resolve_signature(model, plan.input_specs, plan.value_ranges, plan.output_names, settings.batching)
    user_feeds = load_npz(Path(settings.samples), signature) if settings.samples else []
    traffic = traffic_for(signature, settings.traffic, user_feeds, Path(settings.samples).name if settings.samples else None)
    on_event(Event("signature", "done", message=_describe(signature)))
    work = report_dir / "work"
    on_event(Event("reference", "start"))
    try:
        reference = prepare_reference(model, signature, user_feeds, report_dir / "samples", traffic)
        state_dict = _snapshot_weights(model, work)
    except OSError as err:
        raise SettingsError(f"could not write the report folder {str(report_dir)!r}: {err.strerror or err}; choose another --report-dir.") from err
    calibration = _calibration(settings, signature, user_feeds, report_dir / "samples")
    if plan.accuracy.check:  # a check that raises or answers garbage on the reference itself stops the run now
        check_on_reference(plan.accuracy.check, reference, signature.output_names)
    on_event(Event("reference", "done", message="; ".join(reference.points)))

    # 4. tune
    ctx = TuneContext(
        model=model,
        signature=signature,
        reference=reference,
        workdir=work,
        device=plan.device,
        precision=settings.precision,
        recorded_batch_sizes=tuple(batch_sizes_of(user_feeds)) if user_feeds and signature.batching else (),
        build_timeout_s=settings.build_timeout_s,
        profile_timeout_s=settings.profile_timeout_s,
        time_budget_s=settings.time_budget_s,
        profile=ProfileSettings(),
        tolerances=plan.tolerances,
        state_dict=state_dict,
        on_event=on_event,
        cache=ArtifactCache(plan.cache_root) if settings.cache else None,
        cache_root=plan.cache_root,
        accuracy=plan.accuracy,
        calibration=calibration,
    )
    result = strategy.tune(ctx)
    result.traffic = traffic.summary(signature).to_json()
    report_path = report_dir / "report.json"
    stop = _stop_after_tuning(result, name, report_path)

    # 5. serve search and publish (unless tuning ended the run), then the report, written once for every outcome
    published: Published | None = None
    if stop is None:
        options = PublishOptions(plan.repository, name, settings.version, settings.overwrite, settings.warmup,
                                 Path(settings.template_dir) if settings.template_dir else None, report_dir=report_dir,
                                 cache_dir=plan.cache_root, io_names=settings.io_names)
        try:
            search, published = _search_and_publish(result, settings, plan, options, work, on_event)
        except (PublishError, TemplateError, ConfigRuleError) as err:  # the tuning results are kept in the report
            stop = _Stop(err, render=True)
        else:
            on_event(Event("publish", "done", result.selected, f"{published.model_dir} version {published.version}"))
            from optimizer.fleet.manifests import record_manifests

            record_manifests(report_dir, published, settings.triton_release)  # kserve/inferenceservice.yaml beside the report
    rendered = _write_report(report_path, result, settings, published, render=stop is None or stop.render)
    if stop is not None:
        raise stop.error
    on_event(Event("report", "done", message=f"{report_path} (+ {', '.join(p.name for p in [rendered.markdown, *rendered.plots.values()])})"))
    validation = None
    if settings.validate:  # 6. prove it in a real Triton (validation.json beside report.json)
        from optimizer.triton.measure.validation import validate

        validation = validate(plan.repository, name, concurrency=settings.validate_concurrency, report_dir=report_dir,
                              on_event=on_event, cache_dir=plan.cache_root, protocol=search.protocol or "http")  # like the search
        write_report_files(report_path)  # again, now with the validation section
    return ExportOutcome(result, published, report_path, validation)


@dataclass
class _Stop:
    """Why a tuned run publishes nothing: the error the export raises once the report is written, and whether report.md
    and the plots are rendered for it (not for a failed accuracy check or an interruption)."""

    error: OptimizerError
    render: bool


def _stop_after_tuning(result: TuneResult, name: str, report_path: Path) -> _Stop | None:
    """A failed accuracy check, an interruption or no publishable candidate ends the run (None: publish). Once the
    accuracy check passed, the result takes the published name `name`."""
    broken = next((c for c in result.candidates if c.stage == "accuracy_check"), None)
    if broken is not None:  # the user's check failed on a candidate's outputs: nothing is published
        return _Stop(SettingsError(broken.reason), render=False)
    result.model_name = name
    if result.interrupted:
        return _Stop(Interrupted(f"interrupted; candidate processes were stopped, the repository was not changed, partial results are in {report_path}."),
                     render=False)
    if result.selected is None:
        return _Stop(NoCandidateError(_no_candidate_message(result, report_path)), render=True)
    return None


def _search_and_publish(result: TuneResult, settings: ExportSettings, plan: Any, options: PublishOptions, work: Path,
                        on_event: EventSink) -> tuple[ServedSearch, Published]:
    """The served search from the rules' operating point, then the model published at the point it chose."""
    _padded_max_for_every_load(result, settings)  # the rules' point: what is published when no search runs, and where one starts
    search = _serve_search(settings, plan, result, options, work, on_event)
    if search.status == "searched" and search.candidate:
        _served_choice_of_other_kind(result, search)
    point = replace(search.chosen, candidate="") if search.status == "searched" and search.chosen is not None else None
    options = replace(options, served_search=search, operating_point=point)
    on_event(Event("publish", "start", result.selected))
    return search, publish(result, options)


def _write_report(report_path: Path, result: TuneResult, settings: ExportSettings, published: Published | None, render: bool) -> Any:
    """The one writer of report.json, for every way a tuned run ends; report.md and the plots beside it when `render`."""
    write_report(report_path, result, settings, published)
    return write_report_files(report_path) if render else None


def _padded_max_for_every_load(result: TuneResult, settings: ExportSettings) -> None:
    """The rules' max for a backend that pads every execution to max_batch_size: the one that holds up at every load
    (find_max_batch_size.every_load_max), not the in-process peak. It is published when no served search chooses, and
    the search starts from it (a short budget may measure only the start); a max the user gave or the samples recorded stays."""
    from optimizer.task.find_max_batch_size import every_load_max

    cand = result.selected_candidate
    platform = cand.artifact.platform if cand.artifact is not None else None
    decision = cand.decision
    if (platform is None or not platform.pads_batch or decision is None or not decision.profiles or settings.batch_cap() is not None
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


def _serve_search(settings: ExportSettings, plan: Any, result: TuneResult, options: PublishOptions, work: Path,
                  on_event: EventSink) -> ServedSearch:
    """The served operating point: measured in the bundled server, or in the user's (--url),
    unless --serve-search off. A candidate the user's server refuses to load is passed over for the next one, with the
    server's own words in the report."""
    if settings.serve_search == "off":
        return ServedSearch(status="off", reason="--serve-search off: the in-process rules stand")
    from optimizer.triton.measure.served_search import SearchRequest, served_search
    from optimizer.triton.measure.served_search.request import LOCAL_PROTOCOL

    budget = settings.serve_search_seconds or max(MIN_SERVE_SEARCH_S, SERVE_SEARCH_SHARE * result.tune_seconds)
    concurrency, load_range = settings.load()
    request = SearchRequest(work / "served_search", concurrency, settings.latency_budget_ms, result.percentile, budget, plan.cache_root,
                            user_max=settings.batch_cap(), wait_for_cores_s=settings.wait_for_cores_s, url=settings.url,
                            protocol=settings.protocol if settings.url else LOCAL_PROTOCOL, server_version=plan.server.describe().split(" at ")[0] if plan.server is not None else "",
                            use_cache=settings.cache, load_range=load_range)
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
        _padded_max_for_every_load(result, settings)
        tried.add(following.name)


WRONG_ANSWERS = "its answers are wrong"
"""How the served search's start check words a variant whose answers are not the reference's (served_search/measurer.py)."""


def _next_candidate(result: TuneResult, tried: set[str | None]) -> Any:
    """The fastest passed candidate not tried on the user's server yet (None: none left)."""
    left = [c for c in result.candidates if c.passed and c.name not in tried and c.artifact is not None and c.decision is not None
            and c.decision.profiles]
    return max(left, key=lambda c: c.decision.best.throughput, default=None)


def _load(settings: ExportSettings, module: Any, example_inputs: Any) -> LoadedModel:
    if module is not None:
        if settings.model:
            raise SettingsError("give either a MODEL string or a module, not both.")
        return from_module(module, example_inputs, Path(settings.report_dir or "aitune-reports") / ".source", settings.name)
    return load_model(settings.model)


def _snapshot_weights(model: LoadedModel, work: Path) -> str | None:
    """Callable sources are rebuilt in each candidate's process; this makes their weights identical to ours."""
    if model.source.kind != "callable" or model.module is None:
        return None
    import torch

    work.mkdir(parents=True, exist_ok=True)
    path = work / "state_dict.pt"
    try:
        torch.save(model.inner_module.state_dict(), path)
    except RuntimeError as err:  # torch reports a failed write (a full disk) as RuntimeError
        raise OSError(28, f"writing the weights snapshot failed ({err})", str(path)) from err
    return str(path)


def _describe(sig: Signature) -> str:
    def one(t) -> str:
        return f"{t.name}:{t.dtype.name}:{'x'.join(map(str, t.axes)) or 'scalar'}" + (f" ({t.origin})" if t.origin else "")

    return f"inputs {', '.join(one(t) for t in sig.inputs)}; outputs {', '.join(one(t) for t in sig.outputs)}"


def _no_candidate_message(result: TuneResult, report_path: Path) -> str:
    reasons = "; ".join(f"{c.name}: {c.status} ({c.reason})" for c in result.candidates) or "no candidates"
    return f"no candidate can be published ({reasons}). Details in {report_path}."
