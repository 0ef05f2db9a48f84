"""The pipeline: load -> signature -> reference -> tune -> publish -> report (-> validate).

It reads as a list of phase calls; each phase lives in its own module.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.backend.precision import check_precision
from optimizer.errors import ConfigRuleError, Interrupted, NoCandidateError, PublishError, SettingsError, TemplateError
from optimizer.events import Event, EventSink, ignore
from optimizer.model.reference import resolve_signature
from optimizer.model.samples import batch_sizes_of, load_npz
from optimizer.model.signature import Signature, parse_input_spec, parse_output_names, parse_value_range
from optimizer.model.source import LoadedModel, from_module, load_model
from optimizer.report.json_report import write_report
from optimizer.report.markdown import write_report_files
from optimizer.settings import ExportSettings
from optimizer.task.cache import ArtifactCache, default_cache_dir
from optimizer.task.correctness import parse_tolerances
from optimizer.task.profiling import ProfileSettings
from optimizer.task.reference_set import prepare_reference
from optimizer.triton.publish import PublishOptions, check_options, publish
from optimizer.triton.repository import Published, check_model_name, check_target_free
from optimizer.tune_strategy import STRATEGIES, TuneResult, TuneStrategy
from optimizer.tune_strategy.context import TuneContext
from optimizer.tune_strategy.multi_backend_strategy import check_backend_names

log = logging.getLogger(__name__)


@dataclass
class ExportOutcome:
    """What a run produced: the tuning result, where the model landed and where the report is."""

    result: TuneResult
    published: Published | None
    report_path: Path
    validation: Any = None


def build_strategy(settings: ExportSettings) -> TuneStrategy:
    """The strategy object the settings describe (all argument errors surface here, before loading)."""
    if settings.strategy not in STRATEGIES:
        raise SettingsError(f"unknown strategy {settings.strategy!r}; choose from: {', '.join(STRATEGIES)}.")
    check_backend_names(settings.backend)
    common: dict[str, Any] = dict(
        eager_gate=settings.eager_gate,
        max_batch_size=settings.max_batch(),
        percentile=int(settings.percentile),
        memory_budget_mb=settings.memory_budget_mb(),
        workflow=settings.workflow,
    )
    cls = STRATEGIES[settings.strategy]
    if settings.strategy == "one-backend":
        if len(settings.backend) != 1:
            raise SettingsError(f"--strategy one-backend needs exactly one --backend, got {len(settings.backend)}.")
        return cls(settings.backend[0], latency_budget_ms=settings.latency_budget_ms, **common)
    if settings.strategy == "latency-budget":
        if settings.latency_budget_ms is None:
            raise SettingsError("--strategy latency-budget needs --latency-budget-ms MS.")
        return cls(budget_ms=settings.latency_budget_ms, backends=settings.backend or None, **common)
    return cls(backends=settings.backend or None, latency_budget_ms=settings.latency_budget_ms, **common)


def parse_model_options(settings: ExportSettings) -> tuple[list, dict, list[str]]:
    """--input, --value-range and --output-names, parsed before the model is loaded."""
    specs = [parse_input_spec(s) for s in settings.input]
    ranges = dict(parse_value_range(s) for s in settings.value_range)
    outputs = parse_output_names(settings.output_names)
    return specs, ranges, outputs


def report_dir_for(settings: ExportSettings, name: str) -> Path:
    """The report folder: --report-dir or aitune-reports/NAME; never inside the repository."""
    path = Path(settings.report_dir) if settings.report_dir else Path("aitune-reports") / name
    repo = Path(settings.repository).resolve()
    if path.resolve() == repo or repo in path.resolve().parents:
        raise SettingsError(f"--report-dir {str(path)!r} is inside the repository {settings.repository!r}; Triton would see it as a model. Put it elsewhere.")
    if path.exists() and not path.is_dir():
        raise SettingsError(f"--report-dir {str(path)!r} is a file; give a folder.")
    return path


def export(settings: ExportSettings | None = None, *, module: Any = None, example_inputs: Any = None, on_event: EventSink = ignore) -> ExportOutcome:
    """Tune MODEL (or `module`) and publish the winner into the repository. See ExportSettings for every option."""
    settings = settings or ExportSettings()
    t0 = time.perf_counter()
    # 1. everything that can be checked without loading the model
    specs, ranges, output_names = parse_model_options(settings)
    tolerances = parse_tolerances(settings.tolerance)
    strategy = build_strategy(settings)
    if settings.device != "cpu" and not settings.device.startswith("cuda"):
        raise SettingsError(f"--device {settings.device!r} is not cpu or cuda[:N].")
    check_precision(settings.precision, settings.device)
    if settings.name:
        check_model_name(settings.name)
    check_options(PublishOptions(Path(settings.repository), settings.name or "model"))
    if settings.samples and not Path(settings.samples).exists():
        raise SettingsError(f"--samples file {settings.samples!r} does not exist; give an .npz with one array per input.")
    if settings.template_dir and not Path(settings.template_dir).is_dir():
        raise SettingsError(f"--template-dir {settings.template_dir!r} is not a directory.")
    if settings.validate:  # a missing tool or a bad range fails now, not after tuning
        from optimizer.triton.perf_analyzer import ConcurrencyRange, find_perf_analyzer
        from optimizer.triton.server import find_triton

        ConcurrencyRange.parse(settings.validate_concurrency)
        find_triton(), find_perf_analyzer()
    if settings.workflow == "jit" and not settings.samples:
        raise SettingsError("--workflow jit measures only the batch sizes recorded in --samples; add --samples FILE.npz.")

    # 2. load
    on_event(Event("load", "start", message=settings.model or "bundled example"))
    model = _load(settings, module, example_inputs)
    name = settings.name or model.name
    check_model_name(name)
    check_target_free(Path(settings.repository), name, settings.version, settings.overwrite)
    report_dir = report_dir_for(settings, name)
    on_event(Event("load", "done", message=f"{model.name} ({model.format})", elapsed_s=time.perf_counter() - t0))

    # 3. signature and reference
    on_event(Event("signature", "start"))
    signature = resolve_signature(model, specs, ranges, output_names, settings.batching)
    user_feeds = load_npz(Path(settings.samples), signature) if settings.samples else []
    on_event(Event("signature", "done", message=_describe(signature)))
    work = report_dir / "work"
    on_event(Event("reference", "start"))
    try:
        reference = prepare_reference(model, signature, user_feeds, report_dir / "samples")
        state_dict = _snapshot_weights(model, work)
    except OSError as err:
        raise SettingsError(f"could not write the report folder {str(report_dir)!r}: {err.strerror or err}; choose another --report-dir.") from err
    on_event(Event("reference", "done", message="; ".join(reference.points)))

    # 4. tune
    ctx = TuneContext(
        model=model,
        signature=signature,
        reference=reference,
        workdir=work,
        device=settings.device,
        precision=settings.precision,
        recorded_batch_sizes=tuple(batch_sizes_of(user_feeds)) if user_feeds and signature.batching else (),
        build_timeout_s=settings.build_timeout_s,
        profile_timeout_s=settings.profile_timeout_s,
        time_budget_s=settings.time_budget_s,
        profile=ProfileSettings(),
        tolerances=tolerances,
        state_dict=state_dict,
        on_event=on_event,
        cache=ArtifactCache(Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()) if settings.cache else None,
    )
    result = strategy.tune(ctx)
    result.model_name = name
    report_path = report_dir / "report.json"
    if result.interrupted:
        write_report(report_path, result, settings)
        raise Interrupted(f"interrupted; candidate processes were stopped, the repository was not changed, partial results are in {report_path}.")
    if result.selected is None:
        write_report(report_path, result, settings)
        write_report_files(report_path)
        raise NoCandidateError(_no_candidate_message(result, report_path))

    # 5. publish, then report
    on_event(Event("publish", "start", result.selected))
    options = PublishOptions(Path(settings.repository), name, settings.version, settings.overwrite, settings.warmup,
                             Path(settings.template_dir) if settings.template_dir else None, report_dir=report_dir)
    try:
        published = publish(result, options)
    except (PublishError, TemplateError, ConfigRuleError):  # the tuning results are kept in the report
        write_report(report_path, result, settings)
        write_report_files(report_path)
        raise
    on_event(Event("publish", "done", result.selected, f"{published.model_dir} version {published.version}"))
    write_report(report_path, result, settings, published)
    rendered = write_report_files(report_path)  # report.md and the plots, beside report.json
    on_event(Event("report", "done", message=f"{report_path} (+ {', '.join(p.name for p in [rendered.markdown, *rendered.plots.values()])})"))
    validation = None
    if settings.validate:  # 6. prove it in a real Triton (validation.json beside report.json)
        from optimizer.triton.validation import validate

        validation = validate(Path(settings.repository), name, concurrency=settings.validate_concurrency, report_dir=report_dir, on_event=on_event)
        write_report_files(report_path)  # again, now with the validation section
    return ExportOutcome(result, published, report_path, validation)


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
        return f"{t.name}:{t.dtype.name}:{'x'.join(map(str, t.axes)) or 'scalar'}"

    return f"inputs {', '.join(one(t) for t in sig.inputs)}; outputs {', '.join(one(t) for t in sig.outputs)}"


def _no_candidate_message(result: TuneResult, report_path: Path) -> str:
    reasons = "; ".join(f"{c.name}: {c.status} ({c.reason})" for c in result.candidates) or "no candidates"
    return f"no candidate can be published ({reasons}). Details in {report_path}."
