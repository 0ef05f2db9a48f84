"""One model of a fleet: its export run as a fresh `aitune-export export` process, and what it produced.

Every executor runs a model the same way, here or inside a Ray task: a child process that is exactly the
command a user would type (`aitune-export export --config <the model's settings>`). That keeps the export's
own guarantees (Ctrl-C and SIGTERM stop its candidate processes, bad input is one line and exit 2), isolates a
crash or a leak (ONNX Runtime's arena never shrinks) to one model, and avoids starting the export's
spawned candidate processes from inside a Ray worker, whose main module and signal handlers are Ray's.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optimizer.errors import SettingsError
from optimizer.records.report_file import read_report
from optimizer.records.served_search import ServedSearch
from optimizer.settings import ExportSettings
from optimizer.task.isolation import parent_death_signal

log = logging.getLogger(__name__)

STATUSES = ("published", "unchanged", "failed", "interrupted", "not run")
"""published: exported now; unchanged: the earlier export stands (optimizer/fleet/rerun.py); not run: stopped before its turn."""
STOP_GRACE_S = 30.0
"""How long a stopped export may take to stop its candidates and exit before it is killed."""


@dataclass(frozen=True)
class ModelJob:
    """What a worker needs to export one model: plain, picklable values (a Ray task may run on another node)."""

    name: str
    settings: ExportSettings
    cwd: str  # the driver's working folder: relative paths in the plan mean what they mean there
    env: dict[str, str] = field(default_factory=dict)  # added to the worker's environment
    unset: tuple[str, ...] = ()  # removed from it: what Ray sets for its tasks but the driver did not (OMP_NUM_THREADS)
    gpu: bool = False


@dataclass
class ModelOutcome:
    """How one model's export ended, with the numbers the fleet report shows; JSON-able as is."""

    name: str
    status: str
    reason: str = ""
    backend: str | None = None
    max_batch_size: int | None = None
    throughput: float | None = None  # samples per second
    throughput_source: str = ""  # "served at concurrency N (stand-in backend)" or "in-process"
    model_dir: str | None = None
    version: int | None = None
    report_dir: str | None = None
    seconds: float = 0.0
    node: str = ""  # the host the export ran on
    exit_code: int | None = None
    key: str = ""  # rerun.settings_key: what an unchanged re-run must match

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelOutcome:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def run_job(job: ModelJob) -> ModelOutcome:
    """Export one model in a child process and summarize its report.json; never raises for a failed export.

    Ctrl-C, SIGTERM or a cancelled Ray task stop the child (it stops its own candidates), then re-raise.
    The child's output goes to export.log in the model's report folder.
    """
    t0 = time.perf_counter()
    cwd = job.cwd if Path(job.cwd).is_dir() else os.getcwd()  # another node may not have the driver's folder
    report_dir = Path(cwd) / (job.settings.report_dir or f"aitune-reports/{job.name}")
    outcome = ModelOutcome(job.name, "failed", report_dir=str(report_dir), node=socket.gethostname())
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        outcome.reason = f"cannot create the report folder {str(report_dir)!r}: {err.strerror or err}; set report-dir for this model."
        return outcome
    log_path = report_dir / "export.log"
    with tempfile.TemporaryDirectory(prefix="aitune-fleet-") as tmp:
        config = Path(tmp) / "settings.toml"
        config.write_text(job.settings.to_toml())
        cmd = [sys.executable, "-m", "optimizer.cli", "-q", "export", "--config", str(config)]
        with open(log_path, "w") as log_file:
            log_file.write(f"# {job.name} on {outcome.node}: aitune-export export with\n{job.settings.to_toml()}\n")
            log_file.flush()
            # its own session: a terminal's Ctrl-C reaches the driver only, which stops the export with one SIGTERM
            env = {k: v for k, v in {**os.environ, **job.env}.items() if k not in job.unset}
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=parent_death_signal(signal.SIGTERM))
            try:
                outcome.exit_code = proc.wait()
            except BaseException:  # Ctrl-C, SIGTERM turned into KeyboardInterrupt, or a Ray cancel: stop the export, then go on stopping
                stop_process(proc)
                raise
    outcome.seconds = time.perf_counter() - t0
    _fill(outcome, log_path, report_dir / "report.json", started=time.time() - outcome.seconds)
    return outcome


def _fill(outcome: ModelOutcome, log_path: Path, report_path: Path, started: float) -> None:
    """Status and numbers from the exit status, the log's `error:` line and report.json."""
    code = outcome.exit_code
    if code == 0:
        outcome.status = "published"
        try:
            _apply(outcome, summarize(report_path))
        except SettingsError as err:
            outcome.status, outcome.reason = "failed", f"the export exited 0 but its report cannot be read: {err}"
        return
    outcome.status = "interrupted" if code in (130, -signal.SIGINT, -signal.SIGTERM) else "failed"
    outcome.reason = _error_line(log_path) or f"the export exited with status {code}; see {log_path}"
    if report_path.is_file() and report_path.stat().st_mtime >= started:  # e.g. published, then validation failed
        try:
            _apply(outcome, {k: v for k, v in summarize(report_path).items() if v is not None})
        except SettingsError as err:
            log.debug("%s | report not summarized: %s", outcome.name, err)


def _apply(outcome: ModelOutcome, values: dict[str, Any]) -> None:
    for key, value in values.items():
        setattr(outcome, key, value)


def summarize(report_path: Path) -> dict[str, Any]:
    """The fleet report's numbers from one report.json: backend, published max batch, throughput and where it was measured."""
    result, _, doc = read_report(report_path)
    published = doc.get("published") or {}
    if result.selected is None:  # nothing passed: the export's error line says why
        return {}
    chosen = result.selected_candidate
    config = published.get("config") or {}
    search = ServedSearch.from_json(published["served_search"]) if published.get("served_search") else None
    variant = search.chosen_variant if search is not None and search.status == "searched" else None
    if variant is not None and variant.throughput:
        throughput = variant.throughput
        source = f"served at concurrency {search.concurrency}" + (" (stand-in backend)" if search.stand_in else "")
    else:
        throughput, source = chosen.best_throughput, "in-process"
    return {"backend": result.selected, "max_batch_size": config.get("max_batch_size", result.max_batch_size),
            "throughput": throughput, "throughput_source": source, "model_dir": published.get("model_dir"),
            "version": published.get("version")}


def _error_line(log_path: Path) -> str:
    """The export's one-line error (`error: ...`), or the last line of a traceback."""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line[len("error: "):] for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1]
    if lines and not lines[-1].startswith("#"):
        return f"{lines[-1]} (see {log_path})"
    return ""


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM (the export then stops its candidates and exits), SIGKILL after STOP_GRACE_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
