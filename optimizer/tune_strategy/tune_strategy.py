"""TuneStrategy: build each candidate, check it against the reference, measure it, choose, explain.

Each candidate runs in its own process (task/isolation.py). Candidates that fail to build, fail
correctness or cannot run are kept in the result with their reason; they never end the run.
Concrete strategies only say which candidates to try and how to rank the ones that passed.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar, Sequence

from optimizer.backend import EAGER, Backend, backend_named
from optimizer.backend.base import cpu_cores
from optimizer.errors import NoCandidateError, SettingsError
from optimizer.events import Event
from optimizer.task.correctness import precision_tolerances
from optimizer.task.evaluation import BuildJob, Candidate, MeasureJob
from optimizer.task.find_max_batch_size import BatchPolicy
from optimizer.task.isolation import ChildOutcome, run_isolated, stop_all_children
from optimizer.tune_strategy.context import TuneContext
from optimizer.tune_strategy.mixin.find_max_batch_size_mixin import FindMaxBatchSizeMixin
from optimizer.tune_strategy.result import TuneResult

log = logging.getLogger(__name__)

EAGER_GATES = ("enabled", "diagnostic", "disabled")


class TuneStrategy(FindMaxBatchSizeMixin):
    """Base of every strategy. Subclasses define `_candidate_backends` and `_rank`."""

    name: ClassVar[str] = "base"
    higher_is_better: ClassVar[bool] = True  # the ranking metric: throughput (True) or latency (False)

    def __init__(
        self,
        eager_gate: str = "enabled",
        max_batch_size: int | str | None = "auto",
        latency_budget_ms: float | None = None,
        percentile: int = 95,
        memory_budget_mb: float | None = None,
        find_max_batch_size: bool = True,
        search_cap: int = 256,
    ) -> None:
        if eager_gate not in EAGER_GATES:
            raise SettingsError(f"eager gate {eager_gate!r} is not one of {', '.join(EAGER_GATES)}.")
        self.eager_gate = eager_gate
        self._init_batch_policy(max_batch_size, latency_budget_ms, percentile, memory_budget_mb, find_max_batch_size, search_cap)

    # -- what subclasses decide -------------------------------------------------------------
    def _candidate_backends(self, ctx: TuneContext) -> list[Backend]:
        raise NotImplementedError

    def _metric(self, cand: Candidate) -> float | None:
        """The ranking value of a passed candidate (None: it has no usable measurement)."""
        raise NotImplementedError

    def _rank(self, passed: Sequence[Candidate], eager: Candidate | None) -> tuple[Candidate | None, str]:
        """The best passed candidate and one sentence saying why; the default orders by `_metric`."""
        scored = [(c, self._metric(c)) for c in passed]
        scored = [(c, m) for c, m in scored if m is not None]
        if not scored:
            return None, "no candidate has a measurement this strategy can rank"
        best, value = (max if self.higher_is_better else min)(scored, key=lambda cm: cm[1])
        others = ", ".join(f"{c.name} {self._fmt(m)}" for c, m in scored if c is not best)
        return best, f"{best.name} has the {self._metric_label()} ({self._fmt(value)})" + (f"; others: {others}" if others else "")

    def _metric_label(self) -> str:
        return "highest throughput" if self.higher_is_better else "lowest latency"

    def _fmt(self, value: float | None) -> str:
        if value is None:
            return "no usable measurement"
        return f"{value:.1f}/s" if self.higher_is_better else f"{value:.2f} ms"

    # -- the shared run -----------------------------------------------------------------------
    def tune(self, ctx: TuneContext) -> TuneResult:
        """Build every candidate (side by side), then measure each one alone, then select.

        Eager PyTorch is measured too unless the gate is disabled; it is the bar, never published.
        """
        t0 = time.perf_counter()
        backends = [b.at_precision(ctx.precision) for b in self._candidate_backends(ctx)]
        if not backends:
            raise NoCandidateError(
                "no candidate backends: the strategy was given an empty list; name at least one with --backend "
                "(see `aitune-export backends`)."
            )
        policy = self.batch_policy(ctx.recorded_batch_sizes)
        deadline = time.time() + ctx.time_budget_s if ctx.time_budget_s else None
        candidates, runnable = self._screen(backends, ctx)
        runner = _CandidateRunner(self, ctx, policy, deadline)
        runner.total = 2 * len(runnable) + (1 if self._wants_eager(ctx) else 0)  # build + measure each, measure eager
        eager = None
        interrupted = False
        try:
            if self._wants_eager(ctx):
                # eager first, on a quiet machine: its knee is the batch engines are optimized for
                eager = runner.measure(runner.eager_built())
                if eager.passed and eager.decision is not None and eager.decision.knee:
                    runnable = [b.with_batch_hint(eager.decision.knee) for b in runnable]
            built = runner.build_all(runnable)
            for cand in built:
                candidates.append(runner.measure(cand) if cand.status == "built" else cand)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop every child, keep what finished
            stop_all_children()
            interrupted = True
            eager = next((c for c in runner.finished if c.backend == EAGER), None)
            candidates = _after_interrupt(candidates, runner.finished, runnable, ctx.device)
        order = {b.name: i for i, b in enumerate(backends)}
        candidates.sort(key=lambda c: order.get(c.backend, len(order)))
        passed = [c for c in candidates if c.passed]
        warnings: list[str] = []
        if interrupted:
            selected, reason = None, "the run was interrupted before a candidate could be selected"
        else:
            selected, reason = self._select(passed, eager, warnings)
            ctx.on_event(Event("select", "done" if selected else "failed", selected.name if selected else "", reason))
        return TuneResult(
            model_name=ctx.model.name,
            source=ctx.model.source.to_json(),
            signature=ctx.signature.to_json(),
            device=ctx.device,
            strategy=self.name,
            workflow=getattr(self, "workflow", "aot"),
            candidates=candidates,
            eager=eager,
            selected=selected.name if selected else None,
            max_batch_size=(selected.decision.max_batch_size if selected and selected.decision else 0),
            selection_reason=reason,
            reference=ctx.reference,
            eager_gate=self.eager_gate,
            warnings=warnings,
            environment=environment(candidates, eager),
            tune_seconds=time.perf_counter() - t0,
            latency_budget_ms=self.latency_budget_ms,
            percentile=self.percentile,
            interrupted=interrupted,
            tolerances=self._tolerances_of(selected, ctx),
        )

    @staticmethod
    def _tolerances_of(selected: Candidate | None, ctx: TuneContext) -> dict[str, list[float]]:
        """The tolerance overrides the selected candidate was checked with (validation reuses them)."""
        precision = "fp32"
        if selected is not None and selected.artifact is not None:
            precision = selected.artifact.metadata.get("precision", ctx.precision)
        found = precision_tolerances(ctx.signature, precision, ctx.tolerances)
        return {name: [t.atol, t.rtol] for name, t in found.items()}

    @staticmethod
    def _screen(backends: Sequence[Backend], ctx: TuneContext) -> tuple[list[Candidate], list[Backend]]:
        """Candidates that cannot run here (wrong model format, baseline, unavailable) with their reason, and the rest."""
        screened: list[Candidate] = []
        runnable: list[Backend] = []
        for b in backends:
            cand = Candidate(b.candidate_name(ctx.device), b.name, ctx.device, status="skipped", stage="availability")
            if ctx.model.format not in b.consumes:
                cand.reason = f"{b.name} cannot build from a {ctx.model.format} model (it takes: {', '.join(sorted(b.consumes))})"
            elif not b.publishable:
                cand.reason = f"{b.name} is a baseline and is never published"
            else:
                av = b.availability(ctx.device)
                if av:
                    runnable.append(b)
                    continue
                cand.status, cand.reason = "unavailable", av.reason
            ctx.on_event(Event("build", "skipped", cand.name, cand.reason))
            screened.append(cand)
        return screened, runnable

    def _wants_eager(self, ctx: TuneContext) -> bool:
        return self.eager_gate != "disabled" and ctx.model.format == "torch"

    def _beats_eager(self, cand: Candidate, eager: Candidate | None) -> bool | None:
        """None when there is nothing to compare with."""
        if eager is None or not eager.passed:
            return None
        mine, theirs = self._metric(cand), self._metric(eager)
        if mine is None:
            return None
        if theirs is None:  # eager has no measurement that meets the strategy's constraint
            return True
        return mine > theirs if self.higher_is_better else mine < theirs

    def _select(self, passed: list[Candidate], eager: Candidate | None, warnings: list[str]) -> tuple[Candidate | None, str]:
        if not passed:
            return None, "no candidate passed"
        if self.eager_gate == "enabled" and eager is not None and eager.passed:
            beating = [c for c in passed if self._beats_eager(c, eager)]
            if beating:
                best, why = self._rank(beating, eager)
                return best, f"{why}; beats eager ({self._fmt(self._metric(eager))})" if best else why
            best, why = self._rank(passed, eager)
            if best is not None:
                warnings.append(
                    f"eager PyTorch was faster than every deployable candidate ({self._fmt(self._metric(eager))}); "
                    f"publishing the best deployable one, {best.name}."
                )
            return best, why
        best, why = self._rank(passed, eager)
        verdict = self._beats_eager(best, eager) if best else None
        if best is not None and verdict is not None:
            why += f"; {'beats' if verdict else 'does not beat'} eager ({self._fmt(self._metric(eager))})"
        return best, why



BUILD_WORKERS_MAX = 2
"""Builds running at once: compilers are mostly serial, so two keep two cores busy."""


class _CandidateRunner:
    """Runs the build and measure steps of candidates in child processes and turns outcomes into Candidates."""

    def __init__(self, strategy: TuneStrategy, ctx: TuneContext, policy: BatchPolicy, deadline: float | None) -> None:
        self.strategy, self.ctx, self.policy, self.deadline = strategy, ctx, policy, deadline
        self._lock = threading.Lock()
        self._backend_of: dict[str, Backend] = {}  # candidate name -> the configured backend that built it
        self.finished: list[Candidate] = []  # every finished step's latest record (kept for an interrupted run)
        self.total = 0
        self.done = 0

    def _workdir(self, name: str) -> Path:
        return self.ctx.workdir / "candidates" / name.replace("[", "_").replace("]", "").replace(":", "_")

    def _event(self, phase: str, state: str, name: str, message: str = "", elapsed: float = 0.0) -> None:
        with self._lock:
            self.ctx.on_event(Event(phase, state, name, message, self.done, self.total, elapsed))

    # -- build ------------------------------------------------------------------------------
    def build_all(self, backends: Sequence[Backend]) -> list[Candidate]:
        """Build (and check) every runnable candidate, up to BUILD_WORKERS_MAX at a time; returned in candidate order.

        The slowest builds (an AOTInductor compile, a TensorRT engine) start first, so the quick ones
        finish beside them instead of after them.
        """
        workers = max(1, min(BUILD_WORKERS_MAX, cpu_cores(), len(backends)))
        if workers == 1:
            return [self.build(b) for b in backends]
        slowest_first = sorted(backends, key=lambda b: -b.typical_build_s)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="build") as pool:
            try:
                futures = {id(b): pool.submit(self.build, b) for b in slowest_first}
                return [futures[id(b)].result() for b in backends]
            except BaseException:  # Ctrl-C: the workers are waiting on children; stop those first
                stop_all_children()
                raise

    def build(self, backend: Backend) -> Candidate:
        ctx = self.ctx
        name = backend.candidate_name(ctx.device)
        self._backend_of[name] = backend
        workdir = self._workdir(name)
        cached = ctx.cache.lookup_build(backend, ctx, self.policy.cap) if ctx.cache is not None else None
        if cached is not None:
            if cached.status == "failed":
                self._step_done(_PHASE_OF_STAGE.get(cached.stage, "build"), name, f"{cached.reason} (cached; --no-cache retries)", failed=True)
            else:
                self._count_step()
                self._event("build", "done", name, "reused the cached build (--no-cache rebuilds)")
            self._finish(cached)
            return cached
        job = BuildJob(
            backend=backend.name,
            device=ctx.device,
            source=ctx.model.source.to_json(),
            signature=ctx.signature.to_json(),
            workdir=str(workdir),
            correctness_feeds=ctx.reference.feeds,
            reference_outputs=ctx.reference.outputs,
            correctness_points=ctx.reference.points,
            batch_max=self.policy.cap,
            backend_settings=backend.settings,
            tolerances={k: [t.atol, t.rtol] for k, t in precision_tolerances(ctx.signature, backend.settings["precision"], ctx.tolerances).items()},
            state_dict=ctx.state_dict,
        )
        self._event("build", "start", name)
        watcher = _ProgressWatcher(workdir / "progress.json", self, name, "build")
        outcome = run_isolated("optimizer.task.evaluation:build_candidate", job.to_json(), workdir, ctx.build_timeout_s, "build", watcher.poll)
        cand = self._outcome(outcome, watcher, backend, "build", "--build-timeout")
        watcher.emit_new(cand, outcome.seconds)  # steps the child finished after the last poll
        cand.log = str(workdir / "build.log")
        if ctx.cache is not None:
            ctx.cache.store_build(backend, ctx, self.policy.cap, cand)
        if cand.status == "built":
            self._count_step()
        else:
            self._step_done(_PHASE_OF_STAGE.get(cand.stage, watcher.phase), name, cand.reason, failed=True)
        self._finish(cand)
        return cand

    def eager_built(self) -> Candidate:
        """Eager needs no build: its artifact is the source module itself."""
        backend = backend_named(EAGER)
        name = backend.candidate_name(self.ctx.device)
        self._backend_of[name] = backend
        art = backend.build(self.ctx.model, self.ctx.signature, self._workdir(name), (1, self.policy.cap), self.ctx.device)
        return Candidate(name, backend.name, self.ctx.device, status="built", artifact=art)

    # -- measure ----------------------------------------------------------------------------
    def measure(self, cand: Candidate) -> Candidate:
        ctx = self.ctx
        backend = self._backend_of[cand.name]
        workdir = self._workdir(cand.name)
        budget = self.strategy.memory_budget_mb
        cached = ctx.cache.lookup_measurement(backend, ctx, self.policy, budget, cand) if ctx.cache is not None else None
        if cached is not None:
            self._step_done("profile", cand.name, "reused the cached measurement (--no-cache measures again); " + _summary(cached))
            return cached
        job = MeasureJob(
            candidate=cand.to_json(),
            source=ctx.model.source.to_json(),
            signature=ctx.signature.to_json(),
            workdir=str(workdir),
            profile_feed=ctx.reference.profile_feed,
            policy=self.policy.to_json(),
            profile=asdict(ctx.profile),
            backend_settings=backend.settings,
            state_dict=ctx.state_dict,
            memory_budget_mb=self.strategy.memory_budget_mb,
            deadline=self.deadline,
        )
        self._event("profile", "start", cand.name)
        watcher = _ProgressWatcher(workdir / "progress.json", self, cand.name, "measure")
        outcome = run_isolated("optimizer.task.evaluation:measure_candidate", job.to_json(), workdir, ctx.profile_timeout_s, "measure", watcher.poll)
        result = self._outcome(outcome, watcher, backend, "measure", "--profile-timeout", before=cand)
        watcher.emit_new(result, outcome.seconds)
        result.log = cand.log + ("," if cand.log else "") + str(workdir / "measure.log")
        if result.passed and ctx.cache is not None:
            ctx.cache.store_measurement(backend, ctx, self.policy, budget, result)
        self._step_done("profile", cand.name, result.reason or _summary(result), failed=not result.passed)
        self._finish(result)
        return result

    def _outcome(self, outcome: ChildOutcome, watcher: _ProgressWatcher, backend: Backend, step: str, flag: str,
                 before: Candidate | None = None) -> Candidate:
        if outcome.ok:
            return Candidate.from_json(outcome.value)
        cand = watcher.last() or before or Candidate(backend.candidate_name(self.ctx.device), backend.name, self.ctx.device)
        what = "building" if step == "build" else "measuring"
        if outcome.timed_out:
            cand.status, cand.stage = "failed", "timeout"
            cand.reason = f"stopped while {what}: {outcome.reason}; raise {flag} if it needs longer"
        elif not outcome.signal and outcome.exitcode == 0:
            cand.status, cand.stage = "failed", step
            cand.reason = f"{what} failed: {outcome.reason}"
        else:
            cand.status, cand.stage = "failed", "crash"
            cand.reason = f"the {step} process {outcome.reason}"
            if outcome.signal == "SIGKILL" and step == "measure" and cand.decision is not None and cand.decision.profiles:
                _accept_partial_as_memory_limit(cand)
        return cand

    def _finish(self, cand: Candidate) -> None:
        with self._lock:
            self.finished = [c for c in self.finished if c.name != cand.name] + [cand]

    def _count_step(self) -> None:
        with self._lock:
            self.done += 1

    def _step_done(self, phase: str, name: str, message: str, failed: bool = False) -> None:
        self._count_step()
        self._event(phase, "failed" if failed else "done", name, message)


class _ProgressWatcher:
    """Turns a child's progress file into events: build done, correctness checked, each batch size measured.

    `emit_new` is also called once after the child exits, because a fast child can finish several
    steps between two polls.
    """

    def __init__(self, path: Path, runner: _CandidateRunner, name: str, step: str) -> None:
        self.path, self.runner, self.name = path, runner, name
        self._seen = -1
        self._built = self._checked = step == "measure"  # the measure step starts from a built, checked candidate
        self._batches: set[int] = set()
        self.phase = "build" if step == "build" else "profile"  # where a crash or timeout is reported
        self.path.unlink(missing_ok=True)

    def last(self) -> Candidate | None:
        try:
            return Candidate.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def poll(self, elapsed: float) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return None
        if mtime != self._seen:
            self._seen = mtime
            cand = self.last()
            if cand is not None:
                self.emit_new(cand, elapsed)
        return None

    def emit_new(self, cand: Candidate, elapsed: float) -> None:
        """Events for every step the child finished since the last look."""

        def emit(phase: str, state: str, message: str = "") -> None:
            self.runner._event(phase, state, self.name, message, elapsed)

        if cand.artifact is not None and not self._built:
            self._built = True
            self.phase = "correctness"
            emit("build", "done", f"{', '.join(cand.artifact.files) or 'nothing to build'} in {cand.build_s:.1f} s")
            emit("correctness", "start")
        if cand.correctness is not None and cand.correctness.passed and not self._checked:
            self._checked = True
            emit("correctness", "done", f"max abs {cand.correctness.max_abs:.2g}, max rel {cand.correctness.max_rel:.2g}")
        for p in cand.decision.profiles if cand.decision else ():
            if p.batch_size not in self._batches:
                self._batches.add(p.batch_size)
                emit("profile", "progress", f"batch {p.batch_size}: {p.throughput:.1f}/s, p95 {p.p95_ms:.1f} ms")


_PHASE_OF_STAGE = {"availability": "build", "build": "build", "load": "build", "correctness": "correctness", "measure": "profile"}
"""Where a failed candidate stopped -> the event phase that reports it (crash/timeout: the stage being watched)."""


def _after_interrupt(candidates: list[Candidate], finished: list[Candidate], runnable: Sequence[Backend], device: str) -> list[Candidate]:
    """What an interrupted run reports: every finished candidate, the others marked as interrupted."""
    out = list(candidates)
    seen = {c.name for c in out}
    for c in finished:
        if c.name not in seen and c.backend != EAGER:
            out.append(c)
            seen.add(c.name)
    for b in runnable:
        name = b.candidate_name(device)
        if name not in seen:
            out.append(Candidate(name, b.name, device, "skipped", "interrupted", "the run was interrupted first"))
    for c in out:
        if c.status == "built":
            c.status, c.stage, c.reason = "skipped", "interrupted", "built and correct, but the run was interrupted before it was measured"
    return out


def _accept_partial_as_memory_limit(cand: Candidate) -> None:
    """A child killed while probing a larger batch (the kernel's OOM killer) is deployable up to what it measured."""
    from optimizer.task.find_max_batch_size import MaxBatchDecision, knee_of

    profiles = sorted(cand.decision.profiles, key=lambda p: p.batch_size)
    best = max(profiles, key=lambda p: p.throughput)
    cand.decision = MaxBatchDecision(profiles, profiles[-1].batch_size, knee_of(profiles, 0.05), best.batch_size, "memory",
                                     profiles[-1].batch_size, None, f"the measuring process was killed ({cand.reason})")
    cand.status, cand.stage, cand.reason = "passed", "", ""


def _summary(cand: Candidate) -> str:
    if not cand.decision or not cand.decision.profiles:
        return ""
    best = cand.decision.best
    return f"{best.throughput:.1f}/s at batch {best.batch_size}, max batch {cand.decision.max_batch_size} ({cand.decision.decided_by})"


NGC_VERSION_VARIABLES = ("NVIDIA_PYTORCH_VERSION", "NVIDIA_TRITON_SERVER_VERSION", "TENSORRT_VERSION", "CUDA_VERSION", "PYTORCH_VERSION")
"""Set by NVIDIA's container images; recorded so a server image can refuse artifacts from another release."""


def environment(candidates: Sequence[Candidate], eager: Candidate | None) -> dict[str, object]:
    """Where the measurements were taken: machine, Python and the libraries each candidate used."""
    from optimizer import __version__

    versions: dict[str, str] = {}
    for c in [*candidates, *([eager] if eager else [])]:
        versions.update(c.versions)
    return {
        "aitune_export": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_cores": cpu_cores(),
        "libraries": versions,
        "ngc": {k: os.environ[k] for k in NGC_VERSION_VARIABLES if k in os.environ},
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
