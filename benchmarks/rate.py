"""Rate: does an export with --rate max --latency-budget-ms B publish the config of its backend that holds the most
requests per second open-loop, and does its capacity claim hold when measured again?

Per model (the bundled CNN, fixed shape; the bundled transformer and a BERT-style encoder from a small transformers
config with random weights, both under lognormal lengths; BERT skipped with the reason when transformers is absent):
export with `--rate max --latency-budget-ms B`, then in one local tritonserver under a held-out traffic of the same kind:

- a same-backend grid (max_batch_size 1 / 4 / 16 x queue delay 0 / 2000 us x the instance layouts), each point's capacity
  at B once (the same capacity search as the export: rates on one grid, Poisson arrivals);
- the emitted config and the grid's best in paired rounds (emitted, best, best, emitted, ...), each round a capacity
  search of each, refined to the half rung as the export refines its claim: the ratio of capacities with its 90%
  interval, and emitted against the report's claim.

With --model-analyzer, Model Analyzer's own request-rate search (request_rate_search_enable, Poisson arrivals, the
budget as its p95 constraint, bounded as the grid; benchmarks/model_analyzer_run.py) runs first and alone on the same
model file and the export's traffic; its pick joins the paired rounds, its capacity measured the same way as ours.

    .venv/bin/python benchmarks/rate.py [--models cnn,transformer,bert] [--budget-ms 20] [--rounds 3] [--workdir DIR] [--model-analyzer]

One line per model (the last lines), and a JSON record in benchmarks/results/rate.json:
    rate model=NAME budget_ms=B emitted_cap=X best_cap=Y ratio=X/Y ratio_lo=L ratio_hi=H claim=Z claim_ratio=X/Z rounds=N
      [ma_cap=M ma_ratio=X/M ma_s=SECONDS]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_analyzer_run import ma_variant, rate_search  # noqa: E402
from served_grid import paired_ratio  # noqa: E402
from served_lab import ROOT, Lab, Load, Refused, Variant, open_export  # noqa: E402
from results import merge_models, write_result  # noqa: E402
from traffic_models import BERT_VOCAB, has_transformers, write_traffic  # noqa: E402

from optimizer.machine import cpu_cores  # noqa: E402
from optimizer.records.capacity import Capacity  # noqa: E402
from optimizer.records.served_search import OperatingPoint  # noqa: E402
from optimizer.triton.measure.capacity import find_capacity, refine  # noqa: E402
from optimizer.triton.measure.served_search.measure import WARMUP_PER_SLOT, warm_up  # noqa: E402
from optimizer.triton.measure.served_search.objective import Objective  # noqa: E402

MODELS = {
    "cnn": {"model": None, "args": [], "traffic": None},
    "transformer": {"model": "optimizer.examples.transformer:build", "traffic": (1000, False),
                    "args": ["--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999"]},
    "bert": {"model": "benchmarks.traffic_models:bert", "traffic": (BERT_VOCAB, True),
             "args": ["--input", "input_ids:int64:1-128", "--input", "attention_mask:int64:1-128",
                      "--value-range", f"input_ids:0:{BERT_VOCAB - 1}", "--value-range", "attention_mask:1:1"]},
}
GRID_BATCHES = (1, 4, 16)
GRID_DELAYS = (0, 2000)
REQUESTS = 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="cnn,transformer,bert")
    parser.add_argument("--budget-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--model-analyzer", action="store_true", help="also run Model Analyzer's request-rate search and measure its pick")
    parser.add_argument("--ma-timeout", type=float, default=1500.0, help="seconds Model Analyzer may run per model")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="aitune-rate-"))
    lines: list[str] = []
    record: dict[str, Any] = {"settings": {"budget_ms": args.budget_ms, "rounds": args.rounds, "percentile": 95, "arrivals": "poisson",
                                           "interval": "90%, Student's t over the paired rounds' log ratios",
                                           "model_analyzer": "request-rate search" if args.model_analyzer else "not run"}, "models": {}}
    for name in args.models.split(","):
        if name not in MODELS:
            raise Refused(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
        if name == "bert" and not has_transformers():
            record["models"][name] = {"skipped": "transformers is not installed (pip install -e '.[benchmarks]')"}
            print(f"skipped {name}: transformers is not installed", flush=True)
            continue
        record["models"][name] = one_model(name, MODELS[name], args.budget_ms, args.rounds, work / name, lines,
                                            args.ma_timeout if args.model_analyzer else None)
    write_result("rate", merge_models("rate", record.pop("models"), record))  # benchmarks/results/rate.json (results.py)
    print("\n".join(lines))
    return 0


def one_model(name: str, spec: dict[str, Any], budget: float, rounds: int, work: Path, lines: list[str],
              ma_timeout: float | None = None) -> dict[str, Any]:
    """The export, Model Analyzer's search if asked (alone, before any server of ours), then the grid's capacities and the
    paired rounds under the held-out traffic."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    extra, held_out = [], None
    if spec["traffic"]:
        vocab, mask = spec["traffic"]
        extra = ["--traffic", str(write_traffic(work / "traffic.json", REQUESTS, seed=1, vocab=vocab, mask=mask))]
        held_out = write_traffic(work / "held_out.json", REQUESTS, seed=2, vocab=vocab, mask=mask)
    t0 = time.monotonic()
    command = [str(Path(sys.executable).parent / "aitune-export"), "export", *([spec["model"]] if spec["model"] else []), *spec["args"], *extra,
               "--rate", "max", "--latency-budget-ms", f"{budget:g}", "--repository", str(work / "repo"), "--report-dir", str(work / "report"),
               "--name", name, "--no-cache"]  # measured now, not a served search an older checkout cached
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    (work / "export.log").write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        raise SystemExit(f"the export of {name} failed: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}")
    out: dict[str, Any] = {"export_s": round(time.monotonic() - t0, 1), "command": " ".join(command[1:])}
    print(f"exported {name} in {out['export_s']:.0f} s", flush=True)
    export = open_export(work / "repo", name, work / "report")
    search = export.search
    claim = Capacity.from_json(search.capacity) if search is not None and search.capacity else None
    out["claim"] = claim.to_json() if claim else None
    emitted = export.emitted()
    out["emitted"] = f"{export.result.selected}: {emitted.point.label}"
    cores = cpu_cores()
    layouts = [n for n in (1, 2, 4, 8) if n <= cores]
    grid = [export.variant(OperatingPoint(b, (), d, n, cores // n if export.thread_parameter else None))
            for b in GRID_BATCHES for d in GRID_DELAYS for n in layouts if not (b == 1 and d)]
    picked = None
    if ma_timeout is not None:
        ma = rate_search(export.published.get("model_analyzer_config"), budget, 95, max(GRID_BATCHES), max(layouts), work, ma_timeout)
        picked = ma_variant(ma, export.thread_parameter)
        out["model_analyzer"] = {k: ma[k] for k in ("status", "reason", "seconds", "best") if k in ma}
        if picked is not None:
            out["model_analyzer"]["pick"] = picked.point.label
            print(f"model_analyzer: picked {picked.point.label} ({ma['best']['throughput']:.1f} infer/s at request rate "
                  f"{ma['best']['request_rate']} in its own search), {ma['seconds']:.0f} s; it joins the paired rounds", flush=True)
        else:
            print(f"model_analyzer {ma['status']}: {ma.get('reason')}", flush=True)
    load = Load(1, "benchmarks/rate.py", Objective(latency_budget_ms=budget))
    seed = claim.rate_per_s if claim and claim.rate_per_s else 50.0
    with Lab(export, load, work / "lab", traffic=held_out) as lab:
        caps = [_capacity(lab, v, budget, seed) for v in grid]
        out["grid"] = [{"point": v.label, "capacity": c.to_json() if c else None} for v, c in zip(grid, caps)]
        measured = [(v, c) for v, c in zip(grid, caps) if c is not None and c.rate_per_s]
        if not measured:
            out["error"] = "no grid point held any rate within the budget"
            return out
        best_v = max(measured, key=lambda vc: (vc[1].rate_per_s, -vc[1].curve[-1].p95_ms))[0]
        best = Variant("best", best_v.point, best_v.text, best_v.extra)
        out["best"] = best_v.point.label
        contenders = [emitted, best] + ([picked] if picked is not None else [])
        pairs: list[tuple[float, float]] = []
        ma_caps: list[float] = []
        for r in range(rounds):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]  # each goes first in turn
            got = {v.label: _capacity(lab, v, budget, seed, refined=True) for v in order}
            e, b = got["emitted"], got["best"]
            pairs.append((e.rate_per_s or 0.0, b.rate_per_s or 0.0))
            if picked is not None:
                ma_caps.append(got[picked.label].rate_per_s or 0.0)
            print(f"round {r + 1}: emitted {pairs[-1][0]:g}/s, best {pairs[-1][1]:g}/s"
                  + (f", model analyzer's pick {ma_caps[-1]:g}/s" if ma_caps else ""), flush=True)
        out["rounds"] = [{"emitted": e, "best": b, **({"model_analyzer": ma_caps[i]} if ma_caps else {})} for i, (e, b) in enumerate(pairs)]
    if not any(e > 0 for e, _ in pairs) and any(b > 0 for _, b in pairs):
        ratio = lo = hi = 0.0  # the published config held no rate in any round where the best held one: nothing to pair
    else:
        ratio, lo, hi = paired_ratio([e for e, _ in pairs], [b for _, b in pairs])
    emitted_cap = statistics.median(e for e, _ in pairs)
    best_cap = statistics.median(b for _, b in pairs)
    claimed = claim.rate_per_s if claim and claim.rate_per_s else 0.0
    out |= {"emitted_cap": emitted_cap, "best_cap": best_cap, "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
            "claim_ratio": emitted_cap / claimed if claimed else None}
    line = (f"rate model={name} budget_ms={budget:g} emitted_cap={emitted_cap:g} best_cap={best_cap:g} ratio={ratio:.3f} ratio_lo={lo:.3f} "
            f"ratio_hi={hi:.3f} claim={claimed:g} claim_ratio={emitted_cap / claimed if claimed else 0:.3f} rounds={len(pairs)}")
    if ma_caps:
        ma_cap = statistics.median(ma_caps)
        out |= {"ma_cap": ma_cap, "ma_ratio": emitted_cap / ma_cap if ma_cap else None, "ma_s": out["model_analyzer"].get("seconds")}
        line += f" ma_cap={ma_cap:g} ma_ratio={emitted_cap / ma_cap if ma_cap else 0:.3f} ma_s={out['ma_s']:.0f}"
    lines.append(line)
    return out


def _capacity(lab: Lab, v: Variant, budget: float, seed: float, refined: bool = False) -> Capacity | None:
    """One config's capacity at the budget, loaded alone under a private name (the export's own capacity search);
    `refined`: to the half rung, as the export refines its claim (the grid pass ranks on whole rungs, as its finalists)."""
    if v.reason:
        return None
    names = lab._names([v])
    if lab._load(names):
        lab.loader.unload(list(names))
        return None
    name = next(iter(names))
    bench = lab.padded_bench if v.padded else lab.bench
    try:
        warm_up(bench, name, 4, 4 * WARMUP_PER_SLOT)
        cap = find_capacity(lambda rate: bench.measure_rate(name, rate), budget, 95, "poisson", seed, run_cost_s=7.5)
        if refined:
            cap = refine(lambda rate: bench.measure_rate(name, rate), cap, run_cost_s=7.5)
    finally:
        lab.loader.unload(list(names))
    print(f"  {v.label:<44} {cap.describe()}", flush=True)
    return cap


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
