"""TuneStrategy: build each candidate, check it against the reference, measure it, choose, explain.

Each candidate runs in its own process (task/isolation.py). Candidates that fail to build, fail
correctness or cannot run are kept in the result with their reason; they never end the run.
Concrete strategies only say which candidates to try and how to rank the ones that passed.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import ClassVar, Sequence

from optimizer.backend import EAGER, Backend, backend_named
from optimizer.backend.base import cpu_cores
from optimizer.errors import NoCandidateError, SettingsError
from optimizer.events import Event
from optimizer.task.correctness import precision_tolerances
from optimizer.task.evaluation import Candidate, CandidateJob
from optimizer.task.find_max_batch_size import BatchPolicy
from optimizer.task.isolation import run_isolated
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

    def _fmt(self, value: float) -> str:
        return f"{value:.1f}/s" if self.higher_is_better else f"{value:.2f} ms"

    # -- the shared run -----------------------------------------------------------------------
    def tune(self, ctx: TuneContext) -> TuneResult:
        """Evaluate every candidate (and eager, unless the gate is disabled) and select one."""
        t0 = time.perf_counter()
        backends = [b.at_precision(ctx.precision) for b in self._candidate_backends(ctx)]
        if not backends:
            raise NoCandidateError(
                "no candidate backends: the strategy was given an empty list; name at least one with --backend "
                "(see `aitune-export backends`)."
            )
        policy = self.batch_policy(ctx.recorded_batch_sizes)
        deadline = time.time() + ctx.time_budget_s if ctx.time_budget_s else None
        candidates: list[Candidate] = []
        runnable: list[Backend] = []
        for b in backends:
            cand = Candidate(b.candidate_name(ctx.device), b.name, ctx.device)
            if ctx.model.format not in b.consumes:
                cand.status, cand.stage = "skipped", "availability"
                cand.reason = f"{b.name} cannot build from a {ctx.model.format} model (it takes: {', '.join(sorted(b.consumes))})"
            elif not b.publishable:
                cand.status, cand.stage, cand.reason = "skipped", "availability", f"{b.name} is a baseline and is never published"
            else:
                av = b.availability(ctx.device)
                if not av:
                    cand.status, cand.stage, cand.reason = "unavailable", "availability", av.reason
                else:
                    runnable.append(b)
                    continue
            ctx.on_event(Event("build", "skipped", cand.name, cand.reason))
            candidates.append(cand)
        eager = None
        total = len(runnable) + (1 if self._wants_eager(ctx) else 0)
        done = 0
        if self._wants_eager(ctx):
            eager = self._evaluate(backend_named(EAGER), ctx, policy, deadline, done, total)
            done += 1
            if eager.passed and eager.decision and eager.decision.knee:
                runnable = [b.with_batch_hint(eager.decision.knee) for b in runnable]
        for b in runnable:
            candidates.append(self._evaluate(b, ctx, policy, deadline, done, total))
            done += 1
        order = {b.name: i for i, b in enumerate(backends)}
        candidates.sort(key=lambda c: order.get(c.backend, len(order)))
        passed = [c for c in candidates if c.passed]
        warnings: list[str] = []
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
        )

    def _wants_eager(self, ctx: TuneContext) -> bool:
        return self.eager_gate != "disabled" and ctx.model.format == "torch"

    def _beats_eager(self, cand: Candidate, eager: Candidate | None) -> bool | None:
        """None when there is nothing to compare with."""
        if eager is None or not eager.passed:
            return None
        mine, theirs = self._metric(cand), self._metric(eager)
        if mine is None or theirs is None:
            return None
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

    def _evaluate(self, backend: Backend, ctx: TuneContext, policy: BatchPolicy, deadline: float | None, done: int, total: int) -> Candidate:
        name = backend.candidate_name(ctx.device)
        workdir = ctx.workdir / "candidates" / name.replace("[", "_").replace("]", "").replace(":", "_")
        cached = ctx.cache.lookup(backend, ctx, policy) if ctx.cache is not None else None
        if cached is not None:
            ctx.on_event(Event("profile", "done", name, "reused from the cache", done + 1, total))
            return cached
        job = CandidateJob(
            backend=backend.name,
            device=ctx.device,
            source=ctx.model.source.to_json(),
            signature=ctx.signature.to_json(),
            workdir=str(workdir),
            correctness_feeds=ctx.reference.feeds,
            reference_outputs=ctx.reference.outputs,
            correctness_points=ctx.reference.points,
            profile_feed=ctx.reference.profile_feed,
            policy=policy.to_json(),
            profile=ctx.profile.__dict__,
            backend_settings=backend.settings,
            tolerances={k: [t.atol, t.rtol] for k, t in precision_tolerances(ctx.signature, backend.settings["precision"], ctx.tolerances).items()},
            state_dict=ctx.state_dict,
            memory_budget_mb=self.memory_budget_mb,
            deadline=deadline,
        )
        ctx.on_event(Event("build", "start", name, "", done, total))
        watcher = _StageWatcher(workdir / "progress.json", ctx, name, done, total)
        outcome = run_isolated("optimizer.task.evaluation:evaluate_candidate", job.to_json(), workdir, None, "evaluate", watcher.poll)
        if outcome.ok:
            cand = Candidate.from_json(outcome.value)
        else:
            cand = watcher.last() or Candidate(name, backend.name, ctx.device)
            cand.status, cand.stage = "failed", ("timeout" if outcome.timed_out else "crash")
            cand.reason = f"{watcher.stage_label()} {outcome.reason}".strip()
            if outcome.signal == "SIGKILL" and watcher.stage == "profile" and cand.decision and cand.decision.profiles:
                _accept_partial_as_memory_limit(cand)
        cand.log = str(workdir / "evaluate.log")
        state = "done" if cand.passed else "failed"
        ctx.on_event(Event("profile", state, name, cand.reason or _summary(cand), done + 1, total))
        if ctx.cache is not None and cand.passed:
            ctx.cache.store(backend, ctx, policy, cand)
        return cand


class _StageWatcher:
    """Turns the child's progress file into events and enforces the per-stage timeouts."""

    def __init__(self, path: Path, ctx: TuneContext, name: str, done: int, total: int) -> None:
        self.path, self.ctx, self.name, self.done, self.total = path, ctx, name, done, total
        self.stage = "build"
        self.stage_since = 0.0
        self._seen = -1.0
        self.path.unlink(missing_ok=True)

    def last(self) -> Candidate | None:
        try:
            return Candidate.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def stage_label(self) -> str:
        return {"build": "while building:", "correctness": "while checking correctness:", "profile": "while measuring:"}.get(self.stage, "")

    def poll(self, elapsed: float) -> str | None:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            mtime = -1.0
        if mtime != self._seen and mtime > 0:
            self._seen = mtime
            cand = self.last()
            if cand is not None:
                stage = "profile" if cand.decision else ("correctness" if cand.artifact else "build")
                if stage != self.stage:
                    self.stage, self.stage_since = stage, elapsed
                msg = ""
                if cand.decision and cand.decision.profiles:
                    p = cand.decision.profiles[-1]
                    msg = f"batch {p.batch_size}: {p.throughput:.1f}/s"
                self.ctx.on_event(Event(self.stage, "progress", self.name, msg, self.done, self.total, elapsed))
        limit = self.ctx.build_timeout_s if self.stage in ("build", "correctness") else self.ctx.profile_timeout_s
        if limit is not None and elapsed - self.stage_since > limit:
            flag = "--build-timeout" if self.stage in ("build", "correctness") else "--profile-timeout"
            return f"timed out after {limit:.0f} s; raise {flag} if it needs longer"
        return None


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
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
