"""Does Ray cost wall time on one node? One plan through the local executor and through Ray, side by side.

On one node the Ray executor must run the models one after another too (each task reserves every CPU, so no
two measurements overlap); what it may add is Ray's own cost: connecting, shipping each task, a worker
process per task. Target: ray_seconds <= 1.1 x local_seconds.

The plan exports the bundled CNN and transformer (default strategy; every default candidate unless --backend
names some; --serve-search off unless --serve-search on). Each executor gets its own empty cache, repository and report folder, so both do every
build and measurement. Each run is a fresh `aitune-export export-many` process, timed from start to exit.
Rounds alternate the order (local first, then Ray first) and the line sums them. By default the Ray runs join
a head this script starts on 127.0.0.1 before timing (the issue's "existing Ray cluster"; `ray start` is not
timed); --local-ray times runs whose plan has no address, so each includes starting and stopping a local Ray.

Usage: .venv/bin/python benchmarks/fleet.py [--rounds 1] [--backend NAME]... [--serve-search on|off] [--local-ray] [--keep]
Ends with: fleet ray_seconds=<s> local_seconds=<s> ratio=<ray/local>
and writes benchmarks/results/fleet.json (results.py): those figures, with the plan's models and the run's settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results: the benchmarks' records

from results import line_figures, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = """
[models.cnn]
model = "optimizer.examples.cnn:build"
[models.transformer]
model = "optimizer.examples.transformer:build"
input = ["input_ids:int64:1-128"]
value-range = ["input_ids:0:999"]
"""


def _plan(folder: Path, executor: str, address: str | None, serve_search: str, backends: list[str]) -> Path:
    folder.mkdir(parents=True)
    lines = [f'repository = "{folder / "repo"}"', f'executor = "{executor}"', f'cache-dir = "{folder / "cache"}"',
             f'serve-search = "{serve_search}"', f'report-dir = "{folder / "reports"}"']
    if backends:
        lines.append("backend = [" + ", ".join(f'"{b}"' for b in backends) + "]")
    if address:
        lines.append(f'address = "{address}"')
    path = folder / "plan.toml"
    path.write_text("\n".join(lines) + "\n" + MODELS)
    return path


def _run(plan: Path, extra_env: dict[str, str]) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra_env)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "optimizer.cli", "-q", "export-many", str(plan), "--json"], cwd=plan.parent,
                       env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"export-many {plan} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return seconds, json.loads(r.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _ray_head(ray_cli: str, env: dict[str, str], log: Path):
    """`ray start --head --block` on 127.0.0.1 in its own process group, stopped by signalling that group (not `ray stop`,
    which would stop every Ray instance on the machine); yields its address."""
    port = _free_port()
    with open(log, "w") as out:
        head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
                                 "--include-dashboard", "false", "--disable-usage-stats"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        while "Ray runtime started" not in log.read_text():
            if head.poll() is not None:
                sys.exit(f"ray start failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                head.wait(wait_s)
                break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve-search", choices=("on", "off"), default="off")
    parser.add_argument("--local-ray", action="store_true", help="time a local Ray instance started by the run instead of joining a head")
    parser.add_argument("--backend", action="append", default=[], help="only these candidates (repeat; default: the strategy's)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both executors, in alternating order; the line sums them")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray_cli is None:
        sys.exit("the ray command is not next to this interpreter: pip install 'aitune-export[fleet]'")
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}  # the head's token, for the Ray driver too
    totals = {"local": 0.0, "ray": 0.0}
    try:
        with contextlib.ExitStack() as stack:
            address = None
            if not args.local_ray:
                address = stack.enter_context(_ray_head(ray_cli, dict(os.environ, PYTHONPATH=str(ROOT), **auth), tmp / "ray_head.log"))
            for round_ in range(args.rounds):
                order = ("local", "ray") if round_ % 2 == 0 else ("ray", "local")  # alternate, so drift favours neither
                for name in order:
                    folder = tmp / f"{name}-{round_}"
                    plan = _plan(folder, name, address if name == "ray" else None, args.serve_search, args.backend)
                    seconds, doc = _run(plan, auth if name == "ray" and address else {})
                    totals[name] += seconds
                    models = ", ".join(f"{m['name']} {m['status']} {m['backend']} max {m['max_batch_size']} in {m['seconds']:.0f} s"
                                       for m in doc["models"])
                    print(f"round {round_ + 1} {name}: {seconds:.1f} s wall ({models})", flush=True)
        line = f"fleet ray_seconds={totals['ray']:.1f} local_seconds={totals['local']:.1f} ratio={totals['ray'] / totals['local']:.3f}"
        print(line)
        write_result("fleet", {**line_figures(line), "settings": {
            "rounds": args.rounds, "order": "alternating (local first, then Ray first); the figures sum the rounds",
            "models": "cnn, transformer (the bundled examples)", "backends": ", ".join(args.backend) or "the strategy's",
            "serve_search": args.serve_search, "ray": "a local Ray started by each run" if args.local_ray else "a head started on 127.0.0.1 before timing"}})
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
