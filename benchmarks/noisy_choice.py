"""Does the published choice survive a busy machine? Export each example quietly and next to a CPU hog.

A user rarely tunes on an idle machine: a build, a browser or another job shares the cores. The
export measures throughput per candidate and batch size, so load from elsewhere can change which
backend wins and where the max batch size search stops. This benchmark exports each bundled example
--runs times on a quiet machine and --runs times while a background process keeps --spin-cores cores
busy, and compares the published choices (issue "Decisions that survive a busy machine").

Every export is a fresh `aitune-export export` process in its own temporary folder with --no-cache
(otherwise later runs reuse the first one's measurements), --overwrite and --json; the choice is read
from <dir>/aitune-reports/<name>/report.json: result.selected (backend part only), the published max
batch (published.config.max_batch_size, else result.max_batch_size) and result.tune_seconds.

The quiet choice is the most common (backend, max batch) of the quiet runs (ties: the first run's). A
noisy run agrees when it has the same backend and a max batch within one power of two of the quiet
one (ratio 0.5 to 2 inclusive); a failed export never agrees. slowdown = mean noisy tune_seconds /
mean quiet tune_seconds (successful runs only).

Usage: .venv/bin/python benchmarks/noisy_choice.py [--runs 3] [--models cnn,transformer]
       [--serve-search on|off] [--spin-cores 1] [--keep] [-- EXTRA EXPORT ARGS]
Ends with one line per model:
  noisy_choice model=<name> quiet=<backend>/<max batch> noisy=<b>/<m>,... agree=K/N slowdown=<x.xx>
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

MODELS = {
    "cnn": [],  # the bundled example CNN: export without MODEL
    "transformer": ["optimizer.examples.transformer:build", "--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999"],
}
SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
SPIN_DEADLINE_S = 3600.0  # safety net only: the benchmark stops the spinners itself after every noisy export


@dataclass
class Run:
    """One export's published choice, or why it failed."""

    backend: str | None = None
    max_batch: int | None = None
    tune_seconds: float | None = None
    wall_seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.backend is not None

    def label(self) -> str:
        return f"{self.backend}/{self.max_batch}" if self.ok else "failed"


def start_spinners(cores: int) -> list[subprocess.Popen]:
    """Busy loops that each keep one core busy until stopped (or until their own deadline)."""
    return [subprocess.Popen([sys.executable, "-c", SPIN, str(SPIN_DEADLINE_S)]) for _ in range(cores)]


def stop_spinners(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_report(workdir: Path, stdout: str) -> dict:
    """report.json under <dir>/aitune-reports/<name>/, else the --json document on stdout."""
    reports = sorted(workdir.glob("aitune-reports/*/report.json"))
    return json.loads(reports[0].read_text()) if reports else json.loads(stdout)


def export_once(model_args: list[str], workdir: Path, serve_search: str, extra: list[str]) -> Run:
    cmd = [sys.executable, "-m", "optimizer.cli", "export", *model_args, "--repository", str(workdir / "repo"),
           "--no-cache", "--overwrite", "--json", "--serve-search", serve_search, *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return Run(wall_seconds=wall, error=f"exit {proc.returncode}: {lines[-1].strip() if lines else '(no stderr)'}")
    try:
        doc = read_report(workdir, proc.stdout)
        result = doc["result"]
        config = (doc.get("published") or {}).get("config") or {}
        max_batch = config.get("max_batch_size", result["max_batch_size"])
        return Run(backend=result["selected"].split("[")[0], max_batch=int(max_batch),
                   tune_seconds=float(result["tune_seconds"]), wall_seconds=wall)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return Run(wall_seconds=wall, error=f"no readable report: {err!r}")


def quiet_choice(runs: list[Run]) -> tuple[str, int] | None:
    """The most common (backend, max batch) of the successful quiet runs; ties go to the earliest run."""
    choices = [(r.backend, r.max_batch) for r in runs if r.ok]
    if not choices:
        return None
    counts = Counter(choices)
    best = max(counts.values())
    return next(c for c in choices if counts[c] == best)


def agrees(run: Run, quiet: tuple[str, int] | None) -> bool:
    if quiet is None or not run.ok or run.backend != quiet[0]:
        return False
    if quiet[1] <= 0 or run.max_batch <= 0:
        return run.max_batch == quiet[1]
    return 0.5 <= run.max_batch / quiet[1] <= 2.0


def mean_tune(runs: list[Run]) -> float | None:
    values = [r.tune_seconds for r in runs if r.ok and r.tune_seconds is not None]
    return sum(values) / len(values) if values else None


def run_model(name: str, args: argparse.Namespace, extra: list[str], dirs: list[Path]) -> str:
    results: dict[str, list[Run]] = {"quiet": [], "noisy": []}
    for phase in ("quiet", "noisy"):
        for i in range(args.runs):
            workdir = Path(tempfile.mkdtemp(prefix=f"noisy_choice-{name}-{phase}{i + 1}-"))
            dirs.append(workdir)
            load = os.getloadavg()[0]  # other work on the machine before this export: a 'quiet' run is only as quiet as this
            spinners = start_spinners(args.spin_cores) if phase == "noisy" else []
            try:
                run = export_once(MODELS[name], workdir, args.serve_search, extra)
            finally:
                stop_spinners(spinners)
            results[phase].append(run)
            detail = f"tune {run.tune_seconds:.1f} s" if run.ok else run.error
            print(f"{name} {phase} run {i + 1}/{args.runs}: {run.label()} ({detail}; wall {run.wall_seconds:.1f} s; load before {load:.2f})", flush=True)
    quiet, noisy = results["quiet"], results["noisy"]
    choice = quiet_choice(quiet)
    agree = sum(agrees(r, choice) for r in noisy)
    q_mean, n_mean = mean_tune(quiet), mean_tune(noisy)
    slowdown = f"{n_mean / q_mean:.2f}" if q_mean and n_mean is not None else "n/a"
    quiet_label = f"{choice[0]}/{choice[1]}" if choice else "failed"
    print(f"{name}: quiet runs {', '.join(r.label() for r in quiet)} -> quiet choice {quiet_label}; "
          f"mean tune quiet {q_mean or 0:.1f} s, noisy {n_mean or 0:.1f} s", flush=True)
    return (f"noisy_choice model={name} quiet={quiet_label} noisy={','.join(r.label() for r in noisy)} "
            f"agree={agree}/{len(noisy)} slowdown={slowdown}")


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Arguments after -- go to every export.")
    parser.add_argument("--runs", type=int, default=3, help="exports per model and condition (default 3)")
    parser.add_argument("--models", default="cnn,transformer", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--serve-search", choices=("on", "off"), default="on", help="passed to every export (default on)")
    parser.add_argument("--spin-cores", type=int, default=1, help="cores kept busy during the noisy runs (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary export folders")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or args.runs < 1 or args.spin_cores < 1:
        parser.error(f"unknown models {unknown}" if unknown else "--runs and --spin-cores must be at least 1")
    dirs: list[Path] = []
    lines = []
    try:
        for name in models:
            lines.append(run_model(name, args, extra, dirs))
    finally:
        if args.keep:
            print("kept: " + " ".join(map(str, dirs)), flush=True)
        else:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
