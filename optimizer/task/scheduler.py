"""The candidate scheduler: each candidate's build and measure steps in child processes, and what came of them.

Builds run side by side (up to BUILD_WORKERS_MAX; compilers are mostly serial), measurements one at
a time on a quiet machine. Children write a progress file after every step; a watcher turns it into
events, and a crashed or timed-out child still reports what it finished. The cache is consulted
before each step. Ctrl-C stops every child and keeps what finished.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from optimizer.backend import EAGER, Backend, backend_named
from optimizer.events import Event
from optimizer.machine import cpu_cores
from optimizer.records.candidate import Candidate
from optimizer.records.correctness import tolerances_to_json
from optimizer.records.measurements import BatchPolicy, MaxBatchDecision
from optimizer.task.context import TuneContext
from optimizer.task.core_share import CoreShare, probe
from optimizer.task.correctness import precision_tolerances
from optimizer.task.evaluation import BuildJob, MeasureJob
from optimizer.task.find_max_batch_size import knee_of, scaled_for_cores
from optimizer.task.isolation import ChildOutcome, run_isolated, stop_all_children
from optimizer.task.paired import PairedComparison, decide
from optimizer.task.screening import screen
from optimizer.vocab import Device

BUILD_WORKERS_MAX = 2
"""Builds running at once: compilers are mostly serial, so two keep two cores busy."""


log = logging.getLogger(__name__)

@dataclass
class ScheduleOutcome:
    """Every candidate of a run (screened out, failed or measured), eager's measurement, and whether Ctrl-C cut it short."""

    candidates: list[Candidate]
    eager: Candidate | None
    interrupted: bool


class CandidateScheduler:
    """Runs the build and measure steps of candidates in child processes and turns outcomes into Candidates.

    It takes plain values (the run's context, the batch policy, the memory budget, the deadline), not
    the strategy: which candidates to try and how to rank them is the strategy's business.
    """

    def __init__(self, ctx: TuneContext, policy: BatchPolicy, memory_budget_mb: float | None, deadline: float | None) -> None:
        self.ctx, self.policy, self.memory_budget_mb, self.deadline = ctx, policy, memory_budget_mb, deadline
        self._lock = threading.Lock()
        self._backend_of: dict[str, Backend] = {}  # candidate name -> the configured backend that built it
        self.finished: list[Candidate] = []  # every finished step's latest record (kept for an interrupted run)
        self.total = 0
        self.done = 0
        self.core_share: CoreShare | None = None  # the cores every measurement of this run is pinned to (probed in run)

    def _workdir(self, name: str) -> Path:
        return self.ctx.workdir / "candidates" / name.replace("[", "_").replace("]", "").replace(":", "_")

    def _event(self, phase: str, state: str, name: str, message: str = "", elapsed: float = 0.0) -> None:
        with self._lock:
            self.ctx.on_event(Event(phase, state, name, message, self.done, self.total, elapsed))

    def run(self, backends: Sequence[Backend], measure_eager: bool) -> ScheduleOutcome:
        """Screen every backend, measure eager first (on a quiet machine: its knee is the batch engines are
        optimized for), build the runnable ones side by side, then measure each alone."""
        ctx = self.ctx
        candidates: list[Candidate] = []
        runnable: list[Backend] = []
        for s in (screen(b, ctx.model.format, ctx.device) for b in backends):
            if s.runnable:
                runnable.append(s.backend)
                continue
            candidates.append(Candidate(s.name, s.backend.name, str(ctx.device), status=s.status, stage="availability", reason=s.reason))
            ctx.on_event(Event("build", "skipped", s.name, s.reason))
        self.total = 2 * len(runnable) + (1 if measure_eager else 0)  # build + measure each, measure eager
        eager = None
        if (runnable or measure_eager) and ctx.device.kind == "cpu":  # a GPU's batch curve does not depend on the host's threads
            self.core_share = probe()  # before any child of ours runs: what it sees busy is another job's
            if self.core_share.reduced:
                ctx.on_event(Event("profile", "progress", "", self.core_share.summary()))
        try:
            if measure_eager:
                eager = self.measure(self.eager_built())
                if eager.passed and eager.decision is not None and eager.decision.knee:
                    runnable = [b.with_batch_hint(eager.decision.knee) for b in runnable]
            for cand in self.build_all(runnable):
                candidates.append(self.measure(cand) if cand.status == "built" else cand)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop every child, keep what finished
            stop_all_children()
            eager = next((c for c in self.finished if c.backend == EAGER), None)
            return ScheduleOutcome(_after_interrupt(candidates, self.finished, runnable, ctx.device), eager, True)
        return ScheduleOutcome(candidates, eager, False)

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
        """One candidate's build-and-check step: from the cache, else in a child process (stopped at --build-timeout)."""
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
            device=str(ctx.device),
            source=ctx.model.source.to_json(),
            signature=ctx.signature.to_json(),
            workdir=str(workdir),
            correctness_feeds=ctx.reference.feeds,
            reference_outputs=ctx.reference.outputs,
            correctness_points=ctx.reference.points,
            batch_max=self.policy.cap,
            backend_settings=backend.settings,
            tolerances=tolerances_to_json(precision_tolerances(ctx.signature, backend.settings["precision"], ctx.tolerances)),
            state_dict=ctx.state_dict,
            accuracy=ctx.accuracy.to_json() if backend.settings["precision"] != "fp32" else None,
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
        return Candidate(name, backend.name, str(self.ctx.device), status="built", artifact=art)

    # -- measure ----------------------------------------------------------------------------
    def measure(self, cand: Candidate) -> Candidate:
        """One built candidate's max-batch search: from the cache, else alone in a fresh child process."""
        ctx = self.ctx
        backend = self._backend_of[cand.name]
        workdir = self._workdir(cand.name)
        budget = self.memory_budget_mb
        # measurements on fewer cores than the machine has compare only with each other: none is reused or kept
        cache = ctx.cache if self._pin() is None else None
        cached = cache.lookup_measurement(backend, ctx, self.policy, budget, cand) if cache is not None else None
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
            memory_budget_mb=self.memory_budget_mb,
            deadline=self.deadline,
        )
        self._event("profile", "start", cand.name)
        watcher = _ProgressWatcher(workdir / "progress.json", self, cand.name, "measure")
        outcome = run_isolated("optimizer.task.evaluation:measure_candidate", job.to_json(), workdir, ctx.profile_timeout_s, "measure", watcher.poll,
                               cores=self._pin())
        result = self._outcome(outcome, watcher, backend, "measure", "--profile-timeout", before=cand)
        if result.decision is not None and self.core_share is not None:
            result.decision = scaled_for_cores(result.decision, self.core_share, self.policy.cap)
        watcher.emit_new(result, outcome.seconds)
        result.log = cand.log + ("," if cand.log else "") + str(workdir / "measure.log")
        if result.passed and cache is not None:
            cache.store_measurement(backend, ctx, self.policy, budget, result)
        self._step_done("profile", cand.name, result.reason or _summary(result), failed=not result.passed)
        self._finish(result)
        return result

    # -- settle a close call ----------------------------------------------------------------------
    def compare(self, contenders: list[Candidate]) -> PairedComparison | None:
        """The leader (first) and its close challengers timed alternately in one fresh process (task/paired.py);
        None when that process fails (the separate measurements then stand)."""
        ctx = self.ctx
        batches = {c.name: (c.decision.peak or c.decision.best_batch) if c.decision else 1 for c in contenders}
        payload = {
            "candidates": [c.to_json() for c in contenders],
            "batches": batches,
            "signature": ctx.signature.to_json(),
            "profile_feed": ctx.reference.profile_feed,
            "source": ctx.model.source.to_json(),
            "state_dict": ctx.state_dict,
            "backend_settings": {c.name: self._backend_of[c.name].settings for c in contenders if c.name in self._backend_of},
        }
        names = ", ".join(c.name for c in contenders)
        self._event("select", "progress", contenders[0].name, f"paired re-measurement of {names}")
        workdir = self._workdir("paired")
        outcome = run_isolated("optimizer.task.paired:compare_candidates", payload, workdir, ctx.profile_timeout_s, "compare", cores=self._pin())
        if not outcome.ok:
            log.warning("the paired re-measurement of %s failed (%s); the separate measurements decide", names, outcome.reason)
            return None
        comparison = PairedComparison(contenders[0].name, batches, outcome.value["rounds"], seconds=round(outcome.seconds, 2))
        return decide(comparison, {c.name: c.backend for c in contenders})

    def _pin(self) -> list[int] | None:
        return self.core_share.pin if self.core_share is not None else None

    def _outcome(self, outcome: ChildOutcome, watcher: _ProgressWatcher, backend: Backend, step: str, flag: str,
                 before: Candidate | None = None) -> Candidate:
        if outcome.ok:
            return Candidate.from_json(outcome.value)
        cand = watcher.last() or before or Candidate(backend.candidate_name(self.ctx.device), backend.name, str(self.ctx.device))
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

    def __init__(self, path: Path, runner: CandidateScheduler, name: str, step: str) -> None:
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
            acc = cand.correctness.accuracy  # a bf16 / INT8 candidate: what the gate judged it by
            gate = f"accuracy gate: {acc.summary()}, " if acc is not None else ""
            emit("correctness", "done", f"{gate}max abs {cand.correctness.max_abs:.2g}, max rel {cand.correctness.max_rel:.2g}")
        for p in cand.decision.profiles if cand.decision else ():
            if p.batch_size not in self._batches:
                self._batches.add(p.batch_size)
                emit("profile", "progress", f"batch {p.batch_size}: {p.throughput:.1f}/s, p95 {p.p95_ms:.1f} ms")


_PHASE_OF_STAGE = {"availability": "build", "build": "build", "load": "build", "correctness": "correctness", "measure": "profile"}
"""Where a failed candidate stopped -> the event phase that reports it (crash/timeout: the stage being watched)."""


def _after_interrupt(candidates: list[Candidate], finished: list[Candidate], runnable: Sequence[Backend], device: Device | str) -> list[Candidate]:
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
            out.append(Candidate(name, b.name, str(device), "skipped", "interrupted", "the run was interrupted first"))
    for c in out:
        if c.status == "built":
            c.status, c.stage, c.reason = "skipped", "interrupted", "built and correct, but the run was interrupted before it was measured"
    return out


def _accept_partial_as_memory_limit(cand: Candidate) -> None:
    """A child killed while probing a larger batch (the kernel's OOM killer) is deployable up to what it measured."""

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
