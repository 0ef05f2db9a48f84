"""What the export left for validation: its report.json, the saved samples and reference outputs, the predicted throughput."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.errors import PublishError, RepositoryError, SettingsError, SignatureError
from optimizer.model.signature import Signature
from optimizer.records.accuracy import AccuracyBudget
from optimizer.records.correctness import Tolerance, tolerances_from_json
from optimizer.records.report_file import read_report
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch
from optimizer.triton.measure.answers import accuracy_gate_of
from optimizer.triton.measure.target import ModelTarget


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
    tolerances: dict[str, Tolerance] = field(default_factory=dict)  # output (or "") -> Tolerance, as the export checked
    input_names: list[str] = field(default_factory=list)  # the exported tensor names, in order
    output_names: list[str] = field(default_factory=list)
    profile_feed: Path | None = None  # the request mix in-process profiling and the served search timed
    predicted_concurrency: int | None = None  # the served search's concurrency (None: an in-process prediction)
    predicted_how: str = ""  # where the prediction comes from, in words
    predicted_cores: str = ""  # "1 of 2 cores" (in-process) or "every core while ..." when others' load shared the export's measurements
    served_curve: list[LoadLevel] = field(default_factory=list)  # what the served search measured of the published config, per load
    served_point: OperatingPoint | None = None  # that config's batcher and layout (its queue delay is part of the prediction)
    served_pads: bool = False  # its backend computes max_batch_size rows for every execution (openvino)
    single_request_ms: float | None = None  # the server's cost per request + the in-process time of a batch of one
    served_protocol: str = ""  # what the served search measured over ("" before it was recorded)
    accuracy: AccuracyBudget | None = None  # the gate a bf16 / INT8 winner passed (None: fp32, judged by the tolerances)
    traffic: Path | None = None  # the run's traffic (batch-1 requests), which the served search measured
    traffic_words: str = ""  # where it came from (report.json's traffic.origin)
    client_padding: dict[str, Any] | None = None  # clients pad to these bucket edges (the served search advised it)
    signature: dict[str, Any] = field(default_factory=dict)  # the exported signature (which axes are dynamic)
    capacity: dict[str, Any] | None = None  # report.json's `capacity`: the rate the published config was found to hold
    trace_ms: tuple[float, ...] | None = None  # the traffic's timestamps when it is a trace (in the order of `traffic`)


def find_export_report(target: ModelTarget, hint: Path | None = None) -> Path | None:
    """The report.json of the export that published this model: in `hint` (--report), else the one under
    aitune-reports/*/ or any */ of the working directory or the repository's parent that names this model
    folder as published (the export's --report-dir default, or a custom one beside the repository)."""
    if hint is not None and (hint / "report.json").is_file():
        return hint / "report.json"
    model_dir = _model_key(f"{target.repository}/{target.name}") if target.remote else (Path(target.repository) / target.name).resolve()
    matches: set[Path] = set()
    for base in (Path.cwd(),) if target.remote else (Path.cwd(), Path(target.repository).parent):
        for path in [*base.glob("aitune-reports/*/report.json"), *base.glob("*/report.json")]:
            try:
                published = json.loads(path.read_text()).get("published") or {}
            except (OSError, ValueError):
                continue
            recorded = published.get("model_dir")
            if recorded and (_model_key(recorded) if target.remote else Path(recorded).resolve()) == model_dir:
                matches.add(path.resolve())
    # several exports may have published this folder (--overwrite, another --report-dir): the latest one wrote it
    return max(matches, key=lambda p: (p.stat().st_mtime_ns, str(p)), default=None)


def _model_key(model_url: str) -> tuple[str, str] | None:
    """An s3:// model URL as (bucket, key): the same model whether the URL names the endpoint or the environment does."""
    from optimizer.triton.repository.object_store.location import parse_location, store_url

    if store_url(model_url) is None:
        return None
    try:
        location = parse_location(model_url)
    except SettingsError:
        return None
    return location.bucket, location.prefix


def load_export_reference(report_path: Path) -> ExportReference:
    """The samples, reference outputs and predicted throughput recorded in an export's report.json."""
    try:
        result, _, doc = read_report(report_path)
        signature = Signature.from_json(result.signature)
    except (OSError, SettingsError, SignatureError) as err:
        cause = err.__cause__ if isinstance(err, SettingsError) and err.__cause__ is not None else err
        raise RepositoryError(f"{str(report_path)!r} is not an aitune-export report ({type(cause).__name__}: {cause}); "
                              "point --report at the export's report folder.") from err
    try:
        decision = result.selected_candidate.decision
    except PublishError:  # nothing was selected: the samples are still there, there is no prediction
        decision = None
    best = decision.best if decision is not None and decision.profiles else None
    report_dir = report_path.parent
    search = ServedSearch.from_json(ss) if (ss := (doc.get("published") or {}).get("served_search")) else None
    served = search.chosen_variant if search is not None and search.status == "searched" and search.predicted_throughput else None
    reference = ExportReference(
        report_dir=report_dir,
        feeds=_find_sample_file(result.reference.feeds, report_dir),
        outputs=_find_sample_file(result.reference.outputs, report_dir),
        points=list(result.reference.points or []),
        candidate=result.selected or "",
        predicted_throughput=best.throughput if best else None,
        predicted_batch=best.batch_size if best else None,
        predicted_busy=best.others_cpu_share if best else None,
        tolerances=tolerances_from_json(result.tolerances),
        accuracy=accuracy_gate_of(result),
        input_names=signature.input_names,
        output_names=signature.output_names,
        profile_feed=_optional_sample_file(result.reference.profile_feed, report_dir),
        predicted_how=f"in-process at batch {best.batch_size}" if best else "",
        traffic=_optional_sample_file(result.reference.traffic, report_dir) if result.reference.traffic else None,
        traffic_words=(result.traffic or {}).get("origin", ""),
        client_padding=search.client_padding if search is not None and search.padded else None,
        signature=result.signature,
        capacity=doc.get("capacity") or None,
    )
    if reference.traffic is not None:
        from optimizer.model.traffic import load_timestamps

        reference.trace_ms = load_timestamps(reference.traffic)
    if served is None and result.measured_on and len(result.measured_on["cores"]) < len(result.measured_on["available"]):
        reference.predicted_cores = f"{len(result.measured_on['cores'])} of {len(result.measured_on['available'])} cores"
    if search is not None and served is not None:
        cost = f" + the server's {search.per_request_ms:.3f} ms per request" if search.per_request_ms is not None else ""
        inproc = f"in-process {search.in_process_throughput:.1f}/s at the batch the server formed{cost}; " if search.in_process_throughput else ""
        reference.predicted_throughput = search.predicted_throughput
        reference.predicted_batch = round(served.server_batch) if served.server_batch else served.point.max_batch_size
        reference.predicted_concurrency = search.concurrency
        reference.predicted_how = (f"{inproc}measured by the served search at concurrency {search.concurrency}"
                                   + (" (stand-in backend)" if search.stand_in else ""))
        curve: dict[int, LoadLevel] = {}
        for v in search.variants:  # every measurement of the published point, the latest per load
            if v.point == search.chosen and v.status == "measured" and v.traffic == ("padded" if search.padded else ""):
                curve.update({lv.concurrency: lv for lv in v.curve})
        reference.served_curve = [curve[c] for c in sorted(curve)]
        reference.served_point = search.chosen
        won = next((c for c in result.candidates if c.name == search.candidate), None) if search.candidate else None
        artifact = (won or result.selected_candidate).artifact
        reference.served_pads = bool(artifact is not None and artifact.platform is not None and artifact.platform.pads_batch)
        reference.served_protocol = search.protocol
        if search.beside_load and search.measured_on:
            reference.predicted_cores = (f"every core while other processes kept {float(search.measured_on['others_busy']):.1f} of "
                                         f"{len(search.measured_on['available'])} busy")
        one = decision.profile_at(1) if decision is not None else None
        if search.per_request_ms is not None and one is not None:
            reference.single_request_ms = search.per_request_ms + one.mean_ms
    return reference


def _optional_sample_file(recorded: str, report_dir: Path) -> Path | None:
    try:
        return _find_sample_file(recorded, report_dir)
    except RepositoryError:
        return None


def _find_sample_file(recorded: str, report_dir: Path) -> Path:
    """The report's own samples/ folder first: a recorded path is relative to where that export ran, so read against
    the current folder it can be another export's file (the quick start's `make export` writes one at the same path).
    An absolute recorded path is the fallback (samples written outside the report folder)."""
    path = Path(recorded)
    for candidate in (report_dir / "samples" / path.name, *([path] if path.is_absolute() else [])):
        if candidate.is_file():
            return candidate
    raise RepositoryError(f"the export's sample file {recorded!r} is gone (also not in {str(report_dir / 'samples')!r}); re-run the export.")
