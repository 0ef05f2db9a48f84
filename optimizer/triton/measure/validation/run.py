"""The `validate` orchestration: start or reach a server, run the checks in order, keep the logs, write the record."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from optimizer.errors import SettingsError, ValidationError
from optimizer.events import Event, EventSink, ignore
from optimizer.model.samples import load_feeds
from optimizer.triton.runtime.local_serving import local_config, needs_translation, private_model, translation_note
from optimizer.triton.config.model_config import canonical
from optimizer.triton.runtime.perf_analyzer import LOCAL_PROTOCOL, ConcurrencyRange, PerfAnalyzerFailed, PerfSettings, run_perf_analyzer
from optimizer.triton.runtime.perf_analyzer_input import write_input_data
from optimizer.triton.runtime.install import find_triton, homes_root, prepare_home
from optimizer.triton.runtime.server import LocalTritonServer, open_client, triton_message
from optimizer.triton.measure.answers import check_answers
from optimizer.triton.measure.validation.checks import check_oversize, padding_words, reference_feeds, served_names, window_for
from optimizer.triton.measure.client import (config_summary, execution_counts, load_remote, max_batch, ready_versions, request_ms,
                                                response_cache_enabled, served_config, server_version)
from optimizer.triton.measure.validation.expectation import ExportReference, find_export_report, load_export_reference
from optimizer.triton.measure.validation.record import STAND_IN_LABEL, ValidationRecord
from optimizer.triton.measure.validation.open_loop import OPEN_LOOP_WINDOW_MS, OpenLoopAsk, check_open_loop, load_user_traffic
from optimizer.triton.measure.target import ModelTarget, composing_targets, local_servability, output_folder, resolve_target

PERF_INPUT_FILENAME = "perf_analyzer_input.json"
BUSY_SHARE = 0.25
"""Above this share of the CPU taken by other processes during the export's measurement, the ratio gets a note."""


def validate(
    repository: Path | str,
    model: str | None = None,
    *,
    url: str | None = None,
    protocol: str | None = None,
    concurrency: str | None = None,
    measurement_interval_ms: int | None = None,
    report_dir: Path | None = None,
    perf_settings: PerfSettings | None = None,
    on_event: EventSink = ignore,
    cache_dir: str | Path | None = None,
    rate: float | None = None,
    latency_budget_ms: float | None = None,
    arrivals: str | None = None,
    traffic: Path | str | None = None,
    rate_window_ms: int = OPEN_LOOP_WINDOW_MS,
) -> ValidationRecord:
    """Validate one model of `repository`; returns the record (also written as validation.json).

    Args:
        repository: a model repository folder, or an s3:// URL (a local server then reads the model from object storage).
        url: HOST:PORT of a running Triton speaking `protocol`; None starts a LocalTritonServer on `repository`.
        protocol: what perf_analyzer (and, with `url`, the answer check) uses; a local server is also
            checked over the other protocol. None: with `url` http, else the protocol the export's served search
            measured over (gRPC locally), so the prediction is compared like with like.
        concurrency: perf_analyzer's sweep, START:END[:STEP]; None or "auto": 1:8, or four levels up to the
            export's served-search concurrency when the export measured one (so the prediction is compared there).
        measurement_interval_ms: perf_analyzer's shortest window (-p; checks.window_for lengthens it for a slow model);
            None: PerfSettings' default.
        report_dir: where validation.json goes, and where the export's report.json is looked for first.
        on_event: progress ("validate" phase events: start, progress per check, done or failed).
        cache_dir: the run's cache root (--cache-dir); the local server's home is prepared under it (None: machine.cache_root()).
        rate: measure open-loop at this many requests per second (held: p<percentile> within `latency_budget_ms`, else
            throughput alone); None: 0.8x and 1.0x the export's claimed capacity when report.json has one (open_loop.py).
        latency_budget_ms: the budget a rate is held within (None: the claim's, else throughput only).
        arrivals: "poisson" or "constant" (None: the trace's own schedule when the traffic has timestamps, else the claim's).
        traffic: a perf_analyzer --input-data file whose requests are sent instead of the export's (its timestamps, if
            any, are the open-loop schedule: at its own mean rate, or scaled to `rate`).
        rate_window_ms: each open-loop rate is measured over three windows this long.

    Raises:
        RepositoryError / SettingsError (exit 2) for a bad REPO, --model or option; ValidationError when
        a tool is missing. A model that fails a check is a record with status "failed", not an exception:
        call `raise_for_status()`.
    """
    if protocol not in (None, "http", "grpc"):
        raise SettingsError(f"--protocol {protocol!r} is not http or grpc.")
    if concurrency not in (None, "auto"):
        ConcurrencyRange.parse(concurrency)  # a bad range fails before any work
    ask = OpenLoopAsk(rate, arrivals, latency_budget_ms, rate_window_ms)
    ask.check()
    target = resolve_target(repository, model)
    report_path = find_export_report(target, Path(report_dir) if report_dir else None)
    reference = load_export_reference(report_path) if report_path else None
    user_traffic = load_user_traffic(Path(traffic), reference, target) if traffic else None  # a bad file: exit 2, nothing written
    sweep = default_sweep(reference) if concurrency in (None, "auto") else ConcurrencyRange.parse(concurrency)
    protocol = protocol or default_protocol(reference, url)
    settings = perf_settings or PerfSettings(concurrency=sweep, protocol=protocol)
    if measurement_interval_ms is not None:
        settings = replace(settings, measurement_interval_ms=measurement_interval_ms)
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
        predicted_how=reference.predicted_how if reference else "",
        predicted_concurrency=reference.predicted_concurrency if reference else None,
    )
    if reference is None:
        record.notes.append("no export report found for this model: answers are checked for shape and dtype only, "
                            "and there is no predicted throughput; pass --report DIR (the export's report folder) to compare.")
    on_event(Event("validate", "start", target.name, record.server if url else "starting a local tritonserver"))
    with tempfile.TemporaryDirectory(prefix="aitune-validate-") as tmp:
        work = Path(tmp)
        try:
            if url is None:
                home = prepare_home(find_triton(), homes_root(cache_dir))
                incomplete = incomplete_publish(target)
                served = _locally_servable(target, work, record) if not incomplete else target
                reason = local_servability(served, home)
                if incomplete or reason:
                    record.status, record.reason = ("failed", incomplete) if incomplete else ("not validated", reason)
                else:
                    record.stand_in = served.backend in home.stand_ins()
                    where, env = served.repository, None
                    if served.remote:  # Triton's own S3 client reads the model, with the credentials boto3 resolved
                        where, env = served.store.triton_url(), served.store.triton_environment()
                        record.notes.append(f"served from object storage: tritonserver --model-repository {where}")
                    with LocalTritonServer(where, log_path=work / "tritonserver.log", home=home, env=env) as server:
                        record.server = f"local tritonserver {server_version(server)} at {server.http_url} (http) / {server.grpc_url} (grpc)"
                        clients = {"http": server.client("http"), "grpc": server.client("grpc")}
                        urls = {"http": server.http_url, "grpc": server.grpc_url}
                        _run_checks(record, target, reference, clients, urls, settings, folder, work, lambda: server.load(target.name), on_event,
                                    (ask, user_traffic))
            else:
                client = open_client(protocol, url)
                try:
                    _run_checks(record, target, reference, {protocol: client}, {protocol: url}, settings, folder, work,
                                lambda: load_remote(client, target.name), on_event, (ask, user_traffic))
                finally:
                    client.close()
        finally:
            record.seconds = round(time.monotonic() - t0, 2)
            _keep_logs(work, folder, record)
    path = record.write(folder)
    on_event(Event("validate", "done" if record.passed else "failed", target.name, f"{record.status}: {path}", elapsed_s=record.seconds))
    return record


def default_protocol(reference: ExportReference | None, url: str | None) -> str:
    """The protocol of a sweep nobody named: a --url port is taken to speak HTTP (Triton's first port); a local server is
    measured as the export's served search measured it, so the prediction is compared like with like (LOCAL_PROTOCOL)."""
    if url is not None:
        return "http"
    return (reference.served_protocol if reference is not None else "") or LOCAL_PROTOCOL


def _run_checks(record: ValidationRecord, target: ModelTarget, reference: ExportReference | None, clients: dict[str, Any],
                urls: dict[str, str], settings: PerfSettings, folder: Path, work: Path, load: Any, on_event: EventSink,
                open_loop: tuple[OpenLoopAsk, Any] = (OpenLoopAsk(), None)) -> None:
    """Load, answer, oversize, perf (closed-loop), then open-loop when a rate is asked or claimed: each failure is
    recorded with its own words and ends the checks."""
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
    served = served_config(any_client, target.name)
    record.served_config = config_summary(served)
    versions = ready_versions(any_client, target.name)
    if len(versions) > 1:
        record.notes.append(f"versions {', '.join(map(str, versions))} of {target.name} are served (its version_policy); the answer "
                            f"checks and perf_analyzer send requests without a version, which reach version {versions[-1]}: the "
                            "others loaded but were not checked")
    if response_cache_enabled(served):
        record.notes.append("the config enables response_cache, but this server runs without a cache (tritonserver --cache-config): "
                            "throughput is measured uncached; behind a cache, perf_analyzer's repeated rows would be answered from it")
    if target.completed:
        record.notes.append(f"{target.name} has no config.pbtxt: Triton completed one from the model file (max_batch_size "
                            f"{int(served.get('max_batch_size') or 0)}, {len(served.get('input') or [])} input(s), "
                            f"{len(served.get('output') or [])} output(s)), and that config is what was validated; "
                            f"`curl HOST:8000/v2/models/{target.name}/config` prints it to keep")
    steps = [s.get("model_name") for s in (served.get("ensemble_scheduling") or {}).get("step", [])]
    runs = {step: served_config(any_client, step) for step in steps} or {target.name: served}  # what runs the model: an ensemble's steps
    # Triton reports runtime "model.py" for a Python-based backend: a stand-in unless the backend is python itself
    stand_ins = {n: c.get("backend") for n, c in runs.items() if str(c.get("runtime") or "").endswith(".py") and (c.get("backend") or "") != "python"}
    record.stand_in = bool(stand_ins)
    record.served_by = (f"{STAND_IN_LABEL}: Triton's python backend runs "
                        f"{', '.join(f'backends/{b}/model.py' for b in sorted(set(stand_ins.values())))} with pip packages, not the "
                        "native C++ backend" if record.stand_in else "native backend")
    if len(steps) == 1:
        record.served_by = f"the ensemble {target.name!r} (the forward names) in front of {steps[0]!r}; {record.served_by}"
    elif steps and stand_ins:
        record.served_by = f"the ensemble {target.name!r}, whose step(s) {', '.join(map(repr, stand_ins))} run on a {record.served_by}"
    stats_name = steps[0] if len(steps) == 1 else target.name  # the batches the server formed are the step model's
    if (served.get("model_transaction_policy") or {}).get("decoupled"):
        record.status, record.reason = "not validated", (
            "the model is decoupled (model_transaction_policy { decoupled: true }): Triton answers it over gRPC streaming "
            "only, which validate does not drive yet; measure it with perf_analyzer -i grpc --streaming")
        return
    feeds, expected, points = reference_feeds(reference, served)
    for protocol, client in clients.items():
        record.answers.append(check_answers(client, protocol, target.name, served, feeds, expected, points,
                                            reference.tolerances if reference is not None else None,
                                            reference.accuracy if reference is not None else None))
    bad = [a for a in record.answers if not a.passed]
    if bad:
        record.status = "failed"
        against = "the reference" if bad[0].compared_with == "reference" else "the config's shapes and dtypes"
        record.reason = f"answers over {bad[0].protocol} do not match {against}: {bad[0].error}"
        return
    record.oversize = check_oversize(any_client, target.name, served, feeds[0])
    if record.oversize is not None and not record.oversize["refused"]:
        record.status, record.reason = "failed", record.oversize["note"]
        return
    ask, user_traffic = open_loop
    if user_traffic is not None:
        rename = served_names(reference, served) if reference is not None else {}
        mix = [{rename.get(k, k): a for k, a in feed.items()} for feed in user_traffic.sent()]
        record.traffic = f"{user_traffic.origin} ({len(mix)} of {len(user_traffic.requests)} requests)"
    else:
        mix = _request_mix(reference, served)
        record.traffic = _traffic_words(reference) if mix else "the export's samples"
    input_data = write_input_data(folder / PERF_INPUT_FILENAME, mix or feeds, max_batch(served) > 0)
    on_event(Event("validate", "progress", target.name, f"answers match; perf_analyzer at concurrency {settings.concurrency}"))
    stats_client = clients.get(settings.protocol) or any_client
    before = execution_counts(stats_client, stats_name)
    settings = replace(settings, measurement_interval_ms=window_for(settings, request_ms(stats_client, target.name)))
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
    after = execution_counts(stats_client, stats_name)
    record.perf = perf.to_json()
    if perf.note:
        record.notes.append(f"perf_analyzer: {perf.note}")
    if before and after and after[1] > before[1]:
        record.server_batch = round((after[0] - before[0]) / (after[1] - before[1]), 3)
    best = perf.best
    compared = next((r for r in perf.rows if r.concurrency == record.predicted_concurrency), best)
    if reference is not None and reference.served_curve:
        _compare_with_curve(record, reference, perf.rows)
    elif compared and record.predicted_throughput:
        record.throughput_ratio = round(compared.throughput / record.predicted_throughput, 3)
    if record.predicted_throughput:
        if reference is not None and reference.predicted_busy is not None and reference.predicted_busy > BUSY_SHARE:
            record.notes.append(f"the predicted {record.predicted_throughput:.1f} infer/s was measured while other processes used "
                                f"{reference.predicted_busy:.0%} of the CPU; the ratio mixes that contention with serving overhead.")
        if reference is not None and reference.predicted_cores:
            record.notes.append(f"the predicted {record.predicted_throughput:.1f} infer/s was measured on {reference.predicted_cores} "
                                "during the export; the ratio compares it with this server as it is now.")
    record.status = "passed"
    label = f" ({STAND_IN_LABEL})" if record.stand_in else ""
    record.reason = (f"loaded, answers match over {', '.join(a.protocol for a in record.answers)}, "
                     f"best {best.throughput:.1f} infer/s closed-loop at {best.concurrency} client{'s' if best.concurrency != 1 else ''}{label}"
                     if best else "loaded and answered")
    check_open_loop(record, target, reference, served, ask, user_traffic, input_data, urls[settings.protocol], settings.protocol, folder, work, on_event)


def _compare_with_curve(record: ValidationRecord, reference: ExportReference, rows: list[Any]) -> None:
    """Served against predicted at each load the served search did not measure (a prediction that can fail), and against
    the search's own measurement at each load it did (repeatability: the same config at the same load, reported apart)."""
    from optimizer.triton.measure.prediction import predict_throughput

    measured = {lv.concurrency: lv for lv in reference.served_curve}
    for row in rows:
        if row.concurrency in measured:
            searched = measured[row.concurrency].throughput
            record.repeatability.append({"concurrency": row.concurrency, "searched": round(searched, 2), "served": round(row.throughput, 2),
                                         "ratio": round(row.throughput / searched, 3)})
            continue
        predicted = predict_throughput(reference.served_curve, row.concurrency, reference.single_request_ms, reference.served_point,
                                       reference.served_pads)
        if predicted:
            record.predictions.append({"concurrency": row.concurrency, "predicted": round(predicted, 2), "served": round(row.throughput, 2),
                                       "ratio": round(row.throughput / predicted, 3)})
    protocol = record.perf.get("settings", {}).get("protocol", "") if record.perf else ""
    if reference.served_protocol and protocol and protocol != reference.served_protocol and (record.predictions or record.repeatability):
        record.notes.append(f"the served search measured over {reference.served_protocol} and this sweep over {protocol}: the ratios include "
                            f"the difference between the protocols (--protocol {reference.served_protocol} compares like with like)")
    if record.predictions:
        ratios = [p["ratio"] for p in record.predictions]
        record.throughput_ratio = round(math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 3)
        record.predicted_how += ("; predicted at the loads the search did not measure from its curve"
                                 + (" and one request's cost" if reference.single_request_ms else "")
                                 + (f" (with the batcher's {reference.served_point.queue_delay_us} us wait where batches cannot fill)"
                                    if reference.served_point and reference.served_point.queue_delay_us else "")
                                 + padding_words(reference))
    else:
        record.notes.append("every load of this sweep was measured by the served search: only repeatability is reported; "
                            "sweep other concurrencies (--concurrency) to test the prediction")


def _locally_servable(target: ModelTarget, work: Path, record: ValidationRecord) -> ModelTarget:
    """The target itself, or (a platform the local core does not know) a private translated copy of it; a model in object
    storage is downloaded for that copy (the stand-in reads the translated config beside the files). An ensemble whose
    step needs translation is copied beside its translated step, unchanged."""
    if target.config.platform == "ensemble":
        steps = composing_targets(target)
        if not any(needs_translation(t.config) for t in steps):
            return target
        served = [_locally_servable(t, work, record) for t in steps]
        repository = work / "repository"
        for step, copy in zip(steps, served):
            if copy.repository != repository:  # a step the core knows: linked (downloaded from object storage) as it is
                source = Path(step.repository) / step.name if not step.remote else step.store.download(step.name, work / "download" / step.name)
                private_model(source, repository, step.name, canonical(step.config))
        source = Path(target.repository) / target.name if not target.remote else target.store.download(target.name, work / "download" / target.name)
        private_model(source, repository, target.name, canonical(target.config))
        return ModelTarget(repository, target.name, target.config)
    if not needs_translation(target.config):
        return target
    config = local_config(target.config)
    repository = work / "repository"
    source = Path(target.repository) / target.name if not target.remote else target.store.download(target.name, work / "download" / target.name)
    private_model(source, repository, target.name, canonical(config))
    record.notes.append(translation_note(target.config))
    if target.remote:
        record.notes.append(f"the model was downloaded from {target.repository}/{target.name} for that copy; Triton read it locally")
    return ModelTarget(repository, target.name, config)


def incomplete_publish(target: ModelTarget) -> str:
    """For a model in object storage: why its files are not those its manifest lists ("" when they are, or there is no manifest)."""
    if not target.remote:
        return ""
    from optimizer.triton.repository.object_store.upload import manifest_mismatch

    for model in [*composing_targets(target), target]:  # an ensemble's step first: it is published before the ensemble
        problem = manifest_mismatch(model.store, model.name)
        if problem:
            return f"incomplete publish at {model.repository}/{model.name}: {problem}; publish it again."
    return ""


def default_sweep(reference: ExportReference | None) -> ConcurrencyRange:
    """1:8, or four even levels ending at the served search's concurrency (where its prediction was measured)."""
    target = reference.predicted_concurrency if reference is not None else None
    if not target:
        return ConcurrencyRange(1, 8)
    step = max(1, target // 4)
    return ConcurrencyRange(target - step * ((target - 1) // step), target, step)


def _request_mix(reference: ExportReference | None, served: dict[str, Any]) -> list[Any]:
    """The requests the served search measured with, in the served names: the run's traffic in its ratios (padded to the
    bucket edges when clients are told to pad), else the profiled sample ([] without a report)."""
    if reference is None:
        return []
    rename = served_names(reference, served)
    if reference.traffic is not None:
        from optimizer.model.signature import Signature
        from optimizer.model.traffic import Traffic

        traffic = Traffic(tuple(load_feeds(reference.traffic)), "file", reference.traffic_words)
        if reference.client_padding:
            traffic = traffic.padded(Signature.from_json(reference.signature), list(reference.client_padding["edges"]))
        feeds = traffic.sent()
    elif reference.profile_feed is not None:
        feeds = load_feeds(reference.profile_feed)[:1]
    else:
        return []
    return [{rename.get(k, k): a for k, a in feed.items()} for feed in feeds]


def _traffic_words(reference: ExportReference | None) -> str:
    """What _request_mix sends, in words."""
    if reference is None or reference.traffic is None:
        return "the profiled sample"
    padded = f", padded to {', '.join(map(str, reference.client_padding['edges']))} as its clients are told" if reference.client_padding else ""
    return f"the export's traffic ({reference.traffic_words or 'its requests'}){padded}"


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
