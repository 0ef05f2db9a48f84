"""Traffic: does an export tuned for the traffic users send serve it as well as the best config of its backend?

Per model (the bundled transformer; a BERT-style encoder from a small transformers config with random weights, skipped
with the reason when transformers is absent): a traffic of lognormal lengths (traffic_models.py) is written, and the
model is exported twice, with `--traffic` and with no flags at all. Under a held-out traffic of the same kind (another
draw), in one local tritonserver per export, at each load:

- the export with --traffic against a brute grid of its own backend (max_batch_size 1, 2, 4, 8, 16 x queue delay 0 /
  1000 us x the instance layouts; max 1 without a delay included): every grid point once per load, then the emitted config
  and the grid's best at that load in paired rounds (emitted, best, best, emitted, ...), as benchmarks/served_grid.py;
- each export against "the pair": max 1 without a delay and its own published max without a delay, in paired rounds.

A config that tells clients to pad (client_padding) is measured with the traffic padded as its clients send it.

    .venv/bin/python benchmarks/traffic.py [--models transformer,bert] [--loads 1,4,16] [--rounds 4] [--workdir DIR]

One line per model and load (the last lines), and a JSON record in benchmarks/results/traffic.json:
    traffic model=NAME load=C emitted=X best=Y ratio=R ratio_lo=L ratio_hi=H p95_ratio=P
    traffic_pair model=NAME export=traffic|default load=C emitted=X pair=Y ratio=R ratio_lo=L ratio_hi=H p95_ratio=P
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from served_grid import geometric_mean, paired_ratio  # noqa: E402
from served_lab import ROOT, Lab, Load, Refused, Variant, open_export  # noqa: E402
from results import merge_models, write_result  # noqa: E402
from traffic_models import BERT_VOCAB, has_transformers, write_traffic  # noqa: E402

from optimizer.machine import cpu_cores  # noqa: E402
from optimizer.records.served_search import OperatingPoint  # noqa: E402
from optimizer.triton.measure.served_search.objective import Objective  # noqa: E402

MODELS = {
    "transformer": {"model": "optimizer.examples.transformer:build", "vocab": 1000, "mask": False,
                    "args": ["--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999"]},
    "bert": {"model": "benchmarks.traffic_models:bert", "vocab": BERT_VOCAB, "mask": True,
             "args": ["--input", "input_ids:int64:1-128", "--input", "attention_mask:int64:1-128",
                      "--value-range", f"input_ids:0:{BERT_VOCAB - 1}", "--value-range", "attention_mask:1:1"]},
}
GRID_BATCHES = (1, 2, 4, 8, 16)
GRID_DELAYS = (0, 1000)
WINDOW_MS = 1000
REQUESTS = 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="transformer,bert")
    parser.add_argument("--loads", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None, help="keep exports and logs here (default: a temporary folder)")
    args = parser.parse_args()
    loads = tuple(int(x) for x in args.loads.split(","))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="aitune-traffic-"))
    work.mkdir(parents=True, exist_ok=True)
    shown = [a for i, a in enumerate(sys.argv) if a != "--workdir" and (i == 0 or sys.argv[i - 1] != "--workdir")]  # a scratch folder
    record: dict[str, Any] = {"benchmark": "traffic", "command": " ".join(["python", *shown]), "loads": list(loads),
                              "rounds": args.rounds, "models": {}}
    lines: list[str] = []
    for name in args.models.split(","):
        spec = MODELS[name]
        if spec["mask"] and not has_transformers():
            print(f"traffic model={name} skipped: transformers is not installed (pip install -e '.[benchmarks]')", flush=True)
            record["models"][name] = {"skipped": "transformers is not installed"}
            continue
        record["models"][name] = one_model(name, spec, loads, args.rounds, work / name, lines)
    write_result("traffic", merge_models("traffic", record.pop("models"), record))  # benchmarks/results/traffic.json (results.py)
    print("\n".join(lines), flush=True)
    return 0


def one_model(name: str, spec: dict[str, Any], loads: tuple[int, ...], rounds: int, work: Path, lines: list[str]) -> dict[str, Any]:
    """Both exports of one model, then the grid and the pairs under the held-out traffic."""
    work.mkdir(parents=True, exist_ok=True)
    tuned = write_traffic(work / "traffic.json", REQUESTS, seed=1, vocab=spec["vocab"], mask=spec["mask"])
    held_out = write_traffic(work / "held_out.json", REQUESTS, seed=2, vocab=spec["vocab"], mask=spec["mask"])
    out: dict[str, Any] = {"exports": {}}
    for kind, extra in (("traffic", ["--traffic", str(tuned)]), ("default", [])):
        t0 = time.monotonic()
        repo, report = work / f"repo_{kind}", work / f"report_{kind}"
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(report, ignore_errors=True)
        run = subprocess.run([str(Path(sys.executable).parent / "aitune-export"), "export", spec["model"], *spec["args"], *extra, "--repository", str(repo),
                              "--report-dir", str(report), "--name", name], cwd=ROOT, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
        (work / f"export_{kind}.log").write_text(run.stdout + run.stderr)
        if run.returncode != 0:
            raise SystemExit(f"the {kind} export of {name} failed: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}")
        out["exports"][kind] = {"seconds": round(time.monotonic() - t0, 1)}
        print(f"exported {name} ({kind}) in {time.monotonic() - t0:.0f} s", flush=True)
    cores = cpu_cores()
    export = open_export(work / "repo_traffic", name, work / "report_traffic")
    emitted = export.emitted()
    out["exports"]["traffic"]["emitted"] = f"{export.result.selected}: {emitted.point.label}" + (" (clients pad)" if emitted.padded else "")
    grid = [export.variant(OperatingPoint(b, (), d, n, cores // n if export.thread_parameter else None))
            for b in GRID_BATCHES for d in GRID_DELAYS for n in _layouts(cores) if not (b == 1 and d)]
    load = Load(loads[0], "benchmarks/traffic.py", Objective(concurrency=loads[0]))
    with Lab(export, load, work / "lab_traffic", traffic=held_out) as lab:
        rows = lab.measure(grid, WINDOW_MS, "grid", loads)
        out["grid"] = rows
        per_load: dict[str, Any] = {}
        for c in loads:
            at = [(v, r) for v, r in zip([g for g in grid for _ in loads], rows) if r.get("status") == "measured" and r["concurrency"] == c]
            best_v = max(at, key=lambda vr: vr[1]["throughput"])[0] if at else None
            if best_v is None:
                continue
            best = Variant("best", best_v.point, best_v.text, best_v.extra)
            per_load[str(c)] = _paired(lab, [emitted, best], rounds, c)
            p = per_load[str(c)]
            lines.append(f"traffic model={name} load={c} emitted={p['a']:.1f} best={p['b']:.1f} ratio={p['ratio']:.3f} "
                         f"ratio_lo={p['lo']:.3f} ratio_hi={p['hi']:.3f} p95_ratio={p['p95_ratio']:.3f}")
            p["best_point"] = best_v.point.label
        out["against_grid"] = per_load
        out["pair_traffic"] = _pairs(lab, export, emitted, loads, rounds, name, "traffic", lines)
    default = open_export(work / "repo_default", name, work / "report_default")
    d_emitted = default.emitted()
    out["exports"]["default"]["emitted"] = f"{default.result.selected}: {d_emitted.point.label}" + (" (clients pad)" if d_emitted.padded else "")
    with Lab(default, load, work / "lab_default", traffic=held_out) as lab:
        out["pair_default"] = _pairs(lab, default, d_emitted, loads, rounds, name, "default", lines)
    return out


def _pairs(lab: Lab, export: Any, emitted: Variant, loads: tuple[int, ...], rounds: int, name: str, kind: str, lines: list[str]) -> dict[str, Any]:
    """The emitted config against the better of max 1 without a delay and its own max without a delay, at each load."""
    point = emitted.point
    pair = [export.variant(OperatingPoint(1, (), 0, point.instances, point.threads), "max 1"),
            export.variant(OperatingPoint(point.max_batch_size, (), 0, point.instances, point.threads), "published max, no delay")]
    out = {}
    for c in loads:
        measured = lab.measure(pair, WINDOW_MS, f"pair {c}", (c,))
        better = max((v for v, r in zip(pair, measured) if r.get("status") == "measured"), key=lambda v: measured[pair.index(v)]["throughput"],
                     default=None)
        if better is None:
            continue
        p = _paired(lab, [emitted, Variant("pair", better.point, better.text, better.extra)], rounds, c)
        p["pair_point"] = better.point.label
        out[str(c)] = p
        lines.append(f"traffic_pair model={name} export={kind} load={c} emitted={p['a']:.1f} pair={p['b']:.1f} ratio={p['ratio']:.3f} "
                     f"ratio_lo={p['lo']:.3f} ratio_hi={p['hi']:.3f} p95_ratio={p['p95_ratio']:.3f}")
    return out


def _paired(lab: Lab, variants: list[Variant], rounds: int, c: int) -> dict[str, Any]:
    """Two variants side by side, `rounds` paired rounds at load `c`: the ratio a/b with its 90% interval, and the p95s."""
    rows = lab.rounds(variants, rounds, WINDOW_MS, lambda r, v, row: None, concurrency=c)
    ok = [(a, b) for a, b in zip(*rows) if a.get("status") == "measured" and b.get("status") == "measured"]
    if not ok:
        return {"a": 0.0, "b": 0.0, "ratio": 0.0, "lo": 0.0, "hi": 0.0, "p95_ratio": 0.0, "rounds": rows}
    ratio, lo, hi = paired_ratio([a["throughput"] for a, _ in ok], [b["throughput"] for _, b in ok])
    p95_a, p95_b = geometric_mean([a["p95_ms"] for a, _ in ok]), geometric_mean([b["p95_ms"] for _, b in ok])
    return {"a": geometric_mean([a["throughput"] for a, _ in ok]), "b": geometric_mean([b["throughput"] for _, b in ok]), "ratio": ratio,
            "lo": lo, "hi": hi, "p95_ratio": p95_a / p95_b if p95_b else 0.0, "rounds": rows}


def _layouts(cores: int) -> list[int]:
    out, n = [], 1
    while n <= cores:
        out.append(n)
        n *= 2
    return out


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
