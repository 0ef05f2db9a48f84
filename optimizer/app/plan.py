"""RunPlan: settings turned into checked values, every check made once, before the model is loaded.

`export` and `inspect` both start here, so they agree on the device, the strategy, the candidates'
precision and the tolerances; bad input fails here, in one line, before any work or any write.
"""

from __future__ import annotations

import logging

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.backend import backend_named
from optimizer.backend.precision import check_precision, refusal
from optimizer.errors import SettingsError
from optimizer.machine import cache_root
from optimizer.model.signature import InputSpec, parse_input_spec, parse_output_names, parse_value_range
from optimizer.records.accuracy import AccuracyBudget
from optimizer.records.correctness import Tolerance
from optimizer.records.triton_releases import release_named
from optimizer.settings import ExportSettings
from optimizer.task.accuracy_gate import load_check, parse_budget
from optimizer.task.correctness import parse_tolerances
from optimizer.task.release_gate import ReleaseGate, local_toolchain, onnx_model_versions
from optimizer.triton.repository.publish import PublishOptions, check_options, repository_argument
from optimizer.triton.repository.atomic import check_model_name, check_version
from optimizer.tune_strategy import STRATEGIES, TuneStrategy
from optimizer.tune_strategy.multi_backend_strategy import check_backend_names
from optimizer.vocab import Device

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """The settings as values the pipeline uses directly: no later step parses a flag again."""

    settings: ExportSettings
    device: Device
    strategy: TuneStrategy
    input_specs: list[InputSpec] = field(default_factory=list)
    value_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    output_names: list[str] = field(default_factory=list)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    cache_root: Path = field(default_factory=cache_root)
    release_gate: ReleaseGate | None = None  # --triton-release against this machine's toolchain
    repository: Path | str = Path("model_repository")  # --repository parsed once: a folder, or the s3:// URL as text
    server: Any = None  # triton.remote.ServerFacts of --url (None: the served search runs on the bundled server)
    accuracy: AccuracyBudget = field(default_factory=AccuracyBudget)  # --accuracy-budget and --accuracy-check


def build_release_gate(settings: ExportSettings) -> ReleaseGate:
    """--triton-release as a gate: the release's row, this machine's toolchain and the run's facts that decide what it loads."""
    model = Path(settings.model) if settings.model else None
    return ReleaseGate(
        release=release_named(settings.triton_release),
        toolchain=local_toolchain(),
        precision=settings.precision,
        batching=settings.batching,
        device=settings.device,
        onnx_model=onnx_model_versions(model) if model is not None else None,
        allow_mismatch=bool(settings.allow_version_mismatch),
    )


def _check_explicit_backends(settings: ExportSettings, gate: ReleaseGate) -> None:
    """An explicit --backend the target release cannot load is refused now, in one line naming both versions and the fix."""
    precision = settings.precision if settings.precision != "auto" else "fp32"  # auto's other precisions are checked as candidates
    kind = Device.parse(settings.device).kind
    for name in settings.backend:
        backend = backend_named(name).for_run(precision)
        builds = backend.precisions.get(kind, frozenset({"fp32"}))
        if kind in backend.devices and precision not in builds:  # named on purpose: refused now, not after the other candidates ran
            raise SettingsError(refusal(name, kind, precision, builds))
        if gate.onnx_model is not None and "onnx" not in backend.consumes:
            continue  # it cannot build from an ONNX model at all; screening says so
        check = gate.refusal(backend)
        if check is not None:
            raise SettingsError(f"--triton-release {gate.release.release}: {check.message()}")


def build_strategy(settings: ExportSettings, release_gate: ReleaseGate | None = None) -> TuneStrategy:
    """The strategy object the settings describe (all argument errors surface here, before loading)."""
    if settings.strategy not in STRATEGIES:
        raise SettingsError(f"unknown strategy {settings.strategy!r}; choose from: {', '.join(STRATEGIES)}.")
    check_backend_names(settings.backend)
    common: dict[str, Any] = dict(
        eager_gate=settings.eager_gate,
        max_batch_size=settings.batch_cap(),
        percentile=int(settings.percentile),
        memory_budget_mb=settings.memory_budget_mb(),
        workflow=settings.workflow,
        release_gate=release_gate,
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


def _check_gpu(device: Device) -> None:
    """--device cuda on a machine with no GPU at all fails now, not after every candidate was tried."""
    from optimizer.backend.cuda import torch_cuda_availability

    seen = torch_cuda_availability(str(device))
    if seen.ok:
        return
    driver = Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/gpus").is_dir()
    if not driver or "does not exist" in seen.reason:
        where = "" if "does not exist" in seen.reason else " and no NVIDIA driver is loaded"
        raise SettingsError(f"--device {device}: {seen.reason.rstrip('.')}{where}; use --device cpu, or run on a machine with that GPU.")


def check_settings(settings: ExportSettings) -> None:
    """A fleet plan's model checked as its export will check it, before the fleet runs anything: every value, the repository's form
    included. What only the machine that runs the export can answer (its GPU, the bucket, its toolchain against the release) is left to it."""
    plan_run(settings, publishing=False)


def plan_run(settings: ExportSettings, publishing: bool = True) -> RunPlan:
    """Check every setting once and return the plan; `publishing=False` (inspect) skips the publish-side checks
    (and shows a release mismatch of an explicit --backend instead of refusing it)."""
    device = Device.parse(settings.device)
    # the checks that read only the settings first: a bad flag is refused before the release gate imports the toolchain (torch)
    settings.check_serving()
    if settings.samples and not Path(settings.samples).exists():
        raise SettingsError(f"--samples file {settings.samples!r} does not exist; give an .npz with one array per input.")
    if settings.calibration_samples and not Path(settings.calibration_samples).exists():
        raise SettingsError(f"--calibration-samples file {settings.calibration_samples!r} does not exist; give an .npz with one array per input.")
    if settings.workflow == "jit" and not settings.samples:
        raise SettingsError("--workflow jit measures only the batch sizes recorded in --samples; add --samples FILE.npz.")
    gate = build_release_gate(settings)
    plan = RunPlan(
        settings=settings,
        device=device,
        strategy=build_strategy(settings, gate),
        input_specs=[parse_input_spec(s) for s in settings.input],
        value_ranges=dict(parse_value_range(s) for s in settings.value_range),
        output_names=parse_output_names(settings.output_names),
        tolerances=parse_tolerances(settings.tolerance),
        cache_root=cache_root(settings.cache_dir),
        release_gate=gate,
        repository=repository_argument(settings.repository),
        accuracy=parse_budget(settings.accuracy_budget, settings.accuracy_check),
    )
    check_precision(settings.precision, plan.device, real_samples=bool(settings.samples or settings.calibration_samples))
    if settings.accuracy_check:
        load_check(settings.accuracy_check)  # importable now; whether it answers sensibly is tried on the reference
    if not publishing:
        return plan
    _check_explicit_backends(settings, gate)
    if plan.device.is_cuda:
        _check_gpu(plan.device)
    if settings.name is not None:
        check_model_name(settings.name)
    check_version(settings.version)  # these two need no model: refused before it loads (seconds sooner)
    settings.batch_cap()
    check_options(PublishOptions(plan.repository, settings.name or "model"))
    if settings.template_dir and not Path(settings.template_dir).is_dir():
        raise SettingsError(f"--template-dir {settings.template_dir!r} is not a directory.")
    if settings.url and settings.serve_search == "on":  # the user's server: reachable and loading on request, before any tuning
        from optimizer.triton.runtime.remote import probe_server

        plan.server = probe_server(settings.url, settings.protocol)
        if plan.server.release and plan.server.release != settings.triton_release:
            log.warning("the server at %s is %s while --triton-release is %s: what it loads decides what is measured there (a candidate "
                        "it refuses is passed over), and the release gate checked %s; give --triton-release %s to gate for this server",
                        settings.url, plan.server.describe(), settings.triton_release, settings.triton_release, plan.server.release)
    elif settings.url:
        raise SettingsError("--url runs the served search on that server, and --serve-search off skips the search; drop one of them.")
    if settings.validate:  # a missing tool or a bad range fails now, not after tuning
        from optimizer.triton.runtime.perf_analyzer import ConcurrencyRange, find_perf_analyzer
        from optimizer.triton.runtime.install import find_triton

        if settings.validate_concurrency != "auto":
            ConcurrencyRange.parse(settings.validate_concurrency)
        find_triton(), find_perf_analyzer()
    return plan
