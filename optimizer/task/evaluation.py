"""One candidate in two isolated steps: build (and check against the reference), then measure.

Builds may run side by side (compilers are slow and mostly serial); measurements run one at a
time on a quiet machine, each in a fresh process that loads only the artifact's runtime. Both
steps write their progress after every step, so the parent can still report what a crashed
child did.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.backend import backend_named
from optimizer.errors import SettingsError, first_line
from optimizer.model.samples import load_feeds, tile_feed
from optimizer.model.signature import Signature
from optimizer.model.loaded_model import LoadedModel, ModelSource
from optimizer.model.source import load_source
from optimizer.records.accuracy import AccuracyBudget
from optimizer.records.candidate import Candidate
from optimizer.records.correctness import CorrectnessReport, tolerances_from_json
from optimizer.records.measurements import BatchPolicy, MaxBatchDecision
from optimizer.task.correctness import compare_outputs
from optimizer.task.device_memory import is_allocation_failure, release_device_memory
from optimizer.task.find_max_batch_size import FIT_CHECK_MAX_MS, OutOfMemory, TimeBudgetExceeded, estimate_ceiling, find_max_batch_size
from optimizer.task.profiling import ProfileSettings, measure_settled, peak_rss_mb

log = logging.getLogger(__name__)

@dataclass
class BuildJob:
    """What a build child needs, as plain data."""

    backend: str
    device: str
    source: dict[str, str]
    signature: dict[str, Any]
    workdir: str
    correctness_feeds: str  # npz written by save_feeds
    reference_outputs: str  # npz of reference outputs, same order as the feeds
    correctness_points: list[str]
    batch_max: int
    backend_settings: dict[str, Any] = field(default_factory=dict)
    tolerances: dict[str, list[float]] = field(default_factory=dict)
    state_dict: str | None = None  # weights snapshot from the parent (callable sources re-run their factory)
    accuracy: dict[str, Any] | None = None  # AccuracyBudget.to_json(): a reduced-precision candidate is judged by the gate

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MeasureJob:
    """What a measuring child needs: the built candidate, the profiling feed and the batch policy."""

    candidate: dict[str, Any]  # Candidate.to_json() after the build step
    source: dict[str, str]
    signature: dict[str, Any]
    workdir: str
    profile_feed: str  # npz with one feed at batch 1 (tiled to each batch size)
    policy: dict[str, Any]
    profile: dict[str, Any] = field(default_factory=dict)
    backend_settings: dict[str, Any] = field(default_factory=dict)
    state_dict: str | None = None
    memory_budget_mb: float | None = None
    deadline: float | None = None  # time.time() after which no new batch size is measured

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_progress(path: Path, cand: Candidate) -> None:
    """Atomically record what the child knows so far (the parent polls it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cand.to_json()))
    os.replace(tmp, path)


def _load_model(source: dict[str, str], state_dict: str | None) -> LoadedModel:
    model = load_source(ModelSource.from_json(source))
    if state_dict and model.module is not None:
        import torch

        model.inner_module.load_state_dict(torch.load(state_dict, weights_only=True))
    return model


def build_candidate(payload: dict[str, Any]) -> dict[str, Any]:
    """Child entry point of the build step: build, load, compare with the reference. Returns Candidate.to_json()."""
    job = BuildJob(**payload)
    backend = backend_named(job.backend, **job.backend_settings)
    signature = Signature.from_json(job.signature)
    workdir = Path(job.workdir)
    progress = workdir / "progress.json"
    cand = Candidate(backend.candidate_name(job.device), backend.name, job.device, versions=backend.versions())
    model = _load_model(job.source, job.state_dict)
    cand.stage = "build"
    write_progress(progress, cand)
    t0 = time.perf_counter()
    try:
        artifact = backend.build(model, signature, workdir / "artifact", (1, job.batch_max), job.device)
    except Exception as err:
        log.exception("%s | build failed", cand.name)
        return _failed(cand, "build", f"build failed: {first_line(err)}")
    cand.build_s = time.perf_counter() - t0
    artifact.triton_settings = backend.triton_settings(artifact)
    cand.artifact = artifact
    log.info("%s | built %s in %.1f s", cand.name, artifact.files or "(nothing)", cand.build_s)
    cand.stage = "correctness"
    write_progress(progress, cand)

    feeds = load_feeds(Path(job.correctness_feeds))
    refs = load_feeds(Path(job.reference_outputs))
    tolerances = tolerances_from_json(job.tolerances)
    try:
        runner = backend.load(artifact, job.device, model)
        runner.__enter__()
    except Exception as err:
        log.exception("%s | load failed", cand.name)
        return _failed(cand, "load", f"load failed: {first_line(err)}")
    try:
        if job.accuracy is not None:
            report = _gated_report(runner, job, signature, feeds, refs, tolerances, cand.name)
        else:
            report = _checked_report(runner, job, signature, feeds, refs, tolerances, cand.name)
    except SettingsError as err:  # the user's --accuracy-check is broken: the run stops with its one line
        return _failed(cand, "accuracy_check", str(err))
    finally:
        runner.__exit__(None, None, None)
    cand.correctness = report
    if not report.passed:
        note = artifact.metadata.get("numerics_note")  # e.g. a runtime that computes below fp32 on this CPU
        return _failed(cand, "correctness", f"rejected: {report.reason}" + (f"; {note}" if note else ""))
    log.info("%s | correct (max abs %.2g, max rel %.2g)", cand.name, report.max_abs, report.max_rel)
    cand.status, cand.stage = "built", ""
    return cand.to_json()


def _checked_report(runner: Any, job: BuildJob, signature: Signature, feeds: list[Any], refs: list[Any],
                    tolerances: dict[str, Any], name: str) -> CorrectnessReport:
    """fp32: every correctness point compared elementwise at the tolerances."""
    report = CorrectnessReport()
    names = signature.output_names
    dtypes = [o.dtype.name for o in signature.outputs]
    for point, feed, ref in zip(job.correctness_points, feeds, refs):
        try:
            outs = runner.infer(feed)
        except Exception as err:
            log.exception("%s | inference failed at %s", name, point)
            report.error = f"inference failed at {point}: {first_line(err)}"
            break
        report.cases.append(compare_outputs(point, names, dtypes, outs, [ref[n] for n in names], tolerances))
    return report


def _gated_report(runner: Any, job: BuildJob, signature: Signature, feeds: list[Any], refs: list[Any],
                  tolerances: dict[str, Any], name: str) -> CorrectnessReport:
    """A reduced-precision candidate: the points run short to long and back on this one loaded model (the cases keep
    the elementwise figures), then the accuracy gate decides."""
    from optimizer.task.accuracy_gate import judge, load_check, run_check, server_order

    budget = AccuracyBudget.from_json(job.accuracy)
    report = CorrectnessReport()
    names = signature.output_names
    dtypes = [o.dtype.name for o in signature.outputs]
    order = server_order([sum(int(a.size) for a in feed.values()) for feed in feeds])
    ran, seen, got, wanted = [], set(), [], []
    for i in order:
        point = job.correctness_points[i] + (" (again)" if i in seen else "")
        seen.add(i)
        try:
            outs = [np.array(o, copy=True) for o in runner.infer(feeds[i])]
        except Exception as err:
            log.exception("%s | inference failed at %s", name, point)
            report.error = f"inference failed at {point}: {first_line(err)}"
            return report
        ref = [refs[i][n] for n in names]
        report.cases.append(compare_outputs(point, names, dtypes, outs, ref, tolerances))
        ran.append(point)
        got.append(dict(zip(names, outs)))
        wanted.append(dict(zip(names, ref)))
    report.accuracy = judge(names, ran, wanted, got, budget, signature.batching)
    if budget.check:
        score, ok = run_check(load_check(budget.check), budget.check, wanted, got)
        report.accuracy.check_score, report.accuracy.check_passed = score, ok
    return report


TAIL_PROFILE = {"stable_windows": 2, "time_cap_s": 1.0}
"""The traffic's p90 request, alone, is a figure for the report (the tail a lone client sees), not a decision: two stable
windows, a second at most."""
FIT_CHECK_MEMORY_SHARE = 0.5
"""The fit check past a saturation stop runs batches never profiled: it may take this share of the memory the machine has
available, so a batch that would push the machine into swap or the OOM killer (which would end the candidate) is not run."""


def _host_room_mb(limit_mb: float | None) -> float | None:
    """The peak RSS (MB) the fit check may reach: now plus FIT_CHECK_MEMORY_SHARE of MemAvailable, within the memory
    budget's limit when one is set; None when /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) / 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    room = peak_rss_mb() + FIT_CHECK_MEMORY_SHARE * available
    return min(room, limit_mb) if limit_mb else room


def _vm_data_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0




def measure_candidate(payload: dict[str, Any]) -> dict[str, Any]:
    """Child entry point of the measure step: the max-batch search with profiling. Returns Candidate.to_json()."""
    job = MeasureJob(**payload)
    cand = Candidate.from_json(job.candidate)
    backend = backend_named(cand.backend, **job.backend_settings)
    signature = Signature.from_json(job.signature)
    progress = Path(job.workdir) / "progress.json"
    policy = BatchPolicy.from_json(job.policy)
    settings = ProfileSettings(**job.profile)
    model = _load_model(job.source, job.state_dict) if backend.needs_source_model else None
    cand.stage = "measure"
    write_progress(progress, cand)
    assert cand.artifact is not None
    try:
        runner = backend.load(cand.artifact, cand.device, model)
        runner.__enter__()
    except Exception as err:
        log.exception("%s | load failed", cand.name)
        return _failed(cand, "load", f"load failed: {first_line(err)}")
    t0 = time.perf_counter()
    try:
        profile_feeds = load_feeds(Path(job.profile_feed))
        base, largest = profile_feeds[0], profile_feeds[-1]  # the traffic's median request (the curve), its largest (fit)
        tail = profile_feeds[1] if len(profile_feeds) > 2 else base
        runner.infer(tile_feed(base, 1) if signature.batching else base)  # load the runtime before the limit
        limit_mb = None
        if job.memory_budget_mb:
            limit = _vm_data_bytes() + int(job.memory_budget_mb * 2**20)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))
            limit_mb = limit / 2**20
        partial: list[Any] = []

        def measure_batch(batch: int):
            if partial and job.deadline and time.time() > job.deadline:  # batch 1 always: every candidate stays comparable
                raise TimeBudgetExceeded("the time budget ran out")
            release_device_memory(cand.device)  # each probe starts without the cache of the one before
            with _allocation_failure_as_out_of_memory(cand, batch):
                feed = tile_feed(base, batch) if signature.batching else base
                runner.infer(feed)  # checked once, outside the timed windows
                prof = measure_settled(lambda: runner.run_unchecked(feed), batch if signature.batching else 1, settings)
            log.info("%s | batch %d: %.1f/s p50 %.2f ms p95 %.2f ms (cv %.3f, others %.0f%%)",
                     cand.name, batch, prof.throughput, prof.p50_ms, prof.p95_ms, prof.cv, 100 * prof.others_cpu_share)
            partial.append(prof)
            cand.decision = MaxBatchDecision(list(partial), 0, 0, 0, "in progress")
            write_progress(progress, cand)
            return prof

        def fits(batch: int) -> float:
            """Does `batch` of the traffic's largest request fit? One checked inference (the first at a shape may compile),
            then the milliseconds of a second."""
            if job.deadline and time.time() > job.deadline:
                raise TimeBudgetExceeded("the time budget ran out")
            if (room := _host_room_mb(limit_mb)) is not None and batch > (estimate_ceiling(partial, room) or batch):
                raise OutOfMemory(f"batch {batch}: peak memory's growth over the profiled batches would pass the {room:.0f} MB there is room for")
            release_device_memory(cand.device)
            with _allocation_failure_as_out_of_memory(cand, batch):
                feed = tile_feed(largest, batch)
                runner.infer(feed)
                t = time.perf_counter()
                runner.run_unchecked(feed)
                ms = (time.perf_counter() - t) * 1000
            log.info("%s | batch %d fits: %.1f ms an inference", cand.name, batch, ms)
            return ms

        try:
            scale = _elements(largest) / max(1, _elements(base))  # the largest request costs about this many median ones
            decision = find_max_batch_size(measure_batch, policy, signature.batching, fits, fit_cost_scale=scale)
            if decision.profiles and signature.batching and _shape_of(largest) != _shape_of(base):
                decision = fit_at_largest(decision, fits, _shape_of(largest), scale)
            if decision.profiles and _shape_of(tail) != _shape_of(base) and not (job.deadline and time.time() > job.deadline):
                feed = tile_feed(tail, 1) if signature.batching else tail
                runner.infer(feed)
                decision.tail = measure_settled(lambda: runner.run_unchecked(feed), 1, replace(settings, **TAIL_PROFILE))
        except Exception as err:
            log.exception("%s | measurement failed", cand.name)
            return _failed(cand, "measure", f"measurement failed: {first_line(err)}")
        cand.decision = decision
        cand.measure_s = time.perf_counter() - t0
        if not decision.profiles:
            return _failed(cand, "measure", f"no batch size could be measured: {decision.failure or decision.decided_by}")
        if limit_mb:
            cand.ceiling_estimate = decision.ceiling or estimate_ceiling(decision.profiles, limit_mb)
        cand.status, cand.stage, cand.reason = "passed", "", ""
        return cand.to_json()
    finally:
        runner.__exit__(None, None, None)


def _shape_of(feed: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(a.shape) for a in feed.values())


def _elements(feed: dict[str, Any]) -> int:
    return sum(int(a.size) for a in feed.values())


def fit_at_largest(decision: MaxBatchDecision, fits: Any, shape: tuple[tuple[int, ...], ...], scale: float = 1.0) -> MaxBatchDecision:
    """The curve was profiled at the traffic's median request: check that the largest batch said to fit also fits the
    traffic's largest request, halving it (and the max and peak with it) until one does. A batch whose inference of the
    largest request would take over FIT_CHECK_MAX_MS (the profiled time scaled by rows and by `scale`) does not count as
    fitting: no served config would use it."""
    largest = decision.largest_fit or decision.max_batch_size
    top = max(decision.profiles, key=lambda p: p.batch_size)
    size = largest
    while size > 1 and top.p50_ms * scale * size / top.batch_size > FIT_CHECK_MAX_MS:
        size //= 2
    while size >= 1:
        try:
            fits(size)
            break
        except OutOfMemory:
            size //= 2
        except TimeBudgetExceeded:
            return decision
    decision.fit_shape = ", ".join("x".join(map(str, s[1:])) or "scalar" for s in shape)
    if size < largest:
        size = max(size, 1)
        decision.largest_fit = size
        decision.fit_checked = [b for b in decision.fit_checked if b <= size]
        if decision.max_batch_size > size:
            decision.max_batch_size, decision.decided_by = size, "memory"
            decision.first_failure = decision.first_failure or 2 * size
        decision.peak = min(decision.peak, size) if decision.peak else decision.peak
    return decision


@contextmanager
def _allocation_failure_as_out_of_memory(cand: Candidate, batch: int) -> Iterator[None]:
    """An allocation failure inside is the batch not fitting (OutOfMemory, the device's cache released); others pass."""
    try:
        yield
    except Exception as err:
        if is_allocation_failure(err):
            log.info("%s | batch %d does not fit: %s", cand.name, batch, first_line(err))
            release_device_memory(cand.device)
            raise OutOfMemory(f"batch {batch}: {first_line(err)}") from err
        raise


def _failed(cand: Candidate, stage: str, reason: str) -> dict[str, Any]:
    cand.status, cand.stage, cand.reason = "failed", stage, reason
    return cand.to_json()
