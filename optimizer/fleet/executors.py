"""Where a fleet's exports run: one after another here (LocalExecutor), or as Ray tasks on a cluster (RayExecutor).

Both run each model through fleet/job.py's `run_job` (a fresh `aitune-export export` process) and share one
small interface: `run(jobs, on_start, on_done) -> ExecutorRun`. A failed model is an outcome, never an
exception, so it never stops the others; Ctrl-C (or SIGTERM) stops what runs and reports the rest as not run.

Placement, and why: a model's export is one unit that builds its candidates (two at a time, on every core)
and then measures each one alone. Its builds and measurements stay in that one task, on the hardware the task
reserved, because a compile beside a measurement (or two measurements side by side) changes the numbers the
choice is made on. So a CPU model reserves every CPU of one node, and a GPU model one GPU and that GPU's share
of the node's CPUs: Ray's resource accounting then never lets two measurements (or other Ray work asking for
CPUs) share a node's cores or a GPU. The driver pins each task to a node it chose (a node's CPU count is
known only per node, and nodes may differ), so more nodes or GPUs mean more models at once, and one node
runs its models one after another, like the local executor.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

from optimizer.errors import SettingsError, first_line
from optimizer.fleet.job import ModelJob, ModelOutcome, run_job
from optimizer.machine import cpu_cores

log = logging.getLogger(__name__)

StartSink = Callable[[str], None]
DoneSink = Callable[[ModelOutcome], None]


@dataclass
class ExecutorRun:
    """Every job's outcome in plan order, and whether Ctrl-C / SIGTERM stopped the run."""

    outcomes: list[ModelOutcome]
    interrupted: bool = False


class Executor(Protocol):
    """Runs exports: `on_start(name)` when a model starts, `on_done(outcome)` when it ends."""

    name: str

    def run(self, jobs: list[ModelJob], on_start: StartSink, on_done: DoneSink) -> ExecutorRun: ...

    def placement(self) -> str:
        """One sentence for the fleet report: where the exports ran and what each reserved."""
        ...


def _not_run(jobs: list[ModelJob]) -> list[ModelOutcome]:
    return [ModelOutcome(j.name, "not run", reason="the fleet was stopped before this model's turn") for j in jobs]


def _crashed(job: ModelJob, err: BaseException) -> ModelOutcome:
    return ModelOutcome(job.name, "failed", reason=f"running its export failed: {first_line(err)} (a bug: please report it with the log)",
                        report_dir=job.settings.report_dir)


def _interrupted(job: ModelJob) -> ModelOutcome:
    return ModelOutcome(job.name, "interrupted", reason="stopped by Ctrl-C or SIGTERM; its export stopped its candidates and did not publish",
                        report_dir=job.settings.report_dir)


class LocalExecutor:
    """One model after another on this machine: a measurement needs a quiet machine, so exports never overlap."""

    name = "local"

    def run(self, jobs: list[ModelJob], on_start: StartSink, on_done: DoneSink) -> ExecutorRun:
        outcomes: list[ModelOutcome] = []
        for i, job in enumerate(jobs):
            on_start(job.name)
            try:
                outcome = run_job(job)
            except KeyboardInterrupt:
                return ExecutorRun([*outcomes, _interrupted(job), *_not_run(jobs[i + 1:])], interrupted=True)
            except Exception as err:  # a bug around one model must not stop the others (a Ray task's would not either)
                log.exception("%s | running its export failed", job.name)
                outcome = _crashed(job, err)
            outcomes.append(outcome)
            on_done(outcome)
        return ExecutorRun(outcomes)

    def placement(self) -> str:
        return (f"local: one model after another on this machine ({cpu_cores()} CPUs); each export builds and then measures "
                "with the machine to itself.")


@dataclass
class _Node:
    """One alive Ray node and what this fleet runs on it now."""

    node_id: str
    address: str
    cpus: float
    gpus: int
    cpu_job: bool = False
    gpus_used: int = 0

    def fits(self, gpu: bool) -> bool:
        if gpu:
            return self.gpus > self.gpus_used and not self.cpu_job
        return self.cpus > 0 and not self.cpu_job and not self.gpus_used

    def can_ever_fit(self, gpu: bool) -> bool:
        return self.gpus > 0 if gpu else self.cpus > 0

    def request(self, gpu: bool) -> dict[str, Any]:
        """Ray resources for one model here: every CPU, or one GPU and its share of the CPUs (2 decimals, Ray's granularity)."""
        if gpu:
            return {"num_gpus": 1, "num_cpus": math.floor(self.cpus / self.gpus * 100) / 100}
        return {"num_cpus": self.cpus, "num_gpus": 0}

    def take(self, gpu: bool, back: bool = False) -> None:
        step = -1 if back else 1
        if gpu:
            self.gpus_used += step
        else:
            self.cpu_job = not back


@dataclass
class RayExecutor:
    """Each model is a Ray task pinned to a node, reserving what its measurement needs to be alone (see the module doc).

    `address` None starts a local Ray instance for this run (with `num_cpus`, default: this machine's cores) and stops
    it afterwards; otherwise the driver connects to that cluster ("auto", "HOST:PORT", "ray://HOST:10001").
    """

    address: str | None = None
    num_cpus: int | None = None
    name: str = "ray"
    _nodes: list[_Node] = field(default_factory=list, init=False, repr=False)  # as seen when the run started

    def placement(self) -> str:
        nodes = ", ".join(f"{n.address} ({n.cpus:g} CPUs, {n.gpus} GPUs)" for n in self._nodes) or "no node seen"
        where = f"the cluster at {self.address}" if self.address else "a local Ray instance"
        return (f"ray on {where}: each model is one task pinned to a node; a CPU model reserves all of that node's CPUs, a GPU "
                "model one GPU and its share of the CPUs, and its builds and measurements run inside that reservation, so no two "
                f"measurements share a node's cores or a GPU. Nodes: {nodes}.")

    def run(self, jobs: list[ModelJob], on_start: StartSink, on_done: DoneSink) -> ExecutorRun:
        ray = _import_ray()
        try:
            owned = self._connect(ray)
        except KeyboardInterrupt:  # stopped while Ray was starting: nothing ran
            ray.shutdown()
            return ExecutorRun(_not_run(jobs), interrupted=True)
        try:
            return self._run(ray, jobs, on_start, on_done)
        finally:
            if owned:
                ray.shutdown()

    def _connect(self, ray: Any) -> bool:
        """Start or join Ray; True when this run connected (and so disconnects, stopping a local instance it started)."""
        if ray.is_initialized():
            return False
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if in_main else None
        try:
            if self.address is None:
                ray.init(address="local", num_cpus=self.num_cpus or cpu_cores(), include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING)
            else:
                ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as err:
            where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray instance"
            auth = ("; if the cluster uses token authentication (Ray enables it when ~/.ray/auth_token exists), give this command its "
                    "token too: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN" if self.address else "")
            raise SettingsError(f"could not start or reach {where}: {first_line(err)}; start one with `ray start --head` and set "
                                f"address in the plan (or remove address for a local instance){auth}.") from err
        finally:
            if in_main:  # ray.init replaces the driver's SIGTERM handler; the CLI's turns SIGTERM into a clean stop
                signal.signal(signal.SIGTERM, previous)
        return True

    def _run(self, ray: Any, jobs: list[ModelJob], on_start: StartSink, on_done: DoneSink) -> ExecutorRun:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._nodes = _alive_nodes(ray)
        task = ray.remote(max_retries=0)(run_job)  # an export is not retried: a crash is an outcome, a retry redoes minutes
        results: dict[str, ModelOutcome] = {}
        pending = deque(jobs)
        running: dict[Any, tuple[ModelJob, _Node]] = {}
        try:
            while pending or running:
                for job in list(pending):
                    node = next((n for n in self._nodes if n.fits(job.gpu)), None)
                    if node is None:
                        if not any(n.can_ever_fit(job.gpu) for n in self._nodes):
                            pending.remove(job)
                            results[job.name] = self._unplaceable(job)
                            on_done(results[job.name])
                        continue
                    pending.remove(job)
                    node.take(job.gpu)
                    if job.gpu:  # Ray hides every other GPU from the task (CUDA_VISIBLE_DEVICES): its one GPU is cuda:0
                        job = replace(job, settings=replace(job.settings, device="cuda"))
                    ref = task.options(**node.request(job.gpu), name=f"aitune-export {job.name}",
                                       scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote(job)
                    running[ref] = (job, node)
                    log.info("%s | placed on %s with %s", job.name, node.address, node.request(job.gpu))
                    on_start(job.name)
                if not running:  # cannot happen (an idle cluster fits every placeable job); never spin
                    break
                ready, _ = ray.wait(list(running), num_returns=1)
                for ref in ready:
                    job, node = running.pop(ref)
                    node.take(job.gpu, back=True)
                    results[job.name] = self._outcome(ray, ref, job)
                    on_done(results[job.name])
        except KeyboardInterrupt:
            for ref, (job, _) in running.items():
                ray.cancel(ref, force=True)  # kills the worker; its export gets SIGTERM (parent-death signal) and stops its candidates
                results[job.name] = _interrupted(job)
            for out in _not_run(list(pending)):
                results[out.name] = out
            return ExecutorRun(_in_order(jobs, results), interrupted=True)
        return ExecutorRun(_in_order(jobs, results))

    def _outcome(self, ray: Any, ref: Any, job: ModelJob) -> ModelOutcome:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:  # run_job raised: the same as a crash in the local executor
            log.error("%s | its Ray task raised:\n%s", job.name, err)
            return _crashed(job, err.cause if isinstance(err.cause, BaseException) else err)
        except ray.exceptions.RayError as err:  # the worker or its node died: the model failed, the others go on
            return ModelOutcome(job.name, "failed", reason=f"its Ray task failed: {first_line(err)}", report_dir=job.settings.report_dir)

    def _unplaceable(self, job: ModelJob) -> ModelOutcome:
        where = f"the Ray cluster at {self.address}" if self.address else "the local Ray instance"
        need = "a GPU (its device is cuda)" if job.gpu else "CPUs"
        return ModelOutcome(job.name, "failed", report_dir=job.settings.report_dir,
                            reason=f"needs {need}, and no node of {where} has one; add such a node or set device = \"cpu\" for it.")


def _in_order(jobs: list[ModelJob], results: dict[str, ModelOutcome]) -> list[ModelOutcome]:
    return [results.get(j.name) or _not_run([j])[0] for j in jobs]


def _alive_nodes(ray: Any) -> list[_Node]:
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        nodes.append(_Node(n["NodeID"], n.get("NodeManagerAddress", "?"), float(res.get("CPU", 0)), int(res.get("GPU", 0))))
    return nodes


def _import_ray() -> Any:
    """ray, imported only when a plan asks for it (a heavy import, and an optional extra)."""
    try:
        import ray
    except ImportError as err:
        raise SettingsError(f"executor = \"ray\" needs Ray, which cannot be imported ({err}); pip install 'aitune-export[fleet]', "
                            "or set executor = \"local\" in the plan.") from err
    return ray


def executor_for(kind: str, address: str | None) -> LocalExecutor | RayExecutor:
    """The executor a plan names."""
    return RayExecutor(address) if kind == "ray" else LocalExecutor()
