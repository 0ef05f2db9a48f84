"""The export-many use case: a plan of many models -> one export each (here, or as Ray tasks) -> the fleet report.

Reads as its steps: load and check the plan, set aside the models that are unchanged since the last run,
hand the rest to the plan's executor, write fleet.json and report.md beside the models' own reports.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from optimizer.app.plan import check_settings
from optimizer.errors import CheckFailed, Interrupted
from optimizer.fleet.executors import Executor, ExecutorRun, LocalExecutor, executor_for
from optimizer.fleet.fleet_report import fleet_record, read_previous, write_fleet_report
from optimizer.fleet.job import ModelJob, ModelOutcome
from optimizer.fleet.plan import FleetPlan, load_plan
from optimizer.fleet.rerun import settings_key, unchanged

FORWARDED_ENV = ("PYTHONPATH", "AITUNE_EXPORT_CACHE_DIR", "XDG_CACHE_HOME")
"""Driver environment a Ray worker's export gets too (where models import from, where the cache lives)."""
RAY_SETS = ("OMP_NUM_THREADS",)
"""Set by Ray in its tasks (to the task's CPUs). A CPU model has every CPU of its node, so unless the driver sets it too its
export runs without it, as a local one does; a GPU model keeps it (exports on one node's GPUs share its CPUs)."""


@dataclass
class FleetOutcome:
    """Every model's outcome in plan order, the fleet record and where it was written."""

    outcomes: list[ModelOutcome]
    record: dict[str, Any]
    json_path: Path
    markdown_path: Path
    interrupted: bool = False

    def raise_for_status(self) -> None:
        """Interrupted (exit 130) when Ctrl-C stopped the fleet, CheckFailed (exit 1) when a model failed; else nothing."""
        if self.interrupted:
            raise Interrupted(f"interrupted; the running exports were stopped before publishing. The fleet report is {self.markdown_path}.")
        failed = [o for o in self.outcomes if o.status == "failed"]
        if failed:
            names = ", ".join(o.name for o in failed)
            raise CheckFailed(f"{len(failed)} of {len(self.outcomes)} models failed ({names}); the others were still run. "
                              f"Reasons: {self.markdown_path}.")


def _nothing(_: Any) -> None:
    """The default listener: the API stays silent unless the caller listens."""


def _write_job(plan: FleetPlan) -> dict[str, Any]:
    """The plan as a Kubernetes Indexed Job (one pod per entry) beside the fleet report, when the plan names its image."""
    from optimizer.fleet.manifests import JOB_FILE, KSERVE_DIR, indexed_job, write_manifest
    from optimizer.machine import cpu_cores

    if not plan.image:
        return {"path": None, "reason": "the plan names no image; add image = \"REGISTRY/IMAGE:TAG\" (with aitune-export and the models' "
                                        f"code) to write {KSERVE_DIR}/{JOB_FILE}"}
    resources: dict[str, str | int] = {"cpu": cpu_cores()}  # what each export measured on here, as a whole
    if any(m.gpu for m in plan.models):
        resources["nvidia.com/gpu"] = 1
    job = indexed_job([m.name for m in plan.models], plan.image, str(plan.path), resources=resources)
    return {"path": str(write_manifest(plan.report_dir / KSERVE_DIR / JOB_FILE, job)), "reason": ""}


def export_many(plan: FleetPlan | Path, *, report_dir: str | None = None, index: int | None = None, force: bool = False,
                on_start: Callable[[str], None] = _nothing, on_done: Callable[[ModelOutcome], None] = _nothing,
                executor: Executor | None = None) -> FleetOutcome:
    """Export every model of PLAN (or only entry `index`, on this machine) and write the fleet report.

    Args:
        plan: a checked plan (load_plan), or the path of the TOML file.
        report_dir: when `plan` is a path, the fleet report's folder (default: the plan's report-dir, else aitune-reports/fleet); each model
            reports into NAME/ below it unless its table sets report-dir.
        index: run only this 0-based plan entry, here, whatever the plan's executor (one pod of a Kubernetes Indexed
            Job); its fleet files are fleet-INDEX.json and report-INDEX.md, so pods sharing a volume do not collide.
        force: export models that look unchanged since the last run too (fleet/rerun.py says what "unchanged" sees).
        executor: run with this one instead of the plan's (benchmarks compare executors on one plan).
    Raises:
        SettingsError: the plan is malformed (nothing runs). A failed model is an outcome, not an exception.
    """
    if not isinstance(plan, FleetPlan):
        plan = load_plan(Path(plan), report_dir, check_settings)
    cwd = Path.cwd()
    entries = [plan.entry(index)] if index is not None else list(plan.models)
    suffix = f"-{index}" if index is not None else ""
    previous = {} if force else read_previous(plan.report_dir, suffix)
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    unset = tuple(k for k in RAY_SETS if k not in os.environ)
    results: dict[str, ModelOutcome] = {}
    keys: dict[str, str] = {}
    jobs = []
    for m in entries:
        keys[m.name] = settings_key(m.settings, cwd)
        before = previous.get(m.name)
        if before is not None and unchanged(before, keys[m.name], m.settings, cwd):
            results[m.name] = replace(before, status="unchanged", seconds=0.0,
                                      reason="settings and model files as in the last run, and that version is still in the repository")
            on_done(results[m.name])
        else:
            jobs.append(ModelJob(m.name, m.settings, str(cwd), env, () if m.gpu else unset, m.gpu))
    if executor is None:
        executor = LocalExecutor() if index is not None else executor_for(plan.executor, plan.address)
    t0 = time.perf_counter()
    run = executor.run(jobs, on_start, on_done) if jobs else ExecutorRun([])
    for outcome in run.outcomes:
        outcome.key = keys[outcome.name]
        results[outcome.name] = outcome
    outcomes = [results[m.name] for m in entries]
    placement = executor.placement() if jobs else "nothing ran: every model was unchanged since the last run."
    record = fleet_record(plan.path, executor.name, placement, outcomes, time.perf_counter() - t0)
    if index is None:  # a pod of the Job (--index) does not rewrite the Job
        record["job_manifest"] = _write_job(plan)
    json_path, md_path = write_fleet_report(plan.report_dir, record, suffix)
    return FleetOutcome(outcomes, record, json_path, md_path, run.interrupted)
