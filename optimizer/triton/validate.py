"""`aitune-export validate`: prove a published model in a real Triton before anyone deploys it.

Loads the model into a real tritonserver (a local one started on the repository, or a running one
at --url), sends the samples saved at export time over HTTP and gRPC and compares the answers with
the eager reference (the optimizer's own tolerances), checks that a batch above max_batch_size is
refused, and measures a concurrency sweep with perf_analyzer on real samples, set against the
throughput the optimizer predicted. The outcome is one plain record, written as validation.json
into the export's report folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.records.triton_platforms import PLATFORMS
from optimizer.events import Event, EventSink, ignore
from optimizer.errors import RepositoryError, SettingsError, TemplateError, ValidationError
from optimizer.model.dtypes import dtype_from_name
from optimizer.model.samples import Feed, load_feeds, tile_feed
from optimizer.records.correctness import CorrectnessCase, Tolerance
from optimizer.task.correctness import compare_outputs
from optimizer.triton.perf_analyzer import ConcurrencyRange, PerfAnalyzerFailed, PerfSettings, run_perf_analyzer, write_input_data
from optimizer.triton.server import LocalTritonServer, ServerHome, find_triton, open_client, prepare_home, triton_message

log = logging.getLogger(__name__)

STAND_IN_LABEL = "stand-in backend"
"""Every result served by a stand-in carries this label, in the CLI output and in validation.json."""

PERF_INPUT_FILENAME = "perf_analyzer_input.json"
VALIDATION_FILENAME = "validation.json"
STATUSES = ("passed", "failed", "not validated")
WINDOW_REQUESTS = 20
"""perf_analyzer windows are sized to hold about this many requests at concurrency 1."""
MAX_WINDOW_MS = 6000
BUSY_SHARE = 0.25
"""Above this share of the CPU taken by other processes during the export's measurement, the ratio gets a note."""

_UNKNOWN_TO_TRITON_2_51 = frozenset({"torch_aoti"})
"""Platforms Triton 2.51's core rejects before any backend is asked (the local server is 2.51)."""


# -- what is being validated ---------------------------------------------------------------------
@dataclass
class ModelTarget:
    """One model in a repository: its folder and the parsed config.pbtxt."""

    repository: Path
    name: str
    config: Any  # tritonclient.grpc.model_config_pb2.ModelConfig

    @property
    def platform(self) -> str:
        return self.config.platform or self.config.backend

    @property
    def backend(self) -> str:
        """The backend Triton resolves the config to (the backends/<name> folder it looks in)."""
        if self.config.backend:
            return self.config.backend
        for row in PLATFORMS.values():
            if row.platform == self.config.platform:
                return row.backend
        return self.config.platform.split("_")[0]


def resolve_target(repository: Path, model: str | None) -> ModelTarget:
    """REPO and --model -> the model to validate. REPO may also be a model folder (one holding config.pbtxt)."""
    from optimizer.triton.model_config import parse

    repository = Path(repository)
    if not repository.is_dir():
        raise RepositoryError(f"REPO {str(repository)!r} is not a directory; give the Triton model repository the export published into.")
    if model is None and (repository / "config.pbtxt").is_file():
        repository, model = repository.resolve().parent, repository.resolve().name
    models = sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())
    if model is None:
        if len(models) != 1:
            listing = ", ".join(models) if models else "none"
            raise RepositoryError(f"{str(repository)!r} holds {len(models)} models ({listing}); choose one with --model NAME.")
        model = models[0]
    if model not in models:
        raise RepositoryError(f"model {model!r} is not in {str(repository)!r} (no {model}/config.pbtxt); models there: {', '.join(models) or 'none'}.")
    path = repository / model / "config.pbtxt"
    try:
        config = parse(path.read_text(), str(path))
    except TemplateError as err:
        raise RepositoryError(str(err)) from err
    return ModelTarget(repository.resolve(), model, config)


@dataclass
class ExportReference:
    """What the export left for validation: the report folder, the samples and reference outputs, the prediction."""

    report_dir: Path
    feeds: Path
    outputs: Path
    points: list[str]
    candidate: str
    predicted_throughput: float | None
    predicted_batch: int | None
    predicted_busy: float | None = None  # share of the CPU other processes used while the prediction was measured
    tolerances: dict[str, Any] = field(default_factory=dict)  # output (or "") -> Tolerance, as the export checked
    input_names: list[str] = field(default_factory=list)  # the exported tensor names, in order
    output_names: list[str] = field(default_factory=list)


def find_export_report(target: ModelTarget, hint: Path | None = None) -> Path | None:
    """The report.json of the export that published this model: in `hint` (--report), else the one under
    aitune-reports/*/ or any */ of the working directory or the repository's parent that names this model
    folder as published (the export's --report-dir default, or a custom one beside the repository)."""
    if hint is not None and (hint / "report.json").is_file():
        return hint / "report.json"
    model_dir = (target.repository / target.name).resolve()
    matches: set[Path] = set()
    for base in (Path.cwd(), target.repository.parent):
        for path in [*base.glob("aitune-reports/*/report.json"), *base.glob("*/report.json")]:
            try:
                published = json.loads(path.read_text()).get("published") or {}
            except (OSError, ValueError):
                continue
            if published.get("model_dir") and Path(published["model_dir"]).resolve() == model_dir:
                matches.add(path.resolve())
    # several exports may have published this folder (--overwrite, another --report-dir): the latest one wrote it
    return max(matches, key=lambda p: (p.stat().st_mtime_ns, str(p)), default=None)


def load_export_reference(report_path: Path) -> ExportReference:
    """The samples, reference outputs and predicted throughput recorded in an export's report.json."""
    try:
        doc = json.loads(report_path.read_text())
        result = doc["result"]
        ref = result["reference"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RepositoryError(f"{str(report_path)!r} is not an aitune-export report ({type(err).__name__}: {err}); point --report at the export's report folder.") from err
    report_dir = report_path.parent
    chosen = next((c for c in result.get("candidates", []) if c.get("name") == result.get("selected")), None)
    profiles = ((chosen or {}).get("decision") or {}).get("profiles") or []
    best = max(profiles, key=lambda p: p["throughput"], default=None)
    return ExportReference(
        report_dir=report_dir,
        feeds=_find_sample_file(ref["feeds"], report_dir),
        outputs=_find_sample_file(ref["outputs"], report_dir),
        points=list(ref.get("points") or []),
        candidate=result.get("selected") or "",
        predicted_throughput=best["throughput"] if best else None,
        predicted_batch=best["batch_size"] if best else None,
        predicted_busy=best.get("others_cpu_share") if best else None,
        tolerances={name: Tolerance(*pair) for name, pair in (result.get("tolerances") or {}).items()},
        input_names=[t["name"] for t in result.get("signature", {}).get("inputs", [])],
        output_names=[t["name"] for t in result.get("signature", {}).get("outputs", [])],
    )


def _find_sample_file(recorded: str, report_dir: Path) -> Path:
    """Report paths are relative to where the export ran; fall back to the report's own samples/ folder."""
    path = Path(recorded)
    for candidate in (path, report_dir / "samples" / path.name):
        if candidate.is_file():
            return candidate
    raise RepositoryError(f"the export's sample file {recorded!r} is gone (also not in {str(report_dir / 'samples')!r}); re-run the export.")


def output_folder(target: ModelTarget, report_dir: Path | None, export_report: Path | None) -> Path:
    """--report, else the export's report folder, else <repository's parent>/aitune-reports/NAME; never inside the repository."""
    if report_dir is not None:
        folder = Path(report_dir)
    elif export_report is not None:
        folder = export_report.parent
    else:
        folder = target.repository.parent / "aitune-reports" / target.name
    resolved = folder.resolve()
    if resolved == target.repository or target.repository in resolved.parents:
        raise SettingsError(f"--report {str(folder)!r} is inside the repository {str(target.repository)!r}; Triton would see it as a model. Put it elsewhere.")
    if folder.exists() and not folder.is_dir():
        raise SettingsError(f"--report {str(folder)!r} is a file; give a folder.")
    return folder


# -- the record ----------------------------------------------------------------------------------
@dataclass
class AnswerCheck:
    """The answers over one protocol, compared with the eager reference at every saved sample."""

    protocol: str
    passed: bool
    cases: list[dict[str, Any]] = field(default_factory=list)
    max_abs: float = 0.0
    max_rel: float = 0.0
    error: str = ""
    compared_with: str = "reference"  # "reference" (eager outputs) or "none" (no export report: shapes only)


@dataclass
class ValidationRecord:
    """Everything one validation found; plain data (validation.json)."""

    model: str
    repository: str
    server: str
    platform: str
    backend: str
    status: str = "failed"
    reason: str = ""
    served_by: str = ""  # "native backend", or STAND_IN_LABEL + what ran
    stand_in: bool = False
    loaded: bool = False
    load_s: float | None = None
    served_config: dict[str, Any] = field(default_factory=dict)
    answers: list[AnswerCheck] = field(default_factory=list)
    oversize: dict[str, Any] | None = None
    perf: dict[str, Any] | None = None
    server_batch: float | None = None  # inference count / execution count over the whole sweep
    predicted_throughput: float | None = None
    predicted_batch: int | None = None
    predicted_by: str = ""
    throughput_ratio: float | None = None
    export_report: str | None = None
    output_dir: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def raise_for_status(self) -> None:
        """ValidationError (exit status 1) unless the model loaded, answered correctly and was measured."""
        if self.status != "passed":
            raise ValidationError(f"{self.model}: {self.status}: {self.reason}")

    def write(self, folder: Path) -> Path:
        """validation.json, written atomically (concurrent validations of one model never interleave)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / VALIDATION_FILENAME
        self.output_dir = str(folder)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f".{VALIDATION_FILENAME}.", delete=False) as tmp:
            json.dump(self.to_json(), tmp, indent=2, default=str)
        os.replace(tmp.name, path)
        return path


# -- orchestration -------------------------------------------------------------------------------
def validate(
    repository: Path,
    model: str | None = None,
    *,
    url: str | None = None,
    protocol: str = "http",
    concurrency: str = "1:8",
    report_dir: Path | None = None,
    perf_settings: PerfSettings | None = None,
    on_event: EventSink = ignore,
) -> ValidationRecord:
    """Validate one model of `repository`; returns the record (also written as validation.json).

    Args:
        url: HOST:PORT of a running Triton speaking `protocol`; None starts a LocalTritonServer on `repository`.
        protocol: what perf_analyzer (and, with `url`, the answer check) uses; a local server is also
            checked over the other protocol.
        concurrency: perf_analyzer's sweep, START:END[:STEP].
        report_dir: where validation.json goes, and where the export's report.json is looked for first.
        on_event: progress ("validate" phase events: start, progress per check, done or failed).

    Raises:
        RepositoryError / SettingsError (exit 2) for a bad REPO, --model or option; ValidationError when
        a tool is missing. A model that fails a check is a record with status "failed", not an exception:
        call `raise_for_status()`.
    """
    if protocol not in ("http", "grpc"):
        raise SettingsError(f"--protocol {protocol!r} is not http or grpc.")
    settings = perf_settings or PerfSettings(concurrency=ConcurrencyRange.parse(concurrency), protocol=protocol)
    target = resolve_target(repository, model)
    report_path = find_export_report(target, Path(report_dir) if report_dir else None)
    reference = load_export_reference(report_path) if report_path else None
    folder = output_folder(target, report_dir, report_path)
    t0 = time.monotonic()
    record = ValidationRecord(
        model=target.name,
        repository=str(target.repository),
        server=url or "local tritonserver",
        platform=target.platform,
        backend=target.backend,
        export_report=str(report_path) if report_path else None,
        predicted_throughput=reference.predicted_throughput if reference else None,
        predicted_batch=reference.predicted_batch if reference else None,
        predicted_by=reference.candidate if reference else "",
    )
    if reference is None:
        record.notes.append("no export report found for this model: answers are checked for shape and dtype only, "
                            "and there is no predicted throughput; pass --report DIR (the export's report folder) to compare.")
    on_event(Event("validate", "start", target.name, record.server if url else "starting a local tritonserver"))
    with tempfile.TemporaryDirectory(prefix="aitune-validate-") as tmp:
        work = Path(tmp)
        try:
            if url is None:
                home = prepare_home(find_triton())
                reason = local_servability(target, home)
                if reason:
                    record.status, record.reason = "not validated", reason
                else:
                    record.stand_in = target.backend in home.stand_ins()
                    with LocalTritonServer(target.repository, log_path=work / "tritonserver.log", home=home) as server:
                        record.server = f"local tritonserver {_server_version(server)} at {server.http_url} (http) / {server.grpc_url} (grpc)"
                        clients = {"http": server.client("http"), "grpc": server.client("grpc")}
                        urls = {"http": server.http_url, "grpc": server.grpc_url}
                        _run_checks(record, target, reference, clients, urls, settings, folder, work, lambda: server.load(target.name), on_event)
            else:
                client = open_client(protocol, url)
                try:
                    _run_checks(record, target, reference, {protocol: client}, {protocol: url}, settings, folder, work,
                                lambda: _load_remote(client, target.name), on_event)
                finally:
                    client.close()
        finally:
            record.seconds = round(time.monotonic() - t0, 2)
            _keep_logs(work, folder, record)
    path = record.write(folder)
    on_event(Event("validate", "done" if record.passed else "failed", target.name, f"{record.status}: {path}", elapsed_s=record.seconds))
    return record


def local_servability(target: ModelTarget, home: ServerHome) -> str:
    """Why the local CPU server cannot serve this model at all ("" when it can try)."""
    config = target.config
    if target.platform in _UNKNOWN_TO_TRITON_2_51:
        return f"platform {target.platform!r} is unknown to the core of the local tritonserver (2.51); validate it against a Triton release that serves it (--url HOST:PORT)."
    if target.backend == "tensorrt":
        return "a TensorRT plan needs TensorRT and a GPU, which the local server has neither of; validate it on a GPU machine with --url HOST:PORT."
    kinds = {g.kind for g in config.instance_group}
    from tritonclient.grpc import model_config_pb2

    if model_config_pb2.ModelInstanceGroup.KIND_GPU in kinds:
        if not _has_gpu():
            return "its instance_group is KIND_GPU and this machine has no GPU; validate it on a GPU machine with --url HOST:PORT."
        if target.backend in home.stand_ins():
            return (f"its instance_group is KIND_GPU and the local {target.backend} stand-in backend runs on the CPU; "
                    "validate it against a Triton with the native backend (--url HOST:PORT).")
    if target.backend not in home.native_backends() | home.stand_ins():
        return (f"the local server has no {target.backend!r} backend (neither libtriton_{target.backend}.so nor a stand-in "
                f"in optimizer/triton/standin_backends/{target.backend}/); validate it against a Triton that has one (--url HOST:PORT).")
    return ""


def _has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


def _run_checks(record: ValidationRecord, target: ModelTarget, reference: ExportReference | None, clients: dict[str, Any],
                urls: dict[str, str], settings: PerfSettings, folder: Path, work: Path, load: Any, on_event: EventSink) -> None:
    """Load, answer, oversize, perf: each failure is recorded with its own words and ends the checks."""
    from tritonclient.utils import InferenceServerException

    t0 = time.monotonic()
    try:
        load()
    except ValidationError as err:
        record.status, record.reason = "failed", str(err)
        return
    record.loaded, record.load_s = True, round(time.monotonic() - t0, 2)
    on_event(Event("validate", "progress", target.name, f"loaded in {record.load_s:.1f} s"))
    any_client = clients.get("http") or clients[settings.protocol]
    served = _served_config(any_client, target.name)
    record.served_config = _config_summary(served)
    runtime = str(served.get("runtime") or "")  # Triton reports "model.py" for a Python-based backend
    record.stand_in = runtime.endswith(".py") and (served.get("backend") or "") != "python"
    record.served_by = (f"{STAND_IN_LABEL}: Triton's python backend runs backends/{served.get('backend')}/model.py "
                        f"with pip packages, not the native C++ backend" if record.stand_in else "native backend")
    feeds, expected, points = reference_feeds(reference, served)
    for protocol, client in clients.items():
        record.answers.append(check_answers(client, protocol, target.name, served, feeds, expected, points,
                                            reference.tolerances if reference is not None else None))
    bad = [a for a in record.answers if not a.passed]
    if bad:
        record.status = "failed"
        record.reason = f"answers over {bad[0].protocol} differ from the reference: {bad[0].error}"
        return
    record.oversize = check_oversize(any_client, target.name, served, feeds[0])
    if record.oversize is not None and not record.oversize["refused"]:
        record.status, record.reason = "failed", record.oversize["note"]
        return
    input_data = write_input_data(folder / PERF_INPUT_FILENAME, feeds, _max_batch(served) > 0)
    on_event(Event("validate", "progress", target.name, f"answers match; perf_analyzer at concurrency {settings.concurrency}"))
    stats_client = clients.get(settings.protocol) or any_client
    before = _execution_counts(stats_client, target.name)
    settings = replace(settings, measurement_interval_ms=window_for(settings, _request_ms(stats_client, target.name)))
    try:
        perf = run_perf_analyzer(target.name, urls[settings.protocol], input_data, work / "perf_analyzer", settings)
    except PerfAnalyzerFailed as err:
        record.perf = err.result.to_json()
        record.status, record.reason = "failed", str(err)
        return
    except ValidationError as err:
        record.status, record.reason = "failed", str(err)
        return
    except InferenceServerException as err:  # the server died under load
        record.status, record.reason = "failed", f"Triton stopped answering during perf_analyzer: {triton_message(err)}"
        return
    after = _execution_counts(stats_client, target.name)
    record.perf = perf.to_json()
    if perf.note:
        record.notes.append(f"perf_analyzer: {perf.note}")
    if before and after and after[1] > before[1]:
        record.server_batch = round((after[0] - before[0]) / (after[1] - before[1]), 3)
    best = perf.best
    if best and record.predicted_throughput:
        record.throughput_ratio = round(best.throughput / record.predicted_throughput, 3)
        if reference is not None and reference.predicted_busy is not None and reference.predicted_busy > BUSY_SHARE:
            record.notes.append(f"the predicted {record.predicted_throughput:.1f} infer/s was measured while other processes used "
                                f"{reference.predicted_busy:.0%} of the CPU; the ratio mixes that contention with serving overhead.")
    record.status = "passed"
    label = f" ({STAND_IN_LABEL})" if record.stand_in else ""
    record.reason = (f"loaded, answers match over {', '.join(a.protocol for a in record.answers)}, "
                     f"best {best.throughput:.1f} infer/s at concurrency {best.concurrency}{label}" if best else "loaded and answered")


def _load_remote(client: Any, name: str) -> None:
    """A running server: use the model if it is ready, else ask the server to load it (explicit mode only)."""
    from tritonclient.utils import InferenceServerException

    try:
        if client.is_model_ready(name):
            return
        client.load_model(name)
    except InferenceServerException as err:
        raise ValidationError(f"Triton could not load model {name!r}: {triton_message(err)}") from err
    if not client.is_model_ready(name):
        raise ValidationError(f"model {name!r} is not ready on the server after loading.")


def _server_version(server: LocalTritonServer) -> str:
    try:
        return str(server.client("http").get_server_metadata().get("version", "2.51"))
    except Exception as err:  # metadata is cosmetic: never fail a validation over it
        log.debug("server metadata: %s", err)
        return "2.51"


def _served_config(client: Any, name: str) -> dict[str, Any]:
    """The config Triton actually serves (after its auto-completion), as a dict."""
    config = client.get_model_config(name) if _is_http(client) else client.get_model_config(name, as_json=True)
    return config.get("config", config)


def _config_summary(served: dict[str, Any]) -> dict[str, Any]:
    keys = ("platform", "backend", "runtime", "max_batch_size", "dynamic_batching", "instance_group", "parameters")
    return {k: served.get(k) for k in keys if served.get(k) not in (None, "", {}, [])}


def _max_batch(served: dict[str, Any]) -> int:
    return int(served.get("max_batch_size") or 0)


def _is_http(client: Any) -> bool:
    return type(client).__module__.startswith("tritonclient.http")


# -- answers -------------------------------------------------------------------------------------
def served_names(reference: ExportReference, served: dict[str, Any]) -> dict[str, str]:
    """Exported tensor name -> the name the served config uses (they differ on positional platforms such as torch_aoti)."""
    platform = PLATFORMS.get(served.get("platform") or served.get("backend") or "")
    if platform is None or not platform.positional_io:
        return {}
    return {**{n: f"INPUT__{i}" for i, n in enumerate(reference.input_names)},
            **{n: f"OUTPUT__{i}" for i, n in enumerate(reference.output_names)}}


def reference_feeds(reference: ExportReference | None, served: dict[str, Any]) -> tuple[list[Feed], list[Feed] | None, list[str]]:
    """The export's feeds and reference outputs, or (no report) one feed made from the config's dims."""
    if reference is not None:
        feeds, outputs = load_feeds(reference.feeds), load_feeds(reference.outputs)
        points = reference.points if len(reference.points) == len(feeds) else [f"sample[{i}]" for i in range(len(feeds))]
        rename = served_names(reference, served)
        feeds = [{rename.get(k, k): a for k, a in f.items()} for f in feeds]
        outputs = [{rename.get(k, k): a for k, a in o.items()} for o in outputs]
        return feeds, outputs, points
    batching = _max_batch(served) > 0
    rng = np.random.default_rng(0)
    feed = {}
    for spec in served.get("input", []):
        dims = [1 if int(d) < 0 else int(d) for d in spec.get("dims", [])]
        shape = ([1] if batching else []) + dims
        dt = dtype_from_name(spec["data_type"])
        feed[spec["name"]] = rng.standard_normal(shape).astype(dt.numpy) if dt.is_float else np.zeros(shape, dt.numpy)
    return [feed], None, ["generated from config"]


def infer(client: Any, name: str, served: dict[str, Any], feed: Feed) -> list[np.ndarray]:
    """One request; outputs in the config's order. Raises tritonclient's InferenceServerException."""
    if _is_http(client):
        import tritonclient.http as tc
    else:
        import tritonclient.grpc as tc  # type: ignore[no-redef]
    inputs = []
    for spec in served.get("input", []):
        arr = np.ascontiguousarray(feed[spec["name"]])
        item = tc.InferInput(spec["name"], list(arr.shape), dtype_from_name(spec["data_type"]).triton_wire)
        item.set_data_from_numpy(arr)
        inputs.append(item)
    names = [o["name"] for o in served.get("output", [])]
    result = client.infer(name, inputs, outputs=[tc.InferRequestedOutput(n) for n in names])
    return [result.as_numpy(n) for n in names]


def infer_batched(client: Any, name: str, served: dict[str, Any], feed: Feed) -> list[np.ndarray]:
    """A feed larger than max_batch_size is sent in allowed slices and the answers concatenated."""
    mbs = _max_batch(served)
    rows = next(iter(feed.values())).shape[0] if mbs > 0 else 0
    if mbs <= 0 or rows <= mbs:
        return infer(client, name, served, feed)
    parts = [infer(client, name, served, {k: v[i:i + mbs] for k, v in feed.items()}) for i in range(0, rows, mbs)]
    return [np.concatenate(chunks) for chunks in zip(*parts)]


def check_answers(client: Any, protocol: str, name: str, served: dict[str, Any], feeds: list[Feed],
                  expected: list[Feed] | None, points: list[str], tolerances: dict[str, Any] | None = None) -> AnswerCheck:
    """Send every saved sample and compare with the eager reference (same tolerances as the optimizer)."""
    from tritonclient.utils import InferenceServerException

    outputs = served.get("output", [])
    names = [o["name"] for o in outputs]
    dtypes = [dtype_from_name(o["data_type"]).name for o in outputs]
    check = AnswerCheck(protocol, True, compared_with="reference" if expected is not None else "none")
    for i, feed in enumerate(feeds):
        point = points[i] if i < len(points) else f"sample[{i}]"
        try:
            actual = infer_batched(client, name, served, feed)
        except InferenceServerException as err:
            check.passed, check.error = False, f"at {point}, Triton answered: {triton_message(err)}"
            return check
        if expected is None:
            case = _shape_case(point, names, dtypes, actual, feed, served)
        else:
            missing = [n for n in names if n not in expected[i]]
            if missing:
                check.passed, check.error = False, f"the served outputs {names} are not the exported ones {sorted(expected[i])}"
                return check
            case = compare_outputs(point, names, dtypes, actual, [expected[i][n] for n in names], tolerances)
        check.cases.append({"point": case.point, "passed": case.passed, "outputs": [asdict(o) for o in case.outputs]})
        finite = [o for o in case.outputs if o.shape_ok]
        check.max_abs = max([check.max_abs, *(o.max_abs for o in finite)])
        check.max_rel = max([check.max_rel, *(o.max_rel for o in finite)])
        if not case.passed and check.passed:
            worst = next(o for o in case.outputs if not o.passed)
            detail = worst.note or f"max abs error {worst.max_abs:.3g}, max rel error {worst.max_rel:.3g} (atol {worst.atol:g}, rtol {worst.rtol:g})"
            check.passed, check.error = False, f"output {worst.name!r} at {point}: {detail}"
    return check


def _shape_case(point: str, names: list[str], dtypes: list[str], actual: list[np.ndarray], feed: Feed, served: dict[str, Any]) -> CorrectnessCase:
    """Without a reference: every output has the config's dtype and dims (batch axis = the request's)."""
    from optimizer.records.correctness import OutputError

    batch = [next(iter(feed.values())).shape[0]] if _max_batch(served) > 0 else []
    results = []
    for spec, name, dtype, arr in zip(served.get("output", []), names, dtypes, actual):
        dims = batch + [int(d) for d in spec.get("dims", [])]
        ok = arr.dtype.name == dtype and len(arr.shape) == len(dims) and all(d < 0 or d == s for d, s in zip(dims, arr.shape))
        note = "" if ok else f"{arr.dtype.name}{list(arr.shape)}, config says {dtype}{dims}"
        results.append(OutputError(name, ok, 0.0, 0.0, 0.0, 0.0, ok, note))
    return CorrectnessCase(point, results)


def check_oversize(client: Any, name: str, served: dict[str, Any], feed: Feed) -> dict[str, Any] | None:
    """A request of max_batch_size + 1 must be refused (None for a model that does not batch)."""
    from tritonclient.utils import InferenceServerException

    mbs = _max_batch(served)
    if mbs <= 0:
        return None
    batch = mbs + 1
    try:
        infer(client, name, served, tile_feed(feed, batch))
    except InferenceServerException as err:
        return {"batch": batch, "refused": True, "message": triton_message(err), "note": ""}
    return {"batch": batch, "refused": False, "message": "",
            "note": f"a batch of {batch} was accepted although max_batch_size is {mbs}; the config does not limit what clients may send."}


def _statistics(client: Any, name: str) -> dict[str, Any] | None:
    try:
        stats = client.get_inference_statistics(name) if _is_http(client) else client.get_inference_statistics(name, as_json=True)
        return stats["model_stats"][0]
    except Exception as err:  # statistics are extra information; their absence is not a failed check
        log.debug("statistics of %s: %s", name, err)
        return None


def _request_ms(client: Any, name: str) -> float | None:
    """The server's mean request latency so far (the answer checks), from its statistics API."""
    success = ((_statistics(client, name) or {}).get("inference_stats") or {}).get("success") or {}
    count, ns = int(success.get("count", 0) or 0), int(success.get("ns", 0) or 0)
    return ns / count / 1e6 if count else None


def window_for(settings: PerfSettings, request_ms: float | None) -> int:
    """A perf_analyzer window long enough for about WINDOW_REQUESTS requests at concurrency 1 (a slow model
    needs longer windows to settle), never shorter than the settings' own, at most MAX_WINDOW_MS."""
    if not request_ms:
        return settings.measurement_interval_ms
    wanted = int(round(WINDOW_REQUESTS * request_ms / 100.0)) * 100
    return max(settings.measurement_interval_ms, min(MAX_WINDOW_MS, wanted))


def _execution_counts(client: Any, name: str) -> tuple[int, int] | None:
    """(inference count, execution count) from the server's statistics API."""
    entry = _statistics(client, name)
    return (int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0))) if entry else None


def _keep_logs(work: Path, folder: Path, record: ValidationRecord) -> None:
    """Copy the server and perf_analyzer logs next to validation.json (atomically: concurrent runs never mix lines)."""
    logs = [work / "tritonserver.log", *sorted((work / "perf_analyzer").glob("*.log")), *sorted((work / "perf_analyzer").glob("*.csv"))]
    for src in logs:
        if not src.is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{src.name}.")
        os.close(fd)
        shutil.copyfile(src, tmp)
        os.replace(tmp, folder / src.name)
