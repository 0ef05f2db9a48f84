"""RunPlan: settings turned into checked values, every check made once, before the model is loaded.

`export` and `inspect` both start here, so they agree on the device, the strategy, the candidates'
precision and the tolerances; bad input fails here, in one line, before any work or any write.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.backend import check_named_precision
from optimizer.backend.cuda import check_gpu
from optimizer.backend.precision import check_precision
from optimizer.errors import SettingsError
from optimizer.machine import cache_root
from optimizer.model.signature import InputSpec, parse_input_spec, parse_output_names, parse_value_range
from optimizer.records.accuracy import AccuracyBudget
from optimizer.records.correctness import Tolerance
from optimizer.records.triton_releases import release_named
from optimizer.settings import ExportSettings
from optimizer.task.accuracy_gate import load_check, parse_budget
from optimizer.task.cache import ArtifactCache
from optimizer.task.correctness import parse_tolerances
from optimizer.task.release_gate import ReleaseGate, local_toolchain, onnx_model_versions
from optimizer.triton.repository.atomic import check_model_name, check_version
from optimizer.triton.repository.publish import PublishOptions, check_options, repository_argument
from optimizer.triton.runtime.install import find_triton
from optimizer.triton.runtime.perf_analyzer import ConcurrencyRange, find_perf_analyzer
from optimizer.triton.runtime.remote import ServerFacts, probe_server
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
    server: ServerFacts | None = None  # runtime.remote.ServerFacts of --url (None: the served search runs on the bundled server)
    accuracy: AccuracyBudget = field(default_factory=AccuracyBudget)  # --accuracy-budget and --accuracy-check
    user_max: int | None = None  # --max-batch-size (None: auto)
    load: tuple[int | None, tuple[int, int] | None] = (None, None)  # --concurrency: (one load, None), (None, (low, high)) or neither
    cache: ArtifactCache | None = None  # the artifact cache under cache_root (None: --no-cache)


def check_settings(settings: ExportSettings) -> None:
    """A fleet plan's model checked as its export will check it, before the fleet runs anything: every value, the repository's form
    included. What only the machine that runs the export can answer (its GPU, the bucket, its toolchain against the release) is left to it."""
    plan_run(settings, publishing=False)


def plan_run(settings: ExportSettings, publishing: bool = True) -> RunPlan:
    """Check every setting once and return the plan; `publishing=False` (inspect) skips the publish-side checks
    (and shows a release mismatch of an explicit --backend instead of refusing it).

    Two passes, each from the publishing end of the pipeline down to the vocabulary: first the flags read alone (a bad flag is
    refused in a moment), then what asks the machine (the repository's folder or bucket, the user's server and tools, the
    user's check, the release gate, which imports the toolchain, and the GPU)."""
    # 1. the flags read alone
    if settings.strategy not in STRATEGIES:
        raise SettingsError(f"unknown strategy {settings.strategy!r}; choose from: {', '.join(STRATEGIES)}.")
    if settings.strategy == "one-backend" and len(settings.backend) != 1:
        raise SettingsError(f"--strategy one-backend needs exactly one --backend, got {len(settings.backend)}.")
    if settings.strategy == "latency-budget" and settings.latency_budget_ms is None:
        raise SettingsError("--strategy latency-budget needs --latency-budget-ms MS.")
    check_backend_names(settings.backend)
    repository = repository_argument(settings.repository)
    if publishing:
        if settings.name is not None:
            check_model_name(settings.name)
        check_version(settings.version)  # these two need no model: refused before it loads (seconds sooner)
        if settings.rate is not None and settings.serve_search != "on":
            raise SettingsError(f"--rate {settings.rate} is measured in the served search, and --serve-search off skips it; drop one of them.")
        if settings.url and settings.serve_search != "on":
            raise SettingsError("--url runs the served search on that server, and --serve-search off skips the search; drop one of them.")
        if settings.validate and settings.validate_concurrency != "auto":
            ConcurrencyRange.parse(settings.validate_concurrency)
        if settings.template_dir and not Path(settings.template_dir).is_dir():
            raise SettingsError(f"--template-dir {settings.template_dir!r} is not a directory.")
    tolerances = parse_tolerances(settings.tolerance)
    accuracy = parse_budget(settings.accuracy_budget, settings.accuracy_check)
    check_precision(settings.precision, settings.device, real_samples=bool(settings.samples or settings.calibration_samples))
    if publishing:
        check_named_precision(settings.backend, settings.precision, settings.device)
    input_specs = [parse_input_spec(s) for s in settings.input]
    value_ranges = dict(parse_value_range(s) for s in settings.value_range)
    output_names = parse_output_names(settings.output_names)
    if settings.samples and not Path(settings.samples).exists():
        raise SettingsError(f"--samples file {settings.samples!r} does not exist; give an .npz with one array per input.")
    if settings.calibration_samples and not Path(settings.calibration_samples).exists():
        raise SettingsError(f"--calibration-samples file {settings.calibration_samples!r} does not exist; give an .npz with one array per input.")
    if settings.workflow == "jit" and not settings.samples:
        raise SettingsError("--workflow jit measures only the batch sizes recorded in --samples; add --samples FILE.npz.")
    settings.check_serving()
    load = settings.load()
    common: dict[str, Any] = dict(eager_gate=settings.eager_gate, max_batch_size=settings.batch_cap(), percentile=int(settings.percentile),
                                  memory_budget_mb=settings.memory_budget_mb(), workflow=settings.workflow)
    device = Device.parse(settings.device)
    root = cache_root(settings.cache_dir)

    # 2. what asks the machine
    server = None
    if publishing:
        check_options(PublishOptions(repository, settings.name or "model"))
        if settings.url:  # the user's server: reachable and loading on request, before any tuning
            server = probe_server(settings.url, settings.protocol)
            if server.release and server.release != settings.triton_release:
                log.warning("the server at %s is %s while --triton-release is %s: what it loads decides what is measured there (a candidate "
                            "it refuses is passed over), and the release gate checked %s; give --triton-release %s to gate for this server",
                            settings.url, server.describe(), settings.triton_release, settings.triton_release, server.release)
        if settings.validate:  # a missing tool fails now, not after tuning
            find_triton(), find_perf_analyzer()
    cache = ArtifactCache(root) if settings.cache else None
    if settings.accuracy_check:
        load_check(settings.accuracy_check)  # importable now; whether it answers sensibly is tried on the reference
    model = Path(settings.model) if settings.model else None
    gate = ReleaseGate(  # --triton-release as a gate: the release's row, this machine's toolchain and the run's facts that decide what it loads
        release=release_named(settings.triton_release),
        toolchain=local_toolchain(),
        precision=settings.precision,
        batching=settings.batching,
        device=settings.device,
        onnx_model=onnx_model_versions(model) if model is not None else None,
        allow_mismatch=bool(settings.allow_version_mismatch),
    )
    if publishing:
        gate.check_named(settings.backend)
        if device.is_cuda:
            check_gpu(device)
    cls = STRATEGIES[settings.strategy]
    if settings.strategy == "one-backend":
        strategy = cls(settings.backend[0], latency_budget_ms=settings.latency_budget_ms, release_gate=gate, **common)
    elif settings.strategy == "latency-budget":
        strategy = cls(budget_ms=settings.latency_budget_ms, backends=settings.backend or None, release_gate=gate, **common)
    else:
        strategy = cls(backends=settings.backend or None, latency_budget_ms=settings.latency_budget_ms, release_gate=gate, **common)
    return RunPlan(settings=settings, device=device, strategy=strategy, input_specs=input_specs, value_ranges=value_ranges,
                   output_names=output_names, tolerances=tolerances, cache_root=root, release_gate=gate,
                   repository=repository, server=server, accuracy=accuracy,
                   user_max=common["max_batch_size"], load=load, cache=cache)
