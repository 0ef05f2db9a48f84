"""The served search: measure config variants of the chosen artifact in the local tritonserver and keep the best.

The in-process rules give the starting point; the server is started once on a private repository
(the artifact's files linked, never the user's repository), and each variant is written as that
model's config.pbtxt, loaded, and measured by perf_analyzer at the target concurrency on the run's
request mix (the same rows in-process profiling timed). The search stops at its time budget or when
no neighbour improves; what it could not run is skipped with the reason, and the rules stand.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from optimizer.errors import ConfigRuleError, PublishError, TemplateError, ValidationError
from optimizer.events import Event, EventSink, ignore
from optimizer.machine import cpu_cores
from optimizer.model.samples import load_feeds
from optimizer.records.served_search import OperatingPoint, ServedSearch, ServedVariant
from optimizer.records.tune_result import TuneResult
from optimizer.task.core_share import CoreShare, probe
from optimizer.triton.local_serving import local_config, needs_translation, translation_note
from optimizer.triton.model_config import canonical, config_signature, operating_point_of, parse
from optimizer.triton.perf_analyzer import ConcurrencyRange, PerfSettings, run_perf_analyzer, write_input_data
from optimizer.triton.publish import PublishOptions, model_files, prepare_config
from optimizer.triton.served_search.points import SearchSpace, batch_steps, better, default_concurrency, delay_steps, layout_steps, reachable
from optimizer.triton.server import LocalTritonServer, ToolMissing, find_triton, homes_root, prepare_home
from optimizer.vocab import Device

log = logging.getLogger(__name__)

STAND_IN_LABEL = "stand-in backend"
MIN_WINDOW_MS = 500
"""Half-second windows: timed here on the bundled CNN, 1 s windows made perf_analyzer's three stable windows 3.7 s of
a 9 s variant (reload 3.9 s, warm-up 1.1 s), 0.5 s windows 1.9 s at the same throughput; the drift between variants
minutes apart (10% and more) is far larger than a window's own spread, and the confirmation handles drift."""
MAX_WINDOW_MS = 4000
CONFIRM_BELOW = 1.10
"""A variant that beats the best by less than 10% wins only if it still does after the best is measured again."""
WINDOW_REQUESTS = 40
"""perf_analyzer windows hold about this many requests of the start variant (at least 0.5 s, at most 4 s)."""
WARMUP_PER_SLOT = 4
"""Each variant is warmed with this many requests per concurrent slot, discarded: without it the variant measured first
after a load (the rules' point, on a cold server) pays the instances' first requests, and the search leans away from it."""


@dataclass(frozen=True)
class SearchRequest:
    """What the user asked of the search: the load, the latency budget, the time it may take, where it works."""

    workdir: Path
    concurrency: int | None = None  # None: default_concurrency(start)
    latency_budget_ms: float | None = None
    percentile: int = 95
    budget_s: float = 25.0
    cache_dir: Path | None = None


def served_search(result: TuneResult, options: PublishOptions, request: SearchRequest, on_event: EventSink = ignore) -> ServedSearch:
    """Search the served operating point of `result`'s selected artifact; never raises for a model it cannot serve.

    Returns a ServedSearch with status "searched" (chosen = the best variant) or "skipped" (reason; chosen
    = the rules' point, which publishing then keeps).
    """
    t0 = time.monotonic()
    artifact = result.selected_candidate.artifact
    assert artifact is not None and artifact.platform is not None
    _, _, spec = prepare_config(result, options)
    start = operating_point_of(spec, artifact.platform.thread_parameter)
    search = ServedSearch(status="skipped", latency_budget_ms=request.latency_budget_ms, percentile=request.percentile,
                          start=start, chosen=start, budget_s=request.budget_s)
    search.concurrency = request.concurrency or default_concurrency(start)
    search.concurrency_source = "--concurrency" if request.concurrency else "default: two peak batches in flight per instance"
    on_event(Event("serve", "start", result.selected or "", f"{start.label} at concurrency {search.concurrency}"))
    try:
        _search(result, options, request, search, on_event)
    except (ToolMissing, ValidationError) as err:
        search.status, search.reason = "skipped", str(err)
    finally:
        search.seconds = round(time.monotonic() - t0, 2)
    if search.status != "searched":
        search.chosen = start
        on_event(Event("serve", "skipped", result.selected or "", f"{search.reason}; the in-process rules stand"))
    else:
        on_event(Event("serve", "done", result.selected or "", _summary(search), elapsed_s=search.seconds))
    return search


def _search(result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, on_event: EventSink) -> None:
    from optimizer.triton.validation.target import ModelTarget, local_servability

    artifact = result.selected_candidate.artifact
    assert artifact is not None and search.start is not None
    name = options.name
    repo = request.workdir / "repository"
    shutil.rmtree(repo, ignore_errors=True)
    model_dir = repo / name
    text, extra, _ = prepare_config(result, options)
    _place(model_dir, result, text, extra)
    home = prepare_home(find_triton(), homes_root(request.cache_dir))
    reason = local_servability(ModelTarget(repo, name, parse(_locally(text))), home)
    if reason:
        search.reason = reason.replace("validate it", "serve it").split("; ")[0]
        return
    from optimizer.triton.perf_analyzer import find_perf_analyzer

    find_perf_analyzer()
    search.stand_in = artifact.platform.backend in home.stand_ins()
    search.served_by = (f"{STAND_IN_LABEL}: Triton's python backend runs backends/{artifact.platform.backend}/model.py"
                        if search.stand_in else "native backend")
    if needs_translation(parse(text)):
        search.served_by += f"; {translation_note(parse(text))}"
    input_data, search.request_mix = request_mix(result, request.workdir)
    gpu = Device.of(artifact.device).is_cuda
    share = None if gpu else probe()  # before the server starts: what is busy now is another job's
    space = SearchSpace.of(result.selected_candidate.decision, len(share.cores) if share else cpu_cores(), gpu, search.concurrency or 0)
    search.start = reachable(search.start, space.concurrency)  # a preferred size the load cannot form only waits
    first = search.start
    if share is not None and share.reduced:
        search.measured_on = share.to_json()
        first = on_free_cores(search.start, share, artifact.platform.thread_parameter)
        on_event(Event("serve", "progress", result.selected or "", f"{share.summary('variant')}; "
                       f"the instance layout stays the rules' {search.start.layout}"))
    deadline = time.monotonic() + request.budget_s
    with LocalTritonServer(repo, log_path=request.workdir / "tritonserver.log", home=home, cores=share.pin if share else None) as server:
        search.server = f"local tritonserver at {server.http_url}"
        window = [MIN_WINDOW_MS]

        def measure(point: OperatingPoint, stage: str) -> ServedVariant:
            variant = _measure(server, result, options, point, stage, model_dir, input_data, search.concurrency or 1,
                               window[0], request.workdir)
            search.variants.append(variant)
            if not server.alive:  # a backend aborted the server: what was measured before stands
                raise _ServerGone(f"the local tritonserver exited: {variant.reason}")
            mark = f"{variant.throughput:.1f}/s p95 {variant.p95_ms:.1f} ms" if variant.throughput is not None else f"{variant.status}: {variant.reason}"
            on_event(Event("serve", "progress", result.selected or "", f"{stage}: {point.label}: {mark}"))
            return variant

        best = measure(first, "start")
        if best.status != "measured":
            search.reason = f"the in-process rules' config could not be measured in the local server: {best.reason}"
            return
        if best.throughput:
            window[0] = int(min(MAX_WINDOW_MS, max(MIN_WINDOW_MS, 1000.0 * WINDOW_REQUESTS / best.throughput)))
        search.status = "searched"
        best, search.stopped = _climb(best, space, measure, deadline, request)
        search.chosen = best.point
        if share is not None and share.reduced:  # measured on the free cores: publish it scaled, with the rules' layout
            search.measured_point = best.point
            search.chosen = reachable(on_all_cores(best.point, search.start, share), space.concurrency)
    _predict(search, result)
    for v in search.variants:
        v.differs = v.point.differences(search.chosen)


def _climb(best: ServedVariant, space: SearchSpace, measure: Callable[[OperatingPoint, str], ServedVariant], deadline: float,
           request: SearchRequest) -> tuple[ServedVariant, str]:
    """Coordinate search from the rules' point: instance layouts (each without a queue delay first), larger then
    smaller batches (smaller first when more instances won), the capacity max, the queue delay. A walk takes steps
    while each improves and ends at its first step that does not."""
    seen: dict[OperatingPoint, ServedVariant] = {best.point: best}
    costs = [best.seconds]

    def timed(point: OperatingPoint, stage: str) -> ServedVariant:
        if time.monotonic() + max(costs) > deadline:  # the slowest variant so far: the budget is a bound, not a target
            raise _OutOfTime()
        v = measure(point, stage)
        costs.append(v.seconds)
        return v

    def attempt(point: OperatingPoint, stage: str) -> bool:
        nonlocal best
        v = seen[point] = timed(point, stage)
        top = max((x.throughput or 0.0) for x in seen.values())
        if not better(v, best, request.latency_budget_ms, request.percentile, top):
            return False
        if best.throughput and v.throughput and v.throughput < best.throughput * CONFIRM_BELOW:
            # a small win is checked against the incumbent measured again right after it (A B A): drift
            # between the two measurements of A cancels, and a win the noise made does not survive
            again = timed(best.point, "confirm")
            if again.status == "measured" and not better(v, _mean(best, again), request.latency_budget_ms, request.percentile, top):
                v.reason = f"not confirmed: the incumbent measured {again.throughput:.1f}/s again right after it"
                return False
        best = v
        return True

    def walk(steps_of: Callable[[OperatingPoint], list[OperatingPoint]], stage: str,
             alternatives: Callable[[OperatingPoint], list[OperatingPoint]] = lambda p: [p]) -> bool:
        improved = False
        while (step := next((p for p in steps_of(best.point) if p not in seen), None)) is not None:
            if not any(attempt(p, stage) for p in alternatives(step) if p not in seen):
                break
            improved = True
        return improved

    def without_delay_first(p: OperatingPoint) -> list[OperatingPoint]:
        # more instances share the load, so each sees a shorter queue and a delay that waits for a fuller batch
        # leaves an instance idle: in the bundled examples' exhaustive grids 2x1t served most at delay 0 and lost
        # to the start at the rules' delay. A layout is tried without a delay first, and loses only after both lost
        return [replace(p, queue_delay_us=0), p] if p.queue_delay_us and p.max_batch_size > 1 else [p]

    def each(points: list[OperatingPoint], stage: str) -> None:
        for point in points:
            if point not in seen:
                attempt(point, stage)

    def larger(p: OperatingPoint) -> list[OperatingPoint]:
        return [q for q in batch_steps(p, space)[0] if q.preferred != p.preferred]

    def smaller(p: OperatingPoint) -> list[OperatingPoint]:
        return batch_steps(p, space)[1]

    try:
        start_instances = best.point.instances
        walk(lambda p: layout_steps(p, space), "instances", without_delay_first)
        # more instances share the cores, so each one's best batch is smaller: then smaller batches are tried first
        first, second = (smaller, larger) if best.point.instances > start_instances else (larger, smaller)
        if not walk(first, "batch"):
            walk(second, "batch")
        up, _ = batch_steps(best.point, space)
        # capacity: max = largest fit, unless the max already holds the whole load: batch-1 requests at concurrency C never
        # form a batch above C, so a larger max serves the same and measuring it could only publish the noise
        observable = not space.concurrency or best.point.max_batch_size < space.concurrency
        each(up[:1] if up and up[0].preferred == best.point.preferred and observable else [], "batch")
        each(delay_steps(best.point), "queue delay")
    except _OutOfTime:
        return best, f"the time budget ({request.budget_s:.0f} s, --serve-search-seconds) ran out"
    except _ServerGone as err:
        return best, f"{err}; the best variant measured before stands"
    return best, "no neighbour of the best variant served more"


def on_free_cores(point: OperatingPoint, share: CoreShare, thread_parameter: str | None) -> OperatingPoint:
    """The point as it is measured on the cores other processes left free: one instance using all of them, with the
    batches that give each thread the share of work it gets on every core (task/core_share.py)."""
    return replace(point, instances=1, threads=len(share.cores) if thread_parameter else point.threads,
                   max_batch_size=share.to_measured_cores(point.max_batch_size), preferred=tuple(b for b in map(share.to_measured_cores, point.preferred) if b > 1))


def on_all_cores(measured: OperatingPoint, start: OperatingPoint, share: CoreShare) -> OperatingPoint:
    """A point measured on the free cores, as published for every core: its batches scaled, the rules' instance layout."""
    return replace(measured, instances=start.instances, threads=start.threads, max_batch_size=share.to_all_cores(measured.max_batch_size),
                   preferred=tuple(share.to_all_cores(b) for b in measured.preferred))


def _mean(a: ServedVariant, b: ServedVariant) -> ServedVariant:
    """One point measured twice, as one variant: the mean of both measurements."""
    def avg(x: float | None, y: float | None) -> float | None:
        return (x + y) / 2 if x is not None and y is not None else x

    return replace(a, throughput=avg(a.throughput, b.throughput), p50_ms=avg(a.p50_ms, b.p50_ms), p95_ms=avg(a.p95_ms, b.p95_ms),
                   p99_ms=avg(a.p99_ms, b.p99_ms))


class _OutOfTime(Exception):
    """The next variant would not finish within --serve-search-seconds."""


class _ServerGone(ValidationError):
    """The local server died while a variant was measured."""


def _place(model_dir: Path, result: TuneResult, text: str, extra: dict[str, bytes]) -> None:
    """The private repository's model: the artifact's files linked (never copied), the config and warmup files."""
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    for target, source in model_files(result).items():
        link = version / target
        link.unlink(missing_ok=True)
        link.symlink_to(source.resolve())
    _write_config(model_dir, text, extra)


def _locally(text: str) -> str:
    """The config as the local 2.51 server can load it (torch_aoti through the pytorch stand-in; others unchanged)."""
    config = parse(text)
    return canonical(local_config(config)) if needs_translation(config) else text


def _write_config(model_dir: Path, text: str, extra: dict[str, bytes]) -> None:
    for rel, data in extra.items():
        (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / rel).write_bytes(data)
    tmp = model_dir / ".config.pbtxt.tmp"
    tmp.write_text(_locally(text))
    os.replace(tmp, model_dir / "config.pbtxt")


def request_mix(result: TuneResult, workdir: Path) -> tuple[Path, str]:
    """perf_analyzer's input: the rows in-process profiling timed (the user's first sample, else the generated
    feed with every dynamic axis at its maximum), in the config's tensor names."""
    feeds = load_feeds(Path(result.reference.profile_feed))
    sig, renamed = config_signature(result.selected_candidate.artifact)
    back = {original: config_name for config_name, original in renamed.items()}
    feeds = [{back.get(k, k): v for k, v in feed.items()} for feed in feeds]
    shapes = ", ".join(f"{k} {'x'.join(map(str, v.shape[1:] if sig.batching else v.shape)) or 'scalar'}" for k, v in feeds[0].items())
    path = write_input_data(workdir / "perf_analyzer_input.json", feeds, sig.batching)
    return path, f"the profiled sample ({shapes}), as in-process profiling and validate send it"


def _measure(server: LocalTritonServer, result: TuneResult, options: PublishOptions, point: OperatingPoint, stage: str,
             model_dir: Path, input_data: Path, concurrency: int, window_ms: int, workdir: Path) -> ServedVariant:
    """Write the variant's config, load it, run perf_analyzer once at the target concurrency."""
    from tritonclient.utils import InferenceServerException

    from optimizer.triton.server import triton_message

    t0 = time.monotonic()
    variant = ServedVariant(point, stage)
    try:
        text, extra, _ = prepare_config(result, replace(options, operating_point=point))
        _write_config(model_dir, text, extra)
        server.reload(options.name)
        settings = PerfSettings(concurrency=ConcurrencyRange(concurrency, concurrency), measurement_interval_ms=window_ms,
                                stability_percentage=25, max_trials=6, timeout_s=120.0, warmup_requests=WARMUP_PER_SLOT * concurrency)
        perf = run_perf_analyzer(options.name, server.http_url, input_data, workdir / "perf_analyzer", settings)
    except (ConfigRuleError, TemplateError, PublishError) as err:
        variant.status, variant.reason = "failed", f"the config is refused: {err}"
    except ValidationError as err:
        variant.status, variant.reason = "failed", str(err)
    except InferenceServerException as err:
        variant.status, variant.reason = "failed", f"Triton stopped answering: {triton_message(err)}"
    else:
        row = perf.best
        if row is None:
            variant.status, variant.reason = "failed", "perf_analyzer measured nothing"
        else:
            variant.throughput, variant.p50_ms, variant.p95_ms, variant.p99_ms = row.throughput, row.p50_ms, row.p95_ms, row.p99_ms
            variant.server_batch = round(row.server_batch, 3) if row.server_batch else None
    variant.seconds = round(time.monotonic() - t0, 2)
    return variant


def _predict(search: ServedSearch, result: TuneResult) -> None:
    """The published config's served throughput, split into the in-process time at the batch the server
    formed and the server's own cost per request (what validate's ratio is compared against)."""
    chosen = search.chosen_variant
    decision = result.selected_candidate.decision
    if chosen is None or chosen.throughput is None or search.measured_point is not None:  # the published layout was not measured
        return
    search.predicted_throughput = round(chosen.throughput, 2)
    if decision is None or not decision.profiles:
        return
    batch = chosen.server_batch or 1.0
    per_sample_ms = _per_sample_ms(decision.profiles, batch)
    search.in_process_throughput = round(1000.0 / per_sample_ms, 2)
    search.per_request_ms = round(1000.0 / chosen.throughput - per_sample_ms, 4)


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
    label = chosen.point.label if search.measured_point is None else f"{search.chosen.label} (measured as {chosen.point.layout} on the free cores)"
    return (f"{label}: {chosen.throughput:.1f}/s p95 {chosen.p95_ms:.1f} ms at concurrency {search.concurrency} "
            f"(rules: {start.throughput:.1f}/s p95 {start.p95_ms:.1f} ms; {len(search.variants)} variants, {search.stopped})")
