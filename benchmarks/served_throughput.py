"""Served throughput: the emitted config against a naive one, side by side in one real tritonserver.

The naive model serves the same artifact with `max_batch_size: 0` and no dynamic batching (what a
hand-written config often looks like); the emitted one is what aitune-export published. Both are
loaded into one local tritonserver and measured with perf_analyzer at the same concurrency, in
alternating rounds (A B B A ...) so that machine noise hits both alike; the medians are compared.

    .venv/bin/python benchmarks/served_throughput.py [REPO] [--model NAME] [--concurrency 8] [--rounds 2]

The last line is machine-readable:
    served_throughput model=<name> emitted=<inf/s> naive=<inf/s> ratio=<emitted/naive>
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.model.samples import Feed  # noqa: E402
from optimizer.triton.model_config import canonical  # noqa: E402
from optimizer.triton.perf_analyzer import ConcurrencyRange, PerfRow, PerfSettings, run_perf_analyzer, write_input_data  # noqa: E402
from optimizer.triton.repository import copy_model_tree as copy_tree  # noqa: E402
from optimizer.triton.server import LocalTritonServer  # noqa: E402
from optimizer.triton.validation import ModelTarget, find_export_report, load_export_reference, resolve_target  # noqa: E402
from optimizer.triton.validation.checks import reference_feeds  # noqa: E402


def naive_config(target: ModelTarget, name: str) -> str:
    """The same model without batching: max_batch_size 0, no dynamic_batching, the batch axis as an explicit -1 dim."""
    config = type(target.config)()
    config.CopyFrom(target.config)
    config.name = name
    config.ClearField("dynamic_batching")
    if config.max_batch_size > 0:
        for tensor in [*config.input, *config.output]:
            dims = [-1, *tensor.dims]
            del tensor.dims[:]
            tensor.dims.extend(dims)
            if tensor.HasField("reshape"):
                shape = [-1, *tensor.reshape.shape]
                del tensor.reshape.shape[:]
                tensor.reshape.shape.extend(shape)
    config.max_batch_size = 0
    return canonical(config)


def variant_config(target: ModelTarget, name: str, change: str) -> str:
    """The emitted config with one knob changed (--diagnose): which knob makes it slower or faster than naive?"""
    config = type(target.config)()
    config.CopyFrom(target.config)
    config.name = name
    if change == "no_queue_delay":
        config.dynamic_batching.max_queue_delay_microseconds = 0
    elif change == "no_preferred":
        del config.dynamic_batching.preferred_batch_size[:]
    elif change.startswith("max_batch_"):
        cap = int(change.rsplit("_", 1)[1])
        config.max_batch_size = min(cap, config.max_batch_size)
        kept = [b for b in config.dynamic_batching.preferred_batch_size if b <= cap]
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(kept)
    elif change == "one_thread":  # the backend's intra-op thread count (onnxruntime and libtorch spell it differently)
        for key in ("intra_op_thread_count", "INTRA_OP_THREAD_COUNT"):
            if key in config.parameters:
                config.parameters[key].string_value = "1"
    else:
        raise ValueError(change)
    return canonical(config)


DIAGNOSE = ("no_queue_delay", "no_preferred", "max_batch_2", "max_batch_1", "one_thread")
"""Variants measured with --diagnose, each one knob away from the emitted config."""


def batch_one_rows(feeds: list[Feed]) -> list[Feed]:
    """Every sample as its own batch-1 request (the batch axis kept: the naive model takes it as an ordinary dim)."""
    rows = []
    for feed in feeds:
        for i in range(next(iter(feed.values())).shape[0]):
            rows.append({k: v[i:i + 1] for k, v in feed.items()})
    return rows


def measure(name: str, url: str, data: Path, work: Path, concurrency: int, protocol: str) -> PerfRow:
    settings = PerfSettings(concurrency=ConcurrencyRange(concurrency, concurrency), protocol=protocol)
    result = run_perf_analyzer(name, url, data, work / name, settings)
    return result.rows[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", default="model_repository", help="the emitted repository (default: ./model_repository, from `make export`)")
    parser.add_argument("--model", help="model name (default: the only model in REPO)")
    parser.add_argument("--report", type=Path, help="the export's report folder (default: found from the repository)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds; medians are compared")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="grpc")
    parser.add_argument("--diagnose", action="store_true", help=f"also measure the emitted config with one knob changed: {', '.join(DIAGNOSE)}")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    target = resolve_target(Path(args.repo), args.model)
    if target.config.max_batch_size <= 0:
        print(f"{target.name} does not batch (max_batch_size 0): it already is the naive configuration.", file=sys.stderr)
        return 2
    report = find_export_report(target, args.report)
    reference = load_export_reference(report) if report else None
    with tempfile.TemporaryDirectory(prefix="served-throughput-") as tmp:
        tmp_path = Path(tmp)
        repo = tmp_path / "repo"
        naive = f"{target.name}_naive"
        copy_tree(target.repository / target.name, repo / target.name)
        copy_tree(target.repository / target.name, repo / naive)
        (repo / naive / "config.pbtxt").unlink()
        (repo / naive / "config.pbtxt").write_text(naive_config(target, naive))
        variants = [f"{target.name}_{change}" for change in DIAGNOSE] if args.diagnose else []
        for change, variant in zip(DIAGNOSE, variants):
            copy_tree(target.repository / target.name, repo / variant)
            (repo / variant / "config.pbtxt").unlink()
            (repo / variant / "config.pbtxt").write_text(variant_config(target, variant, change))
        with LocalTritonServer(repo, log_path=tmp_path / "tritonserver.log") as server:
            for name in (target.name, naive, *variants):
                server.load(name)
            served = server.client("http").get_model_config(target.name)
            feeds, _, _ = reference_feeds(reference, served)
            rows = batch_one_rows(feeds)
            emitted_data = write_input_data(tmp_path / "emitted.json", rows, batching=True)
            data = {target.name: emitted_data, naive: write_input_data(tmp_path / "naive.json", rows, batching=False),
                    **{v: emitted_data for v in variants}}
            url = server.grpc_url if args.protocol == "grpc" else server.http_url
            order = [target.name, naive, *variants]
            results: dict[str, list[PerfRow]] = {name: [] for name in order}
            for r in range(args.rounds):
                for name in order if r % 2 == 0 else reversed(order):
                    row = measure(name, url, data[name], tmp_path, args.concurrency, args.protocol)
                    results[name].append(row)
                    print(f"round {r + 1} {name:<24} {row.throughput:8.1f} infer/s  p50 {row.p50_ms:7.1f} ms  p95 {row.p95_ms:7.1f} ms  "
                          f"queue {row.server_queue_ms or 0:6.1f} ms  compute {row.server_compute_ms or 0:6.1f} ms  "
                          f"server batch {row.server_batch or 0:.2f}", flush=True)
    emitted = statistics.median(r.throughput for r in results[target.name])
    plain = statistics.median(r.throughput for r in results[naive])
    ratio = emitted / plain if plain else float("nan")
    dyn = target.config.dynamic_batching
    print(f"emitted: max_batch_size {target.config.max_batch_size}, preferred {list(dyn.preferred_batch_size)}, "
          f"queue delay {dyn.max_queue_delay_microseconds} us, instances {sum(g.count for g in target.config.instance_group) or 'default'}")
    for variant in variants:
        value = statistics.median(r.throughput for r in results[variant])
        print(f"diagnose {variant:<28} {value:8.1f} infer/s = {value / plain if plain else float('nan'):.2f}x naive")
    if ratio < 1.0:
        e, n = results[target.name][-1], results[naive][-1]
        print(f"emitted is slower: per request it waits {e.server_queue_ms or 0:.1f} ms in the queue (naive {n.server_queue_ms or 0:.1f}) "
              f"and computes {e.server_compute_ms or 0:.1f} ms for a batch of {e.server_batch or 0:.2f} "
              f"(naive {n.server_compute_ms or 0:.1f} ms for 1)")
    print(f"served_throughput model={target.name} emitted={emitted:.1f} naive={plain:.1f} ratio={ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
