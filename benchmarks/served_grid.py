"""Served grid: every served config in a brute-force grid (Model Analyzer's brute search) against the emitted one.

Why: the served search measures a coarse pass and a refinement within a time budget, and with --serve-search off the
in-process rules alone decide. An exhaustive grid over the same knobs, measured in the same real tritonserver at the
same load on the same request mix, says how much throughput the emitted config leaves on the table (emitted/best).

One way to build, load and measure a variant, the served search's own (issue 27 item 5, benchmarks/served_lab.py): a
grid point is an `OperatingPoint`, labelled by `point_label`, rendered by `publish.prepare_config` exactly as the export
would publish it, loaded under a private name with the config in the load request (`VariantLoader`; the published
repository is never written), warmed by `warm_up` and measured by `measure_level` (`Bench`). Variants are loaded a few
at a time and never while another is measured.

The grid: max_batch_size 1, 2, 4, ... --max-batch (never above what the artifact accepts or the export's
--max-batch-size; a model that does not batch only at 0) x instances 1..cores (intra-op threads cores // count)
x max_queue_delay_microseconds 0 / 100 / 1000, no preferred_batch_size (as Model Analyzer's brute search leaves it).

The load is the export's (report.json -> published.served_search): the concurrency its objective scored the published
variant at (the target load; for a max-throughput export the concurrency where the published variant peaked), and
with a latency budget only grid points that meet it at that load count. `--concurrency N` overrides it.

How the ratio is measured (one pass over the grid is not a measurement: a config's throughput moves from one
measurement to the next, so the best of one pass is partly luck): 1. the emitted config, then every grid point once;
2. every grid point within 10% of the grid's best is measured again, and again for points that come within 10% of the
best mean once a lucky maximum has fallen (each point at most twice); the best is the highest mean, always of two
measurements; 3. the emitted config and that best are measured in --rounds paired rounds whose order alternates
(emitted, best, best, emitted, ...), so drift hits both.
Only the paired rounds count: choosing the best on other measurements keeps the winner's luck out of the ratio.
The ratio is the geometric mean of the per-round ratios emitted/best, with a 90% interval from Student's t over
their logarithms (emitted= and best= are the geometric means of the rounds, so emitted/best = ratio).

    .venv/bin/python benchmarks/served_grid.py REPO [--model NAME] [--report DIR] [--concurrency N] [--quick] [--model-analyzer]

--model-analyzer first runs triton-model-analyzer 1.58 alone (`model-analyzer profile -f` on the model_analyzer.yaml
the export wrote beside its report: local launch mode, so it starts the bundled tritonserver 2.51 itself through the
YAML's launcher, which sets LD_LIBRARY_PATH and the python stub's PATH, and runs perf_analyzer through its launcher with
the server's metrics endpoint on), its brute search bounded as the grid (max batch, instances) at the same concurrency.
Its best config then joins the paired rounds as a third contender, so `ma_best` is measured beside ours in the same
rounds (its own figure, from its own server minutes earlier, goes to the JSON); `ma_seconds` is how long it ran.

The full grid goes to served_grid.json beside the report; the last line is machine-readable:
    served_grid model=<name> emitted=<inf/s> best=<inf/s> ratio=<emitted/best> ratio_lo=<90% low> ratio_hi=<90% high>
        emitted_p95_ms=<ms> best_p95_ms=<ms> grid_seconds=<s> [ma_best=<inf/s> ma_seconds=<s>]
and its figures, with the load, the configs compared and the rounds, go to benchmarks/results/served_grid.json (results.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # served_lab: the benchmarks' measuring parts

from model_analyzer_run import concurrency_search, ma_variant  # noqa: E402
from results import line_figures, merge_models, write_result  # noqa: E402
from served_lab import Lab, Load, Refused, open_export, show  # noqa: E402

from optimizer.errors import ValidationError  # noqa: E402
from optimizer.machine import cpu_cores  # noqa: E402
from optimizer.records.served_search import OperatingPoint, ServedSearch  # noqa: E402
from optimizer.triton.measure.served_search.objective import Objective  # noqa: E402

DELAYS_US = (0, 100, 1000)
QUICK = {"batches": (1, 2, 4, 8, 16), "instances": (1, 2), "delays": (0, 1000)}
"""--quick: a few minutes on a small machine, against the full grid's much longer run."""
RECHECK = 0.10
"""Every grid point within 10% of the grid's best is measured again: one measurement of a config differs from the next
by up to 10% on this machine, so any of them may be the real best."""
ROUNDS, QUICK_ROUNDS = 6, 4
DEFAULT_CONCURRENCY = 16
"""The load when the report has none (the served search was off or skipped)."""
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812, 11: 1.796, 12: 1.782,
        13: 1.771, 14: 1.761, 15: 1.753, 16: 1.746, 17: 1.740, 18: 1.734, 19: 1.729, 20: 1.725, 25: 1.708, 30: 1.697}
"""Student's t at 95% by degrees of freedom: a 90% two-sided interval (1.645 beyond 30; between rows, the smaller df's)."""


def paired_ratio(emitted: list[float], best: list[float]) -> tuple[float, float, float]:
    """The geometric mean of the per-round ratios emitted/best and its 90% interval (Student's t over their logarithms).

    Rounds where either side measured nothing (<= 0) are left out; one round gives an unbounded interval (0, inf)."""
    logs = [math.log(e / b) for e, b in zip(emitted, best) if e > 0 and b > 0]
    if not logs:
        raise ValueError("no paired round measured both configs")
    n = len(logs)
    mean = sum(logs) / n
    if n == 1:
        return math.exp(mean), 0.0, math.inf
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    df = n - 1
    t = 1.645 if df > 30 else _T95[max(k for k in _T95 if k <= df)]
    half = t * sd / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def geometric_mean(values: list[float]) -> float:
    """The mean that matches paired_ratio: geometric_mean(emitted) / geometric_mean(best) is its ratio."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def export_load(search: ServedSearch | None, override: int | None) -> Load:
    """The load of the export's served search (report.json -> published.served_search), or --concurrency."""
    budget = search.latency_budget_ms if search else None
    percentile = search.percentile if search else 95
    if override:
        return Load(override, "--concurrency", Objective(override, budget, percentile))
    if search is not None and search.status == "searched" and search.concurrency:
        what = {"concurrency": "its target load", "latency": "where the published variant served the most within the budget",
                "max-throughput": "where the published variant peaked"}.get(search.objective, search.objective)
        return Load(search.concurrency, f"the export's ({search.objective} objective: {what})", Objective(search.concurrency, budget, percentile))
    status = f"served search {search.status}" if search else "no served search recorded"
    return Load(DEFAULT_CONCURRENCY, f"the default ({status} in the report)", Objective(DEFAULT_CONCURRENCY, budget, percentile))


def batch_cap(config: Any, artifact: Any, decision: Any, wanted: int, user_max: int | None) -> tuple[int, str]:
    """The largest max_batch_size the grid may try, and what set it: --max-batch, the export's --max-batch-size, the
    TensorRT engine, the AOTInductor batch dim, or the memory ceiling the export ran into."""
    if config.max_batch_size == 0:
        return 0, "the model does not batch (published max_batch_size 0)"
    caps = [(wanted, "--max-batch")]
    if user_max:
        caps.append((user_max, "the export's --max-batch-size"))
    if artifact.metadata.get("engine_max_batch"):
        caps.append((int(artifact.metadata["engine_max_batch"]), "the TensorRT engine's profiles"))
    if artifact.triton_platform == "torch_aoti":
        from optimizer.backend.torch_aoti import BATCH_DIM_FLOOR

        caps.append((max(artifact.batch_range[1], BATCH_DIM_FLOOR), "the AOTInductor package's batch dim"))
    if decision is not None and decision.ceiling:
        caps.append((decision.ceiling, "the largest batch that fit in memory in-process"))
    return min(caps)


def grid(cap: int, cores: int, quick: bool, thread_parameter: str | None) -> list[OperatingPoint]:
    """Every point, in measuring order (batch, then instances, then delay); max batch 0 and 1 have no delay to vary."""
    batches = [0] if cap == 0 else [b for b in (2 ** i for i in range(cap.bit_length())) if b <= cap]
    counts = list(range(1, cores + 1))
    delays: tuple[int, ...] = DELAYS_US
    if quick:
        batches = [b for b in batches if b == 0 or b in QUICK["batches"]]
        counts, delays = [c for c in counts if c in QUICK["instances"]], QUICK["delays"]
    return [OperatingPoint(b, (), d, n, cores // n if thread_parameter else None)
            for b in batches for n in counts for d in (delays if b > 1 else (0,))]


def write_json(path: Path, doc: dict[str, Any]) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        json.dump(doc, tmp, indent=2)
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile makes it 0600
    os.replace(tmp.name, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path, help="the repository `aitune-export export` published")
    parser.add_argument("--model", help="model name (default: the only public model in REPO)")
    parser.add_argument("--report", type=Path, help="the export's report folder (default: found from the repository)")
    parser.add_argument("--concurrency", type=int, help="the load of every measurement (default: the export's, from its report)")
    parser.add_argument("--max-batch", type=int, default=128, help="largest max_batch_size in the grid")
    parser.add_argument("--rounds", type=int, help=f"paired rounds emitted/best that count (default {ROUNDS}, {QUICK_ROUNDS} with --quick)")
    parser.add_argument("--quick", action="store_true", help=f"a small grid: max batch {QUICK['batches']}, instances {QUICK['instances']}, delay {QUICK['delays']} us")
    parser.add_argument("--model-analyzer", action="store_true", help="also run `model-analyzer profile` on the export's model_analyzer.yaml, bounded as the grid")
    parser.add_argument("--ma-timeout", type=float, default=1800.0, help="seconds Model Analyzer may run")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the server too, as Ctrl-C does
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if (args.concurrency is not None and args.concurrency < 1) or (args.rounds is not None and args.rounds < 2):
        print("--concurrency must be >= 1 and --rounds >= 2 (an interval needs two paired rounds)", file=sys.stderr)
        return 2
    try:
        export = open_export(args.repo, args.model, args.report)
    except Refused as err:
        print(f"served_grid: {err}", file=sys.stderr)
        return 2
    target, artifact = export.target, export.result.selected_candidate.artifact
    load = export_load(export.search, args.concurrency)
    cores = cpu_cores()
    cap, cap_by = batch_cap(target.config, artifact, export.result.selected_candidate.decision, args.max_batch, export.settings.batch_cap())
    points = grid(cap, cores, args.quick, export.thread_parameter)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    emitted = export.emitted()
    variants = [export.variant(p) for p in points]
    budget = load.objective.latency_budget_ms
    print(f"{target.name}: {target.config.platform or target.config.backend}, emitted {emitted.point.label}; grid of {len(points)} points "
          f"(max batch <= {cap}: {cap_by}), {cores} cores; concurrency {load.concurrency}: {load.source}"
          + (f"; only points within p{load.objective.percentile} <= {budget:g} ms count" if budget is not None else ""), flush=True)

    with tempfile.TemporaryDirectory(prefix="served-grid-") as tmp:
        work = Path(tmp)
        ma: dict[str, Any] = {"status": "skipped", "reason": "not asked (pass --model-analyzer)"}
        contenders = []
        if args.model_analyzer:  # first, alone: its servers and ours never measure at the same time
            ma = concurrency_search(export.published.get("model_analyzer_config"), load.concurrency, max(p.max_batch_size for p in points),
                                max(p.instances for p in points), work, args.ma_timeout)
            picked = ma_variant(ma, export.thread_parameter)
            if picked is not None:
                contenders.append(picked)
                print(f"model_analyzer: best {ma['best']['config']} ({picked.point.label}) {ma['best']['throughput']:.1f} infer/s in its "
                      f"own server at concurrency {ma['best']['concurrency']}, {ma['seconds']:.0f} s; it joins the paired rounds", flush=True)
            else:
                print(f"model_analyzer {ma['status']}: {ma.get('reason')}", flush=True)
        try:
            with Lab(export, load, work) as lab:
                first = lab.measure([emitted], lab.bench.window_ms, "emitted")[0]
                if first["status"] != "measured":  # once more: perf_analyzer can exit 3 without a word on a busy machine
                    first = lab.measure([emitted], lab.bench.window_ms, "emitted")[0]
                if first["status"] != "measured":
                    print(f"served_grid failed: the emitted config could not be measured: {first['reason']}", file=sys.stderr)
                    return 1
                window = lab.bench.window_for(first["throughput"])
                t0 = time.monotonic()
                rows = lab.measure(variants, window, "grid")
                grid_seconds = time.monotonic() - t0
                measured = [i for i, r in enumerate(rows) if r["status"] == "measured"]
                if not measured:
                    print("served_grid failed: no grid point could be measured", file=sys.stderr)
                    return 1
                counting = [i for i in measured if rows[i]["meets"]] or measured  # none within the budget: the most throughput
                while True:  # until every point within 10% of the best mean has been measured twice (each at most twice)
                    top = max(_mean_throughput(rows[i]) for i in counting)
                    close = [i for i in counting if "again" not in rows[i] and _mean_throughput(rows[i]) >= (1 - RECHECK) * top]
                    if not close:
                        break
                    for i, row in zip(close, lab.measure([variants[i] for i in close], window, "again")):
                        rows[i]["again"] = row
                best_i = max(counting, key=lambda i: _mean_throughput(rows[i]))
                best = replace(variants[best_i], label="best")
                print(f"best of the grid: {best.point.label} ({_mean_throughput(rows[best_i]):.1f}/s, the mean of its grid and second "
                      f"measurement; {sum('again' in r for r in rows)} point(s) came within {RECHECK:.0%} of the best and were measured again)",
                      flush=True)
                paired = lab.rounds([emitted, best, *contenders], rounds, 2 * window,
                                    lambda r, v, row: show(f"round {r + 1}/{rounds}", v, row))
                mix = lab.mix
        except ValidationError as err:  # the server died, or a config the grid measured before no longer loads
            print(f"served_grid failed: {err}", file=sys.stderr)
            return 1

    pairs = [(e, b) for e, b in zip(paired[0], paired[1]) if e["status"] == b["status"] == "measured"]
    if len(pairs) < 2:
        print(f"served_grid failed: only {len(pairs)} of {rounds} paired rounds measured both configs", file=sys.stderr)
        return 1
    ratio, lo, hi = paired_ratio([e["throughput"] for e, _ in pairs], [b["throughput"] for _, b in pairs])
    emitted_tp, best_tp = geometric_mean([e["throughput"] for e, _ in pairs]), geometric_mean([b["throughput"] for _, b in pairs])
    emitted_p95 = sum(e["p95_ms"] for e, _ in pairs) / len(pairs)
    best_p95 = sum(b["p95_ms"] for _, b in pairs) / len(pairs)
    busy = max(m["others_cpu"] for pair in pairs for m in pair)
    shown = {side: ", ".join(f"{pair[k]['throughput']:.1f}" for pair in pairs) for k, side in enumerate(("emitted", "best"))}
    print(f"paired rounds: emitted {shown['emitted']}; best {shown['best']} infer/s; others' CPU up to {busy:.0%} (a busy machine moves both)")
    print(f"emitted {emitted.point.label} vs best {best.point.label}: ratio {ratio:.3f}, 90% interval {lo:.3f}..{hi:.3f} over "
          f"{len(pairs)} paired rounds (Student's t over the log ratios); grid {grid_seconds:.0f} s, {len(rows) - len(measured)} point(s) failed")
    ma_line = ""
    if contenders:  # Model Analyzer's pick, measured in the same rounds as ours (its own figure came from another server run)
        ma["paired"] = paired[2]
        both = [(e["throughput"], m["throughput"]) for e, m in zip(paired[0], paired[2]) if e["status"] == m["status"] == "measured"]
        if both:
            ma_tp = geometric_mean([m for _, m in both])
            ma["ratio"] = paired_ratio([e for e, _ in both], [m for _, m in both])  # emitted / Model Analyzer's pick
            print(f"model_analyzer's pick {contenders[0].point.label}: {ma_tp:.1f} infer/s in the paired rounds; emitted/its pick "
                  f"{ma['ratio'][0]:.3f} (90% {ma['ratio'][1]:.3f}..{ma['ratio'][2]:.3f}); Model Analyzer took {ma['seconds']:.0f} s")
            ma_line = f" ma_best={ma_tp:.1f} ma_seconds={ma['seconds']:.0f}"
        else:
            ma_line = f" ma_best=failed ma_seconds={ma['seconds']:.0f}"
    elif args.model_analyzer:
        ma_line = f" ma_best=failed ma_seconds={ma.get('seconds', 0):.0f}"
    out = export.report.parent / "served_grid.json"  # beside the report used (--report DIR when it holds report.json)
    write_json(out, {"model": target.name, "repository": str(target.repository), "report": str(export.report),
                     "platform": target.config.platform or target.config.backend, "concurrency": load.concurrency, "load": load.source,
                     "objective": load.objective.describe(), "cores": cores, "request_mix": mix, "max_batch_cap": cap, "cap_by": cap_by,
                     "quick": args.quick, "emitted": {"point": emitted.point.to_json(), "label": emitted.point.label, "first": first},
                     "best": {"point": best.point.to_json(), "label": best.point.label},
                     "rounds": {"emitted": paired[0], "best": paired[1], "order": "emitted best, best emitted, ... (alternating)"},
                     "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi, "interval": "90%, Student's t over the per-round log ratios",
                     "grid_seconds": round(grid_seconds, 1), "grid": rows, "model_analyzer": ma})
    print(f"wrote {out}")
    line = (f"served_grid model={target.name} emitted={emitted_tp:.1f} best={best_tp:.1f} ratio={ratio:.3f} ratio_lo={lo:.3f} "
            f"ratio_hi={hi:.3f} emitted_p95_ms={emitted_p95:.1f} best_p95_ms={best_p95:.1f} grid_seconds={grid_seconds:.0f}{ma_line}")
    print(line)
    entry = {**{k: v for k, v in line_figures(line).items() if k != "model"}, "paired_rounds": len(pairs), "concurrency": load.concurrency,
             "load": load.source, "emitted_config": emitted.point.label, "best_config": best.point.label, "grid_points": len(points),
             "failed_points": len(rows) - len(measured), "max_batch_cap": cap, "quick": args.quick,
             "platform": target.config.platform or target.config.backend, "cores": cores}
    write_result("served_grid", merge_models("served_grid", {target.name: entry}, {"settings": {
        "rounds": rounds, "order": "emitted, best, best, emitted, ... (alternating)",
        "interval": "90%, Student's t over the per-round log ratios emitted/best", "recheck": f"grid points within {RECHECK:.0%} of the best measured twice",
        "model_analyzer": args.model_analyzer}}))
    return 0


def _mean_throughput(row: dict[str, Any]) -> float:
    """A grid point's mean over its measurements (the grid pass and, within 10% of the best, the second one)."""
    values = [m["throughput"] for m in (row, row.get("again")) if m and m.get("status") == "measured"]
    return sum(values) / len(values) if values else 0.0


if __name__ == "__main__":
    sys.exit(main())
