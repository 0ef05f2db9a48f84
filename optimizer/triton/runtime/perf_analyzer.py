"""perf_analyzer 2.51 (shipped in the tritonclient 2.51 wheel): its input data, its command line and its results.

The input data (real samples, exact bytes) are written by perf_analyzer_input.py. `run_perf_analyzer` runs a concurrency
sweep with settings that settle on a small, noisy CPU machine, and parses the CSV (whose rows are not
in concurrency order) and the console's server-side inference/execution counts (the batch size the
dynamic batcher really formed).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from optimizer.errors import SettingsError, ValidationError
from optimizer.task.isolation import parent_death_signal
from optimizer.triton.runtime.install import ToolMissing
from optimizer.triton.runtime.perf_analyzer_console import last_level, parse_server_counts, perf_analyzer_error, unsettled

log = logging.getLogger(__name__)

CSV_COLUMNS = ("Concurrency", "Inferences/Second", "p50 latency", "p90 latency", "p95 latency", "p99 latency")
"""Columns the parser needs; the header is checked before any row is read."""

@dataclass(frozen=True)
class ConcurrencyRange:
    """perf_analyzer's --concurrency-range start:end:step."""

    start: int
    end: int
    step: int = 1

    @classmethod
    def parse(cls, text: str) -> ConcurrencyRange:
        """"1:8", "1:8:2" or "4"."""
        parts = str(text).split(":")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if not 1 <= len(values) <= 3 or any(v < 1 for v in values) or (len(values) > 1 and values[1] < values[0]):
            raise SettingsError(f"--concurrency {text!r} is not START[:END[:STEP]] with 1 <= START <= END, e.g. 1:8 or 1:8:2.")
        start = values[0]
        end = values[1] if len(values) > 1 else start
        return cls(start, end, values[2] if len(values) > 2 else 1)

    @property
    def levels(self) -> list[int]:
        return list(range(self.start, self.end + 1, self.step))

    def __str__(self) -> str:
        return f"{self.start}:{self.end}:{self.step}"


LOCAL_PROTOCOL = "grpc"
"""How the bundled server is measured (the served search, and validate unless told otherwise): gRPC, Model Analyzer's
default client protocol. perf_analyzer 2.51's synchronous HTTP client, with dozens of clients on few cores, can stop
collecting its windows while its threads keep sending (its memory grows, it never ends); over gRPC the same runs settle."""


@dataclass(frozen=True)
class PerfSettings:
    """How to measure. The defaults settle even on a small shared machine: 1.5 s windows, stable within 50 %.

    perf_analyzer calls a level stable when three windows agree within `stability_percentage`; a level
    that never does makes it exit with status 2, so the tolerance is wide on purpose (the sweep
    reports p50/p95/p99 per level, which carry the spread).
    """

    concurrency: ConcurrencyRange = ConcurrencyRange(1, 8)
    protocol: str = "http"
    batch_size: int = 1
    measurement_interval_ms: int = 1500
    stability_percentage: int = 50
    max_trials: int = 10
    timeout_s: float = 900.0  # the most any one run may take, however many levels and windows it has
    stall_grace_s: float = 120.0  # what a run may take beyond its windows (start-up, a slow model's requests in flight)
    warmup_requests: int = 0  # sent at the first level and discarded before measuring (perf_analyzer 2.51 has no warm-up option)
    retry_stability_percentage: int = 100  # the tolerance when an unsettled level is measured again alone
    retry_alone: bool = True  # False: an unsettled level goes straight to the rough mean of three windows (the served
    # search, whose close calls are measured again interleaved: a retry there would cost seconds a load of its budget)


@dataclass
class PerfRow:
    """One concurrency level: client throughput, latency percentiles (ms) and the server-side batching."""

    concurrency: int
    throughput: float  # inferences (batch items) per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    server_queue_ms: float | None = None
    server_compute_ms: float | None = None
    inference_count: int | None = None
    execution_count: int | None = None

    @property
    def server_batch(self) -> float | None:
        """The batch size the server really formed: inferences per model execution."""
        if not self.inference_count or not self.execution_count:
            return None
        return self.inference_count / self.execution_count

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["server_batch"] = self.server_batch
        return d


@dataclass
class PerfResult:
    """A sweep's rows (in concurrency order), the command that produced them and how it ended."""

    rows: list[PerfRow]
    command: list[str]
    returncode: int
    seconds: float
    note: str = ""
    output_tail: str = ""
    input_data: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    unstable: list[int] = field(default_factory=list)  # levels perf_analyzer could not stabilize, even alone

    @property
    def best(self) -> PerfRow | None:
        return max(self.rows, key=lambda r: r.throughput, default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [r.to_json() for r in self.rows],
            "best_throughput": self.best.throughput if self.best else None,
            "command": self.command,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 2),
            "note": self.note,
            "input_data": self.input_data,
            "settings": self.settings,
            "unstable": self.unstable,
        }


def find_perf_analyzer() -> Path:
    """The perf_analyzer binary next to this interpreter (where the tritonclient 2.51 wheel installs it), else on PATH."""
    local = Path(sys.executable).parent / "perf_analyzer"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which("perf_analyzer")
    if found:
        return Path(found)
    raise ToolMissing("perf_analyzer was not found; pip install 'tritonclient[all]==2.51.0' nvidia-cuda-runtime-cu12 (the 2.51 wheel ships the binary), or pip install 'aitune-export[triton]'.")


def cuda_runtime_lib_dir() -> Path | None:
    """The folder of libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel (perf_analyzer links it even on CPU)."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(root) / "cuda_runtime" / "lib"
        if (lib / "libcudart.so.12").exists():
            return lib
    return None


def perf_analyzer_environment() -> dict[str, str]:
    """The environment perf_analyzer needs: libcudart.so.12 on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    lib = cuda_runtime_lib_dir()
    if lib is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(lib), *([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])])
    return env


def perf_analyzer_command(binary: Path, model: str, url: str, input_data: Path, csv_path: Path, settings: PerfSettings) -> list[str]:
    """The exact command line (recorded in the result, so a user can rerun it by hand)."""
    return [
        str(binary), "-m", model, "-u", url, "-i", settings.protocol,
        "-b", str(settings.batch_size),
        "--concurrency-range", str(settings.concurrency),
        "--input-data", str(input_data),
        "--measurement-mode", "time_windows", "-p", str(settings.measurement_interval_ms),
        "-s", str(settings.stability_percentage), "-r", str(settings.max_trials),
        "-f", str(csv_path),
    ]


def warm_up(binary: Path, model: str, url: str, input_data: Path, settings: PerfSettings) -> None:
    """Send `settings.warmup_requests` requests at the first concurrency level and discard them: a freshly loaded model's
    first requests (thread pools, allocator, the stand-in's first call) would otherwise land in the first window."""
    command = [str(binary), "-m", model, "-u", url, "-i", settings.protocol, "-b", str(settings.batch_size),
               "--concurrency-range", f"{settings.concurrency.start}:{settings.concurrency.start}", "--input-data", str(input_data),
               "--measurement-mode", "count_windows", "--measurement-request-count", str(settings.warmup_requests), "-s", "100", "-r", "1"]
    try:  # its exit status says nothing about the measurement that follows (one window is never "stable")
        subprocess.run(command, env=perf_analyzer_environment(), capture_output=True, stdin=subprocess.DEVNULL, timeout=settings.timeout_s, check=False,
                       preexec_fn=parent_death_signal(signal.SIGKILL))
    except subprocess.TimeoutExpired:
        raise ValidationError(f"perf_analyzer's warm-up of {settings.warmup_requests} requests did not finish within {settings.timeout_s:.0f} s.") from None


UNCHECKED_STABILITY = 100000  # perf_analyzer's -s: any windows agree, so it reports what it measured instead of exiting 2
ROUGH_WINDOWS = 3  # the windows averaged for a level that never settled (perf_analyzer averages the last three)


def run_perf_analyzer(model: str, url: str, input_data: Path, workdir: Path, settings: PerfSettings) -> PerfResult:
    """Run one sweep and parse it; Ctrl-C or a timeout stops perf_analyzer before propagating.

    A level perf_analyzer could not stabilize (a busy machine) is measured once more on its own with
    twice the window and a looser tolerance; a level that still does not settle is measured a last time
    over three windows without a stability check, listed in `unstable` and named in the note: a user
    gets a rough figure flagged as rough, not a failed run (a small shared machine whose other work compiles can keep
    even concurrency 1 from settling). Missing libraries, refused requests or a sweep with no level at all raise
    PerfAnalyzerFailed with perf_analyzer's own words and what it did measure.
    """
    binary = find_perf_analyzer()
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if settings.warmup_requests:
        warm_up(binary, model, url, input_data, settings)
    run = _run_once(binary, model, url, input_data, workdir / f"perf_analyzer_{model}.csv", settings)
    rows, outputs = {r.concurrency: r for r in run.rows}, [run.output]
    missing = [c for c in settings.concurrency.levels if c not in rows]
    note = ""
    if run.returncode != 0 and not unsettled(run.output):
        reason = perf_analyzer_error(run.output) or f"exit status {run.returncode}"
        if "libcudart" in run.output or "libb64" in run.output:
            reason += " (perf_analyzer needs libcudart.so.12 from nvidia-cuda-runtime-cu12 and Debian's libb64-0d: run scripts/install_system_deps.sh)"
        result = PerfResult(sorted(rows.values(), key=lambda r: r.concurrency), run.command, run.returncode, time.monotonic() - t0,
                            output_tail=_tail(run.output), input_data=str(input_data), settings=_settings_json(settings))
        raise PerfAnalyzerFailed(f"perf_analyzer failed: {reason}", result)
    retry = replace(settings, measurement_interval_ms=settings.measurement_interval_ms * 2,
                    stability_percentage=max(settings.retry_stability_percentage, settings.stability_percentage), max_trials=min(settings.max_trials, 6))
    if not settings.retry_alone:
        retry = replace(settings, max_trials=min(settings.max_trials, 6))
    for level in missing if settings.retry_alone else []:
        log.info("concurrency %d did not settle; measuring it alone with %d ms windows", level, retry.measurement_interval_ms)
        again = _run_once(binary, model, url, input_data, workdir / f"perf_analyzer_{model}_c{level}.csv", replace(retry, concurrency=ConcurrencyRange(level, level)))
        outputs.append(again.output)
        rows.update({r.concurrency: r for r in again.rows})
    unstable = [c for c in settings.concurrency.levels if c not in rows]
    rough = replace(retry, stability_percentage=UNCHECKED_STABILITY, max_trials=ROUGH_WINDOWS)
    for level in unstable:
        log.info("concurrency %d still did not settle; taking the mean of %d windows", level, ROUGH_WINDOWS)
        last = _run_once(binary, model, url, input_data, workdir / f"perf_analyzer_{model}_c{level}_rough.csv", replace(rough, concurrency=ConcurrencyRange(level, level)))
        outputs.append(last.output)
        rows.update({r.concurrency: r for r in last.rows})
    if missing and not settings.retry_alone:
        note = (f"concurrency {', '.join(map(str, unstable))} did not settle within {retry.stability_percentage}%: "
                f"{'its row is' if len(unstable) == 1 else 'their rows are'} the mean of {ROUGH_WINDOWS} windows, read as rough")
    elif missing:
        note = f"re-measured concurrency {', '.join(map(str, missing))} alone with {retry.measurement_interval_ms} ms windows (the sweep did not settle)"
        if unstable:
            note += (f"; still unstable: {', '.join(map(str, unstable))} (windows never agreed within {retry.stability_percentage}%: "
                     f"{'its row is' if len(unstable) == 1 else 'their rows are'} the mean of {ROUGH_WINDOWS} windows, read as rough)")
    output = "\n".join(outputs)
    (workdir / f"perf_analyzer_{model}.log").write_text(output)
    result = PerfResult(sorted(rows.values(), key=lambda r: r.concurrency), run.command, run.returncode, time.monotonic() - t0,
                        note=note, output_tail=_tail(output), input_data=str(input_data), settings=_settings_json(settings), unstable=unstable)
    if not rows:
        raise PerfAnalyzerFailed(f"perf_analyzer measured no concurrency level of {settings.concurrency} (none settled); its output ends: {_tail(output, 3)}", result)
    return result


@dataclass
class _Run:
    command: list[str]
    returncode: int
    output: str
    rows: list[PerfRow]


def _run_once(binary: Path, model: str, url: str, input_data: Path, csv_path: Path, settings: PerfSettings) -> _Run:
    csv_path.unlink(missing_ok=True)
    command = perf_analyzer_command(binary, model, url, input_data, csv_path, settings)
    log.info("running %s", " ".join(command))
    # its own session (a Ctrl-C in a terminal is ours to handle), but it dies with the thread that waits for it
    proc = subprocess.Popen(command, env=perf_analyzer_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True, preexec_fn=parent_death_signal(signal.SIGKILL))
    limit = run_limit_s(settings)
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise ValidationError(stalled_message(proc.communicate()[0] or "", settings, limit)) from None
    except BaseException:  # Ctrl-C: never leave perf_analyzer running
        _stop(proc)
        raise
    rows = parse_csv(csv_path.read_text()) if csv_path.is_file() and csv_path.stat().st_size else []
    counts = parse_server_counts(output)
    for row in rows:
        row.inference_count, row.execution_count = counts.get(row.concurrency, (None, None))
    return _Run(command, proc.returncode, output, rows)


def run_limit_s(settings: PerfSettings) -> float:
    """How long one run may take before it is called stalled: every level's windows (at most `max_trials` of them, each
    at most twice its length while the requests in flight finish), plus the grace; never more than `timeout_s`."""
    windows_s = len(settings.concurrency.levels) * settings.max_trials * 2 * settings.measurement_interval_ms / 1000
    return min(settings.timeout_s, settings.stall_grace_s + windows_s)


def stalled_message(output: str, settings: PerfSettings, limit_s: float) -> str:
    """One line for a run that never ended: the level it was measuring (from its console) and what to change."""
    level = last_level(output)
    where = f"concurrency {level}" if level is not None else f"--concurrency {settings.concurrency}"
    fix = ("perf_analyzer 2.51's HTTP client can stall with many clients on a small machine: use --protocol grpc, or a narrower --concurrency"
           if settings.protocol == "http" else "narrow --concurrency, or check that the server still answers")
    return f"perf_analyzer stopped making progress at {where} over {settings.protocol} (no result within {limit_s:.0f} s); {fix}."


class PerfAnalyzerFailed(ValidationError):
    """perf_analyzer ran but did not produce a full sweep; `result` keeps what it did produce."""

    def __init__(self, message: str, result: PerfResult) -> None:
        super().__init__(message)
        self.result = result


def parse_csv(text: str) -> list[PerfRow]:
    """perf_analyzer's -f CSV (rows sorted by concurrency here; perf_analyzer writes them in its own order).

    Raises ValidationError when the header lacks a needed column (a request-rate run, another version).
    """
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise ValidationError(f"perf_analyzer's CSV has no column(s) {', '.join(missing)} (header: {','.join(header)}); expected a concurrency sweep from perf_analyzer 2.x.")
    rows = []
    for rec in reader:
        if not rec.get("Concurrency"):
            continue
        us = lambda key: float(rec[key]) / 1000.0 if rec.get(key) not in (None, "") else None  # noqa: E731
        compute = [us(k) for k in ("Server Compute Input", "Server Compute Infer", "Server Compute Output")]
        rows.append(PerfRow(
            concurrency=int(rec["Concurrency"]),
            throughput=float(rec["Inferences/Second"]),
            p50_ms=us("p50 latency"), p90_ms=us("p90 latency"), p95_ms=us("p95 latency"), p99_ms=us("p99 latency"),
            server_queue_ms=us("Server Queue"),
            server_compute_ms=sum(compute) if all(c is not None for c in compute) else None,
        ))
    return sorted(rows, key=lambda r: r.concurrency)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _settings_json(settings: PerfSettings) -> dict[str, Any]:
    d = asdict(settings)
    d["concurrency"] = str(settings.concurrency)
    return d


def perf_analyzer_status() -> dict[str, Any]:
    """Whether perf_analyzer can run here, for `aitune-export backends` (finds files, runs nothing)."""
    import ctypes.util

    try:
        binary = find_perf_analyzer()
    except ToolMissing as err:
        return {"name": "perf_analyzer", "found": False, "path": None, "reason": str(err)}
    missing = []
    if cuda_runtime_lib_dir() is None:
        missing.append("libcudart.so.12 (pip install nvidia-cuda-runtime-cu12)")
    if ctypes.util.find_library("b64") is None:
        missing.append("libb64.so.0d (apt-get install libb64-0d, or scripts/install_system_deps.sh)")
    reason = ("cannot run: missing " + "; ".join(missing)) if missing else "libcudart.so.12 and libb64.so.0d found"
    return {"name": "perf_analyzer", "found": not missing, "path": str(binary), "reason": reason}
