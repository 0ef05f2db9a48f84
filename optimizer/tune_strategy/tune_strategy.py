"""TuneStrategy: which candidates to try, how to rank the ones that passed, how to choose; policy only.

Running the candidates (child processes, the cache, progress, Ctrl-C) is task/scheduler.py's job;
a strategy hands it backends and gets Candidates back, then ranks them against eager. Candidates
that fail to build, fail correctness or cannot run are kept in the result with their reason.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Sequence

from optimizer.backend import Backend
from optimizer.backend.precision import left_out, precision_pairs, precision_record
from optimizer.errors import NoCandidateError, SettingsError
from optimizer.events import Event
from optimizer.machine import environment, native_bf16
from optimizer.records.candidate import Candidate
from optimizer.records.correctness import tolerances_to_json
from optimizer.records.tune_result import TuneResult
from optimizer.task.context import TuneContext
from optimizer.task.correctness import precision_tolerances
from optimizer.task.paired import PairedComparison, close_contenders
from optimizer.task.release_gate import ReleaseGate
from optimizer.task.scheduler import CandidateScheduler, ScheduleOutcome
from optimizer.tune_strategy.mixin.find_max_batch_size_mixin import FindMaxBatchSizeMixin
from optimizer.vocab import EAGER_GATES, WORKFLOWS, Device


class TuneStrategy(FindMaxBatchSizeMixin, ABC):
    """Base of every strategy. Subclasses define `candidate_backends` and `_metric` (or `_rank`)."""

    name: ClassVar[str] = "base"
    higher_is_better: ClassVar[bool] = True  # the ranking metric: throughput (True) or latency (False)
    settles_close_calls: ClassVar[bool] = False  # re-measure the leader and close challengers in pairs before choosing

    def __init__(
        self,
        eager_gate: str = "enabled",
        max_batch_size: int | str | None = "auto",
        latency_budget_ms: float | None = None,
        percentile: int = 95,
        memory_budget_mb: float | None = None,
        find_max_batch_size: bool = True,
        search_cap: int = 256,
        workflow: str = "aot",
        release_gate: ReleaseGate | None = None,
    ) -> None:
        if eager_gate not in EAGER_GATES:
            raise SettingsError(f"eager gate {eager_gate!r} is not one of {', '.join(EAGER_GATES)}.")
        if workflow not in WORKFLOWS:
            raise ValueError(f"workflow {workflow!r} is not one of 'aot' or 'jit'.")
        self.eager_gate = eager_gate
        self.workflow = workflow
        self.release_gate = release_gate  # None: no target release is checked (the Python API without a plan)
        self._init_batch_policy(max_batch_size, latency_budget_ms, percentile, memory_budget_mb, find_max_batch_size, search_cap)

    # -- what subclasses decide -------------------------------------------------------------
    @abstractmethod
    def candidate_backends(self, module: Any, device: Device | str = "cpu") -> list[Backend]:
        """The candidates this strategy tries for `module` on `device`, in order."""

    def _candidate_backends(self, ctx: TuneContext) -> list[Backend]:
        return self.candidate_backends(ctx.model.module, ctx.device)

    def backends_for_run(self, module: Any, device: Device | str, precision: str, cache_root: Path | None,
                         calibration: str | None = None) -> list[Backend]:
        """The candidates as a run configures them: one per (backend, precision) pair of its --precision (INT8 ones
        calibrated on `calibration`), caches under its cache root. What `tune` hands the scheduler and what `inspect`
        lists, from this one place (backend/precision.py's precision_pairs)."""
        return precision_pairs(self.candidate_backends(module, device), device, precision, cache_root, calibration, native_bf16())

    def wants_eager(self, model_format: str) -> bool:
        """Whether eager PyTorch is measured as the bar: the gate is not disabled and the model is a torch module."""
        return self.eager_gate != "disabled" and model_format == "torch"

    @abstractmethod
    def _metric(self, cand: Candidate) -> float | None:
        """The ranking value of a passed candidate (None: it has no usable measurement)."""

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
        """Hand the candidates to the scheduler (built side by side, measured alone), then select.

        Eager PyTorch is measured too unless the gate is disabled; it is the bar, never published. Candidates the
        target Triton release cannot load (`release_gate`) are skipped with the reason before anything is built.
        """
        t0 = time.perf_counter()
        backends = self.backends_for_run(ctx.model.module, ctx.device, ctx.precision, ctx.cache_root, ctx.calibration)
        if not backends:
            raise NoCandidateError(
                "no candidate backends: the strategy was given an empty list; name at least one with --backend "
                "(see `aitune-export backends`)."
            )
        deadline = time.time() + ctx.time_budget_s if ctx.time_budget_s else None
        scheduler = CandidateScheduler(ctx, self.batch_policy(ctx.recorded_batch_sizes), self.memory_budget_mb, deadline)
        refused = self._release_refusals(backends, ctx)
        runnable = [b for b in backends if b.candidate_name(ctx.device) not in refused]
        run = scheduler.run(runnable, measure_eager=self.wants_eager(ctx.model.format)) if runnable else ScheduleOutcome([], None, False)
        order = {b.candidate_name(ctx.device): i for i, b in enumerate(backends)}
        candidates = sorted([*refused.values(), *run.candidates], key=lambda c: order.get(c.name, len(order)))
        warnings: list[str] = []
        precision_notes = left_out(backends, ctx.device, ctx.precision, ctx.calibration is not None, native_bf16())
        share = scheduler.core_share
        if share is not None and share.reduced:
            warnings.append(f"{share.summary()}.")
        settled = None
        if run.interrupted:
            selected, reason = None, "the run was interrupted before a candidate could be selected"
        else:
            passed = [c for c in candidates if c.passed]
            settled = self._settle(scheduler, passed)
            selected, reason = self._select(passed, run.eager, warnings, settled)
            warnings += self._mismatch_warnings(selected, backends, ctx.device)
            ctx.on_event(Event("select", "done" if selected else "failed", selected.name if selected else "", reason))
        libraries: dict[str, str] = {}
        for c in [*candidates, *([run.eager] if run.eager else [])]:
            libraries.update(c.versions)
        return TuneResult(
            model_name=ctx.model.name,
            source=ctx.model.source.to_json(),
            signature=ctx.signature.to_json(),
            device=str(ctx.device),
            strategy=self.name,
            workflow=self.workflow,
            candidates=candidates,
            eager=run.eager,
            selected=selected.name if selected else None,
            max_batch_size=(selected.decision.max_batch_size if selected and selected.decision else 0),
            selection_reason=reason,
            reference=ctx.reference,
            eager_gate=self.eager_gate,
            warnings=warnings,
            environment=environment(libraries),
            tune_seconds=time.perf_counter() - t0,
            latency_budget_ms=self.latency_budget_ms,
            percentile=self.percentile,
            interrupted=run.interrupted,
            tolerances=self._tolerances_of(selected, ctx),
            comparison=settled.to_json() if not run.interrupted and settled is not None else None,
            triton_release=self.release_gate.to_json(backends) if self.release_gate is not None else None,
            measured_on=share.to_json() if share is not None else None,
            precision=precision_record(ctx.precision, backends, precision_notes, ctx.accuracy.to_json()),
        )

    def _release_refusals(self, backends: Sequence[Backend], ctx: TuneContext) -> dict[str, Candidate]:
        """Candidates the target release cannot load, as skipped Candidates with the reason (backend name -> Candidate).

        Only backends that could build from this model are judged: one that cannot is screened out with that reason.
        """
        if self.release_gate is None:
            return {}
        refused = {}
        for b in backends:
            check = self.release_gate.refusal(b) if ctx.model.format in b.consumes else None
            if check is not None:
                name = b.candidate_name(ctx.device)
                refused[name] = Candidate(name, b.name, str(ctx.device), status="skipped", stage="release", reason=check.message())
                ctx.on_event(Event("build", "skipped", name, check.message()))
        return refused

    def _mismatch_warnings(self, selected: Candidate | None, backends: Sequence[Backend], device: Device | str) -> list[str]:
        """One warning per check --allow-version-mismatch let through for the published candidate."""
        backend = next((b for b in backends if selected is not None and b.candidate_name(device) == selected.name), None)
        if self.release_gate is None or backend is None:
            return []
        release = self.release_gate.release.release
        return [f"published {c.backend} although Triton {release} may not load it (--allow-version-mismatch): {c.problem}."
                for c in self.release_gate.overridden(backend)]

    @staticmethod
    def _tolerances_of(selected: Candidate | None, ctx: TuneContext) -> dict[str, list[float]]:
        """The tolerance overrides the selected candidate was checked with (validation reuses them)."""
        precision = "fp32"
        if selected is not None and selected.artifact is not None:
            precision = selected.artifact.metadata.get("precision", "fp32")
        return tolerances_to_json(precision_tolerances(ctx.signature, precision, ctx.tolerances))

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

    def _settle(self, scheduler: CandidateScheduler, passed: list[Candidate]) -> PairedComparison | None:
        """A close call on throughput re-measured in pairs (task/paired.py); None when nothing is close."""
        if not self.settles_close_calls or len(passed) < 2:
            return None
        leader, _ = self._rank(passed, None)
        contenders = close_contenders(passed, leader) if leader is not None else []
        return scheduler.compare(contenders) if len(contenders) > 1 else None

    def _select(self, passed: list[Candidate], eager: Candidate | None, warnings: list[str],
                settled: PairedComparison | None = None) -> tuple[Candidate | None, str]:
        best, why = self._select_ranked(passed, eager, warnings)
        if best is None or settled is None or best.name != settled.leader:
            return best, why
        winner = next((c for c in passed if c.name == settled.winner), best)
        gated = winner is not best and self.eager_gate == "enabled" and not settled.above_leader(winner.name) and self._beats_eager(winner, eager) is False
        if winner is best or gated:  # the gate holds: a tie never publishes a candidate slower than eager, and the reason says so
            return best, f"{why}; {settled.summary}" + (f"; {winner.name} is not published: its separate measurement ({self._fmt(self._metric(winner))}) "
                                                        f"did not beat eager and the paired interval does not put it above {best.name}" if gated else "")
        return winner, f"{settled.summary} (the separate measurements said: {why})"

    def _select_ranked(self, passed: list[Candidate], eager: Candidate | None, warnings: list[str]) -> tuple[Candidate | None, str]:
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
