"""Served throughput: the emitted config against a naive one, side by side in one real tritonserver.

The naive model serves the same artifact with `max_batch_size: 0` and no dynamic batching (what a hand-written config
often looks like); the emitted one is what aitune-export published. Both are loaded side by side under private names
in one local tritonserver and measured at the same concurrency, in rounds whose order alternates (A B, B A, ...) so
machine noise hits both alike; the medians are compared. --diagnose adds the emitted config with one knob changed.

One way to build, load and measure a variant, the served search's and benchmarks/served_grid.py's (benchmarks/served_lab.py): the emitted config
is loaded as published; a diagnose variant is the emitted `OperatingPoint` with one field changed, rendered by
`publish.prepare_config` as the export would publish it; every config is loaded through `VariantLoader`, warmed by
`warm_up` and measured by `measure_level` (HTTP, the search's stability-based windows). The naive config is the one
that is not a served-search point (the batch axis becomes an ordinary dim), so it is the published config rewritten.

    .venv/bin/python benchmarks/served_throughput.py [REPO] [--model NAME] [--concurrency 8] [--rounds 2] [--diagnose]

The last line is machine-readable:
    served_throughput model=<name> emitted=<inf/s> naive=<inf/s> ratio=<emitted/naive>
and its figures (with --diagnose, each variant's too) go to benchmarks/results/served_throughput.json (results.py).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # served_lab: the benchmarks' measuring parts

from results import line_figures, merge_models, write_result  # noqa: E402
from served_lab import Export, Lab, Load, Refused, Variant, open_export, point_of  # noqa: E402

from optimizer.errors import ValidationError  # noqa: E402
from optimizer.records.served_search import OperatingPoint  # noqa: E402
from optimizer.triton.config.model_config import canonical, parse  # noqa: E402
from optimizer.triton.measure.served_search.objective import Objective  # noqa: E402


def naive_variant(export: Export, label: str) -> Variant:
    """The published model without batching: max_batch_size 0, no dynamic_batching, the batch axis as an explicit -1 dim."""
    emitted = export.emitted(label)
    config = parse(emitted.text)
    config.ClearField("dynamic_batching")
    for tensor in [*config.input, *config.output]:
        dims = [-1, *tensor.dims]
        del tensor.dims[:]
        tensor.dims.extend(dims)
        if tensor.HasField("reshape"):
            shape = [-1, *tensor.reshape.shape]
            del tensor.reshape.shape[:]
            tensor.reshape.shape.extend(shape)
    config.max_batch_size = 0
    config.ClearField("model_warmup")  # its samples are batch-1 rows without the batch axis
    return replace(emitted, text=canonical(config), point=replace(emitted.point, max_batch_size=0, preferred=(), queue_delay_us=0),
                   extra={}, batching=False)


def diagnose_point(point: OperatingPoint, change: str) -> OperatingPoint:
    """The emitted point with one knob changed (--diagnose): which knob makes it slower or faster than naive?"""
    if change == "no_queue_delay":
        return replace(point, queue_delay_us=0)
    if change == "no_preferred":
        return replace(point, preferred=())
    if change.startswith("max_batch_"):
        cap = int(change.rsplit("_", 1)[1])
        return replace(point, max_batch_size=min(cap, point.max_batch_size), preferred=tuple(b for b in point.preferred if b <= cap))
    if change == "one_thread":  # the backend's intra-op thread count
        return replace(point, threads=1)
    raise ValueError(change)


DIAGNOSE = ("no_queue_delay", "no_preferred", "max_batch_2", "max_batch_1", "one_thread")
"""Variants measured with --diagnose, each one knob away from the emitted config."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", default="model_repository", help="the emitted repository (default: ./model_repository, from `make export`)")
    parser.add_argument("--model", help="model name (default: the only public model in REPO)")
    parser.add_argument("--report", type=Path, help="the export's report folder (default: found from the repository)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the order alternating; medians are compared")
    parser.add_argument("--diagnose", action="store_true", help=f"also measure the emitted config with one knob changed: {', '.join(DIAGNOSE)}")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.concurrency < 1 or args.rounds < 1:
        print("--concurrency and --rounds must be >= 1", file=sys.stderr)
        return 2
    try:
        export = open_export(Path(args.repo), args.model, args.report)
    except Refused as err:
        print(f"served_throughput: {err}", file=sys.stderr)
        return 2
    name = export.target.name
    if export.target.config.max_batch_size <= 0:
        print(f"{name} does not batch (max_batch_size 0): it already is the naive configuration.", file=sys.stderr)
        return 2

    emitted = export.emitted(name)
    variants = [emitted, naive_variant(export, f"{name}_naive")]
    if args.diagnose:
        point = point_of(export.target.config, export.thread_parameter)
        changed = {change: diagnose_point(point, change) for change in DIAGNOSE}
        same = [change for change, p in changed.items() if p == point]
        if same:
            print(f"not measured: {', '.join(same)} (the emitted config has that setting already)")
        variants += [export.variant(p, f"{name}_{change}") for change, p in changed.items() if change not in same]
    load = Load(args.concurrency, "--concurrency", Objective(args.concurrency))

    def on_row(r: int, v: Variant, row: dict[str, Any]) -> None:
        if row["status"] != "measured":
            print(f"round {r + 1} {v.label:<24} {row['status']}: {row['reason']}", flush=True)
            return
        print(f"round {r + 1} {v.label:<24} {row['throughput']:8.1f} infer/s  p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  "
              f"server batch {row['server_batch'] or 0:.2f}  others' CPU {row['others_cpu']:.0%}", flush=True)

    with tempfile.TemporaryDirectory(prefix="served-throughput-") as tmp:
        try:
            with Lab(export, load, Path(tmp)) as lab:
                results = lab.rounds(variants, args.rounds, 2 * lab.bench.window_ms, on_row)
        except ValidationError as err:
            print(f"served_throughput failed: {err}", file=sys.stderr)
            return 1
    medians = {v.label: statistics.median([r["throughput"] for r in rows if r["status"] == "measured"] or [0.0])
               for v, rows in zip(variants, results)}
    served, plain = medians[emitted.label], medians[f"{name}_naive"]
    if not served or not plain:
        print("served_throughput failed: the emitted or the naive config measured nothing", file=sys.stderr)
        return 1
    ratio = served / plain
    print(f"emitted: {emitted.point.label}")
    for v in variants[2:]:
        print(f"diagnose {v.label:<28} {medians[v.label]:8.1f} infer/s = {medians[v.label] / plain:.2f}x naive ({v.point.label})")
    line = f"served_throughput model={name} emitted={served:.1f} naive={plain:.1f} ratio={ratio:.2f}"
    print(line)
    measured = {v.label: sum(r["status"] == "measured" for r in rows) for v, rows in zip(variants, results)}
    entry = {**{k: v for k, v in line_figures(line).items() if k != "model"}, "concurrency": args.concurrency,
             "emitted_rounds": measured[emitted.label], "naive_rounds": measured[f"{name}_naive"], "emitted_config": emitted.point.label}
    if variants[2:]:
        entry["diagnose"] = {v.label.removeprefix(f"{name}_"): {"throughput": round(medians[v.label], 1), "vs_naive": round(medians[v.label] / plain, 2),
                                                                 "config": v.point.label} for v in variants[2:]}
    write_result("served_throughput", merge_models("served_throughput", {name: entry}, {"settings": {
        "rounds": args.rounds, "order": "alternating (A B, B A, ...)", "ratio": "median emitted / median naive over the measured rounds; no interval",
        "diagnose": args.diagnose}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
