"""Does `export --url` choose as well as the local export? Served throughput of the two published configs, URL/local.

Issue 26's target: on the bundled server started by hand, `export --url` gives the same choice as the local export
within noise (the two published configs within 5% at the export's load, measured ABBA), and leaves no model loaded
but the ones that were there before.

Per model (the bundled examples): `aitune-export serve` starts in its own process (explicit model control, free
loopback ports, an empty repository of its own), then --runs pairs of exports run, each a fresh `aitune-export
export` process with --no-cache, --overwrite, --json and --concurrency N: one local, one with --url at that server
(--protocol grpc, as the local search measures), local and URL alternating. After each URL export the server's
repository index must equal what it was before the export (READY models). The server is stopped; then one bundled
tritonserver serves every published model under a private name and perf_analyzer measures each URL run against the
local run of its pair at concurrency N, ABBA (local, url, url, local), --pairs blocks, exactly as
benchmarks/noisy_choice.py serves a busy run against the quiet one (its A/A control is printed too).

Usage: .venv/bin/python benchmarks/url_choice.py [--models cnn] [--runs 1] [--concurrency 16] [--pairs 4]
       [--window-ms 1000] [--keep] [-- EXTRA EXPORT ARGS]
Ends with one line per model:
  url_choice model=NAME runs=N concurrency=C min_ratio=X ratio_lo=L ratio_hi=H same_choice=K/N left_loaded=M variant_cost_ratio=V
(min_ratio: the lowest URL/local ratio over the runs; ratio_lo/ratio_hi: that run's 90% interval; left_loaded: models
READY on the server after an export that were not before, summed over the runs; variant_cost_ratio: the median over
the pairs of the URL search's median seconds per variant over the local one's (the issue's "a variant over the URL
costs no more than a local variant"); a failed export counts as ratio 0.) It writes benchmarks/results/url_choice.json
(results.py): those figures per model, with the settings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # noisy_choice and results: the benchmarks' own parts

from noisy_choice import MODELS, Run, export_once, number, run_ratio, same_choice, serve_and_compare, summary  # noqa: E402
from results import line_figures, merge_models, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def start_serve(workdir: Path) -> tuple[subprocess.Popen, int, int]:
    """`aitune-export serve` on an empty repository of its own, in its own process; returns it once it is serving."""
    from optimizer.triton.runtime.server import free_port

    repo = workdir / "served"
    repo.mkdir(parents=True, exist_ok=True)
    http, grpc = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "optimizer.cli", "-q", "serve", str(repo), "--http-port", str(http),
                             "--grpc-port", str(grpc), "--model-control-mode", "explicit"], cwd=workdir,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("Ctrl-C stops it."):
            return proc, http, grpc
        if not line and proc.poll() is not None:
            raise SystemExit(f"url_choice: aitune-export serve exited with {proc.returncode}: {proc.stderr.read().strip()}")
    proc.kill()
    raise SystemExit("url_choice: aitune-export serve did not start within 180 s")


def stop_serve(proc: subprocess.Popen) -> None:
    """SIGINT, as Ctrl-C sends it; killed if it has not stopped within a minute."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ready_models(grpc_port: int) -> list[str]:
    """The names the server holds READY (its repository index over gRPC)."""
    from optimizer.triton.runtime.server import open_client

    client = open_client("grpc", f"127.0.0.1:{grpc_port}")
    try:
        index = client.get_model_repository_index(as_json=True).get("models", [])
    finally:
        client.close()
    return sorted(m["name"] for m in index if m.get("state") == "READY")


def variant_cost(run: Run) -> tuple[int, float | None]:
    """(variants measured, median seconds per variant after the start) of the run's served search; the start loads
    alone and warms the server, so it is left out, as the search's own cost figure does."""
    search = (run.report.get("published") or {}).get("served_search") or {}
    measured = [v for v in search.get("variants", []) if v.get("status") == "measured"]
    costs = [float(v["seconds"]) for v in measured if v.get("stage") != "start" and v.get("seconds")]
    return len(measured), (statistics.median(costs) if costs else None)


def run_model(name: str, args: argparse.Namespace, extra: list[str], dirs: list[Path]) -> str:
    """Export locally and by URL, serve both results on the quiet machine, and return the model's line."""
    def fresh(label: str) -> Run:
        workdir = Path(tempfile.mkdtemp(prefix=f"url_choice-{name}-{label}-"))
        dirs.append(workdir)
        return Run(label, workdir)

    load = ["--concurrency", str(args.concurrency), *extra]
    pairs = [(fresh(f"local{i + 1}"), fresh(f"url{i + 1}")) for i in range(args.runs)]
    server_dir = fresh("server").workdir
    proc, _, grpc = start_serve(server_dir)
    left_loaded = 0
    try:
        for local, remote in pairs:
            export_once(local, MODELS[name], load)
            print(f"{name} {local.label}: {local.choice()} ({local.error or f'tune {local.tune_seconds:.1f} s'}; wall {local.wall_seconds:.1f} s; "
                  f"{cost_text(local)})", flush=True)
            before = ready_models(grpc)
            export_once(remote, MODELS[name], [*load, "--url", f"127.0.0.1:{grpc}", "--protocol", "grpc"])
            after = ready_models(grpc)
            extra_models = sorted(set(after) - set(before))
            left_loaded += len(extra_models)
            print(f"{name} {remote.label}: {remote.choice()} ({remote.error or f'tune {remote.tune_seconds:.1f} s'}; "
                  f"wall {remote.wall_seconds:.1f} s; {cost_text(remote)}; left loaded: {', '.join(extra_models) or 'none'})", flush=True)
    finally:
        stop_serve(proc)
    ratios = []
    for i, (local, remote) in enumerate(pairs):
        if local.ok and remote.ok:
            serve_and_compare(f"{name} pair {i + 1}", local, [remote], args.concurrency, args.pairs, fresh(f"serve{i + 1}").workdir, args.window_ms)
        if local.ok and remote.ok and remote.blocks:
            ratios.append(run_ratio(remote.blocks))
        else:
            print(f"{name} pair {i + 1}: counted as ratio 0 ({remote.error or local.error or 'not measured'})", flush=True)
            ratios.append((0.0, None, None))
    low, lo, hi = summary(ratios)
    agree = sum(same_choice(remote, local) for local, remote in pairs)
    costs = [(variant_cost(remote)[1], variant_cost(local)[1]) for local, remote in pairs]
    cost_ratios = [u / c for u, c in costs if u and c]
    cost = f"{statistics.median(cost_ratios):.2f}" if cost_ratios else "n/a"
    return (f"url_choice model={name} runs={args.runs} concurrency={args.concurrency} min_ratio={low:.3f} ratio_lo={number(lo)} "
            f"ratio_hi={number(hi)} same_choice={agree}/{args.runs} left_loaded={left_loaded} variant_cost_ratio={cost}")


def cost_text(run: Run) -> str:
    count, median = variant_cost(run)
    return f"{count} variants, median {median:.2f} s each after the start" if median is not None else f"{count} variants"


def main() -> None:
    """Parse the arguments, run every model, print one line per model; temporary folders go unless --keep."""
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Arguments after -- go to every export.")
    parser.add_argument("--models", default="cnn", help=f"comma-separated, of {', '.join(MODELS)} (default cnn)")
    parser.add_argument("--runs", type=int, default=1, help="pairs of exports (local, URL) per model (default 1)")
    parser.add_argument("--concurrency", type=int, default=16, help="the load both exports target and are served at (default 16)")
    parser.add_argument("--pairs", type=int, default=4, help="ABBA blocks per pair of exports (default 4)")
    parser.add_argument("--window-ms", type=int, default=1000, help="perf_analyzer's shortest window (default 1000)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary export folders")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    if args.runs < 1 or args.pairs < 1 or args.concurrency < 1 or args.window_ms < 100:
        parser.error("--runs, --pairs and --concurrency must be at least 1, --window-ms at least 100")
    dirs: list[Path] = []
    lines: list[str] = []
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
    figures = {name: {k: v for k, v in line_figures(line).items() if k != "model"} for name, line in zip(models, lines)}
    write_result("url_choice", merge_models("url_choice", figures, {"settings": {
        "runs": args.runs, "pairs": args.pairs, "concurrency": args.concurrency, "window_ms": args.window_ms,
        "extra_export_args": " ".join(extra) or "none", "protocol": "grpc",
        "interval": "90%, Student's t over a pair's ABBA block log ratios; ratio_lo/ratio_hi are the worst pair's"}}))


if __name__ == "__main__":
    main()
