"""What does a decision made on a busy machine cost when it is served on a quiet one? Throughput ratio, busy/quiet.

A user rarely tunes on an idle machine: a build, a browser or another job shares the cores, and real load comes
and goes. The export measures candidates, batch sizes and served variants, so load from elsewhere can change what it
publishes. A different choice among near-ties costs nothing; the question is how much throughput the busy choice
loses (issue 27, item 2).

Per model (the bundled examples): one quiet export, then --runs exports under a steady spinner (one core busy,
--spin-cores) and --runs under on/off bursts (--burst-on s busy, --burst-off s idle), steady and bursty runs
interleaved. Every export is a fresh `aitune-export export` process in its own temporary folder with --no-cache,
--overwrite and --json (arguments after -- go to every export). Then, with the spinners stopped, one bundled
tritonserver serves every run's published model folder under a private name (a private repository of links to each
run's folder; torch_aoti translated for the local 2.51 core; an ensemble front loaded with its positional model under
renamed steps), and perf_analyzer measures each busy run against the quiet run at the load the quiet export targeted
(its published.served_search.concurrency, else --concurrency), in ABBA blocks: quiet, busy, busy, quiet, --pairs
blocks per busy run. The quiet config is first measured against itself the same way (an A/A
control, printed): the ratio the measurement alone gives.

The numbers:
- a block's ratio = (busy1 + busy2) / (quiet1 + quiet2) throughputs (ABBA cancels a linear drift inside the block);
- a run's ratio = the geometric mean of its blocks' ratios, and its 90% interval a Student t interval on the log
  ratios over the blocks (mean +- t(0.95, n-1) * sd / sqrt(n), exponentiated; one block: no interval);
- per model and load: min_ratio = the lowest run ratio, ratio_lo/ratio_hi = that worst run's 90% interval;
  same_choice = runs whose published backend matches the quiet one with a max batch within one power of two
  (a coarse agreement, kept as a secondary column). A failed export or serving counts as ratio 0.

Usage: .venv/bin/python benchmarks/noisy_choice.py [--runs 3] [--models cnn,transformer] [--pairs 4] [--window-ms 1000]
       [--burst-on 2] [--burst-off 3] [--spin-cores 1] [--concurrency N] [--keep] [-- EXTRA EXPORT ARGS]
Ends with one line per model and load:
  noisy_choice model=NAME load=steady|bursts runs=N min_ratio=X ratio_lo=L ratio_hi=H same_choice=K/N
and writes benchmarks/results/noisy_choice.json (results.py): those figures per model and load, with the settings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results: the benchmarks' records

from results import line_figures, merge_models, write_result  # noqa: E402

MODELS = {
    "cnn": [],  # the bundled example CNN: export without MODEL
    "transformer": ["optimizer.examples.transformer:build", "--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999"],
}
LOADS = ("steady", "bursts")
SPIN = ("import sys, time\nend, on, off = time.monotonic() + float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])\n"
        "while time.monotonic() < end:\n    busy = time.monotonic() + on if off > 0 else end\n"
        "    while time.monotonic() < busy:\n        pass\n    if off > 0:\n        time.sleep(off)\n")
UNSTABLE_RETRIES = 2
"""A level perf_analyzer could not settle is measured again with twice, then four times the window."""
SPIN_DEADLINE_S = 3600.0  # safety net only: the benchmark stops the spinners itself after every busy export
T_95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)
"""Student t 0.95 quantiles for 1..30 degrees of freedom (two-sided 90% interval); beyond: 1.645."""


# -- the numbers ---------------------------------------------------------------------------------------------------
def block_ratio(quiet1: float, busy1: float, busy2: float, quiet2: float) -> float:
    """One ABBA block's busy/quiet throughput ratio: both sides summed, so a linear drift inside the block cancels."""
    return (busy1 + busy2) / (quiet1 + quiet2)


def t_quantile(df: int) -> float:
    """The 0.95 quantile of Student's t with `df` degrees of freedom (the half-width factor of a 90% interval)."""
    return T_95[df - 1] if df <= len(T_95) else 1.645


def run_ratio(blocks: list[float]) -> tuple[float, float | None, float | None]:
    """A run's ratio (geometric mean of its block ratios) and its 90% t interval on the log scale; one block: no interval."""
    logs = [math.log(r) for r in blocks]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None, None
    half = t_quantile(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def number(value: float | None) -> str:
    """A ratio as the result line prints it; n/a where no interval exists (one block, or a failed run)."""
    return "n/a" if value is None else f"{value:.3f}"


def summary(runs: list[tuple[float, float | None, float | None]]) -> tuple[float, float | None, float | None]:
    """Over a load's runs: the lowest ratio and the interval of the run that gave it (the worst case decides the target)."""
    return min(runs, key=lambda r: r[0])


# -- the exports ---------------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One export: its folder, the published choice, or why it failed; then what serving it measured."""

    label: str
    workdir: Path
    backend: str | None = None
    max_batch: int | None = None
    tune_seconds: float | None = None
    wall_seconds: float = 0.0
    report: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    blocks: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.backend is not None and not self.error

    def choice(self) -> str:
        return f"{self.backend}/{self.max_batch}" if self.backend else "failed"


def start_spinners(cores: int, on_s: float, off_s: float) -> list[subprocess.Popen]:
    """Busy loops that each keep one core busy (on_s busy then off_s idle, or always when off_s is 0) until stopped."""
    return [subprocess.Popen([sys.executable, "-c", SPIN, str(SPIN_DEADLINE_S), str(on_s), str(off_s)]) for _ in range(cores)]


def stop_spinners(procs: list[subprocess.Popen]) -> None:
    """Stop the spinners this benchmark started (terminate, then kill)."""
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


def export_once(run: Run, model_args: list[str], extra: list[str]) -> None:
    """One fresh export process into run.workdir; fills in the run's choice and report, or its error."""
    cmd = [sys.executable, "-m", "optimizer.cli", "export", *model_args, "--repository", str(run.workdir / "repo"),
           "--no-cache", "--overwrite", "--json", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=run.workdir, capture_output=True, text=True)
    run.wall_seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        run.error = f"export exit {proc.returncode}: {lines[-1].strip() if lines else '(no stderr)'}"
        return
    try:
        doc = read_report(run.workdir, proc.stdout)
        result, published = doc["result"], doc.get("published") or {}
        config = published.get("config") or {}
        run.max_batch = int(config.get("max_batch_size", result["max_batch_size"]))
        run.tune_seconds = float(result["tune_seconds"])
        run.backend = result["selected"].split("[")[0]
        run.report = doc
        if not published.get("model_dir"):
            run.error = "nothing was published"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        run.error = f"no readable report: {err!r}"


def seen(run: Run) -> str:
    """What the export saw of the load, to explain a losing run: a probe (tuning's, the served search's) that took
    cores, and how many served levels were measured again."""
    search = (run.report.get("published") or {}).get("served_search") or {}
    shares = (("tuned", (run.report.get("result") or {}).get("measured_on")), ("served search", search.get("measured_on")))
    said = "".join(f"; {what} beside {float(share['others_busy']):.1f} busy cores" for what, share in shares
                   if share and len(share["cores"]) < len(share["available"]))
    return said + (f"; {search.get('remeasured', 0)} levels measured again" if search else "")


def same_choice(run: Run, quiet: Run) -> bool:
    """The coarse agreement: same backend, max batch within one power of two (0.5x to 2x); a failed run never agrees."""
    if not run.ok or not quiet.ok or run.backend != quiet.backend:
        return False
    if quiet.max_batch <= 0 or run.max_batch <= 0:
        return run.max_batch == quiet.max_batch
    return 0.5 <= run.max_batch / quiet.max_batch <= 2.0


# -- serving on the quiet machine ----------------------------------------------------------------------------------
def private_configs(run: Run, index: int) -> list[tuple[str, Path, str]]:
    """(private name, source model folder, config text) for every model of the run's published export, composing first.

    Each model is renamed to a private name of this run; an ensemble's step points at its positional model's private
    name; a platform the local 2.51 core lacks (torch_aoti) is translated as the served search does."""
    from optimizer.triton.repository.exports import export_models
    from optimizer.triton.runtime.local_serving import local_config, needs_translation
    from optimizer.triton.config.model_config import canonical, parse
    from optimizer.triton.measure.served_search.loader import private_name

    model_dir = Path(run.report["published"]["model_dir"])
    models = export_models(model_dir.parent, model_dir.name)
    repo = model_dir.parent
    names = {m.name: private_name(m.name, index) for m in models}
    out = []
    for model in models:
        config = parse(model.config_text)
        config.name = names[model.name]
        for step in config.ensemble_scheduling.step:
            step.model_name = names.get(step.model_name, step.model_name)
        if needs_translation(config):
            config = local_config(config)
        out.append((names[model.name], repo / model.name, canonical(config)))
    return out


def request_rows(input_data: Path, config_text: str) -> list[dict]:
    """perf_analyzer's --input-data entries as batch-1 request arrays (for the warm-up through tritonclient)."""
    import base64

    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    from optimizer.triton.config.model_config import parse

    config = parse(config_text)
    def numpy_dtype(tensor: Any) -> Any:  # TYPE_INT64 -> int64, through tritonclient's table
        enum = type(tensor).DESCRIPTOR.fields_by_name["data_type"].enum_type
        return triton_to_np_dtype(enum.values_by_number[tensor.data_type].name.removeprefix("TYPE_"))

    dtypes = {t.name: numpy_dtype(t) for t in config.input}
    rows = []
    for entry in json.loads(input_data.read_text())["data"]:
        row = {}
        for name, value in entry.items():
            arr = np.frombuffer(base64.b64decode(value["content"]["b64"]), dtype=np.dtype(dtypes[name]).newbyteorder("<"))
            arr = arr.reshape(value["shape"]).astype(dtypes[name])
            row[name] = arr[None] if config.max_batch_size > 0 else arr
        rows.append(row)
    return rows


def serve_and_compare(name: str, quiet: Run, busy: list[Run], concurrency: int, pairs: int, workdir: Path, window_ms: int = 1000) -> None:
    """Serve the quiet run and every busy run on one bundled tritonserver and measure each busy run ABBA against the quiet one."""
    from optimizer.errors import ValidationError
    from optimizer.triton.runtime.local_serving import private_model
    from optimizer.triton.runtime.perf_analyzer import PerfAnalyzerFailed
    from optimizer.triton.measure.served_search.loader import VariantLoader
    from optimizer.triton.measure.served_search.measure import WARMUP_PER_SLOT, Bench, measure_level, warm_up
    from optimizer.triton.measure.served_search.request import LOCAL_PROTOCOL
    from optimizer.triton.runtime.install import find_triton, homes_root, prepare_home
    from optimizer.triton.runtime.server import LocalTritonServer

    repo = workdir / "serve-repository"
    repo.mkdir(parents=True, exist_ok=True)
    home = prepare_home(find_triton(), homes_root(None))
    runs = [quiet, *[r for r in busy if r.ok]]
    with LocalTritonServer(repo, log_path=workdir / "tritonserver.log", home=home) as server, \
            VariantLoader(server.grpc_url, protocol=LOCAL_PROTOCOL, check_alive=server.check_alive) as loader:
        benches: dict[int, tuple[str, Bench]] = {}
        for index, run in enumerate(runs):
            models = private_configs(run, index)
            for private, source, text in models:
                private_model(source, repo, private, text)
                errors = loader.load({private: text})
                if errors:
                    run.error = f"Triton could not load {private}: {errors[private]}"
                    break
            if run.error:
                continue
            public, _, text = models[-1]
            input_data = run.workdir / run.report["published"]["perf_analyzer_input"]
            bench = Bench(server.grpc_url, input_data, request_rows(input_data, text), workdir / f"pa-{index}", protocol=LOCAL_PROTOCOL)
            warm_up(bench, public, concurrency, WARMUP_PER_SLOT * concurrency)
            benches[index] = (public, bench)
        if quiet.error:
            return
        q_name, q_bench = benches[0]
        first = measure_level(q_bench, q_name, concurrency, q_bench.window_ms)
        window = max(window_ms, q_bench.window_for(first.throughput))
        print(f"{name} quiet {quiet.choice()} at concurrency {concurrency}: {first.throughput:.1f} infer/s (window {window} ms)", flush=True)

        def level(bench: Bench, model: str) -> float:  # an unsettled level (windows more than 25% apart) is measured again, longer
            for attempt in range(UNSTABLE_RETRIES + 1):
                try:
                    return measure_level(bench, model, concurrency, window * 2 ** attempt).throughput
                except PerfAnalyzerFailed:
                    if attempt == UNSTABLE_RETRIES:
                        raise
            raise AssertionError("unreachable")

        def abba(b_name: str, b_bench: Bench) -> list[float]:
            blocks = []
            for _ in range(pairs):
                q1, b1, b2, q2 = level(q_bench, q_name), level(b_bench, b_name), level(b_bench, b_name), level(q_bench, q_name)
                blocks.append(block_ratio(q1, b1, b2, q2))
            return blocks

        try:
            report_ratio(f"{name} A/A control (the quiet config against itself: the measurement's own noise)", abba(q_name, q_bench))
        except ValidationError as err:
            print(f"{name} A/A control: not measured ({err})", flush=True)
        for index, run in enumerate(runs[1:], start=1):
            if index not in benches:
                continue
            try:
                run.blocks = abba(*benches[index])
            except ValidationError as err:  # perf_analyzer measured nothing: this run counts as a loss, the others go on
                run.error, run.blocks = f"serving it failed: {err}", []
                continue
            report_ratio(f"{name} {run.label} {run.choice()}", run.blocks)


def report_ratio(label: str, blocks: list[float]) -> None:
    """Print one measured comparison: its ratio, 90% interval and blocks."""
    ratio, lo, hi = run_ratio(blocks)
    interval = f"90% [{lo:.3f}, {hi:.3f}]" if lo is not None else "one block, no interval"
    print(f"{label}: ratio {ratio:.3f} ({interval}; blocks {', '.join(f'{b:.3f}' for b in blocks)})", flush=True)


def run_model(name: str, args: argparse.Namespace, extra: list[str], dirs: list[Path], figures: dict[str, Any] | None = None) -> list[str]:
    """Export quietly and busily, serve every result on the quiet machine, and return one line per load; `figures`
    gets the model's record entry: per load, the line's figures, the load served at and the quiet choice."""
    def fresh(label: str) -> Run:
        workdir = Path(tempfile.mkdtemp(prefix=f"noisy_choice-{name}-{label}-"))
        dirs.append(workdir)
        return Run(label, workdir)

    quiet = fresh("quiet")
    schedule = [("quiet", quiet)] + [(load, fresh(f"{load}{i + 1}")) for i in range(args.runs) for load in args.loads]
    for load, run in schedule:
        before = os.getloadavg()[0]  # other work on the machine before this export: a 'quiet' run is only as quiet as this
        spinners = [] if load == "quiet" else start_spinners(args.spin_cores, args.burst_on, 0.0 if load == "steady" else args.burst_off)
        try:
            export_once(run, MODELS[name], extra)
        finally:
            stop_spinners(spinners)
        detail = f"tune {run.tune_seconds:.1f} s{seen(run)}" if run.ok else run.error
        print(f"{name} {run.label}: {run.choice()} ({detail}; wall {run.wall_seconds:.1f} s; load before {before:.2f})", flush=True)
    busy = [run for load, run in schedule if load != "quiet"]
    served = (quiet.report.get("published") or {}).get("served_search") or {}
    concurrency = args.concurrency or served.get("concurrency")
    if quiet.ok and not concurrency:
        quiet.error = "the quiet export has no served-search concurrency (was --serve-search off?); pass --concurrency N"
    if quiet.ok:
        serve_and_compare(name, quiet, busy, int(concurrency), args.pairs, fresh("serve").workdir, args.window_ms)
    if not quiet.ok:
        print(f"{name}: the quiet run failed ({quiet.error}); every ratio is 0", flush=True)
    lines = []
    for load in args.loads:
        runs = [run for label, run in schedule if label == load]
        ratios = [run_ratio(r.blocks) if quiet.ok and r.ok and r.blocks else (0.0, None, None) for r in runs]
        for r in runs:
            if not (quiet.ok and r.ok and r.blocks):
                print(f"{name} {r.label}: counted as ratio 0 ({r.error or quiet.error or 'not measured'})", flush=True)
        low, lo, hi = summary(ratios)
        agree = sum(same_choice(r, quiet) for r in runs)
        lines.append(f"noisy_choice model={name} load={load} runs={len(runs)} min_ratio={low:.3f} ratio_lo={number(lo)} "
                     f"ratio_hi={number(hi)} same_choice={agree}/{len(runs)}")
        if figures is not None:
            fields = {k: v for k, v in line_figures(lines[-1]).items() if k not in ("model", "load")}
            figures.setdefault(name, {})[load] = {**fields, "concurrency": concurrency or "n/a", "quiet_choice": quiet.choice()}
    return lines


def main() -> None:
    """Parse the arguments, run every model, print one line per model and load; temporary folders go unless --keep."""
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Arguments after -- go to every export.")
    parser.add_argument("--runs", type=int, default=3, help="busy exports per model and load (default 3)")
    parser.add_argument("--models", default="cnn,transformer", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--pairs", type=int, default=4, help="ABBA blocks per busy run (default 4)")
    parser.add_argument("--window-ms", type=int, default=1000, help="perf_analyzer's shortest window (default 1000)")
    parser.add_argument("--spin-cores", type=int, default=1, help="cores kept busy during the busy runs (default 1)")
    parser.add_argument("--burst-on", type=float, default=2.0, help="seconds busy per burst (default 2)")
    parser.add_argument("--burst-off", type=float, default=3.0, help="seconds idle between bursts (default 3)")
    parser.add_argument("--concurrency", type=int, default=0, help="serve at this load (default: the quiet export's target)")
    parser.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated, of {', '.join(LOADS)} (default both)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary export folders")
    args = parser.parse_args(argv)
    args.loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    if not args.loads or any(x not in LOADS for x in args.loads):
        parser.error(f"--loads takes {', '.join(LOADS)}, comma-separated; got {args.loads}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    if args.runs < 1 or args.pairs < 1 or args.spin_cores < 1 or args.burst_on <= 0 or args.burst_off <= 0 or args.window_ms < 100:
        parser.error("--runs, --pairs and --spin-cores must be at least 1, --burst-on and --burst-off above 0, --window-ms at least 100")
    dirs: list[Path] = []
    lines: list[str] = []
    figures: dict[str, Any] = {}
    try:
        for name in models:
            lines += run_model(name, args, extra, dirs, figures)
    finally:
        if args.keep:
            print("kept: " + " ".join(map(str, dirs)), flush=True)
        else:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
    for line in lines:
        print(line)
    write_result("noisy_choice", merge_models("noisy_choice", figures, {"settings": {
        "runs": args.runs, "pairs": args.pairs, "loads": ", ".join(args.loads), "window_ms": args.window_ms, "spin_cores": args.spin_cores,
        "burst_on_s": args.burst_on, "burst_off_s": args.burst_off, "extra_export_args": " ".join(extra) or "none",
        "interval": "90%, Student's t over a run's ABBA block log ratios; ratio_lo/ratio_hi are the worst run's"}}))


if __name__ == "__main__":
    main()
