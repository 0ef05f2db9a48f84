"""Reduced precision on the CPU: the chosen candidate against the best fp32 one, in-process and served.

Per model, one `aitune-export export` (a fresh process, `--precision auto`, the served search at --concurrency) builds
and measures every fp32 and reduced-precision candidate side by side; the in-process ratio is the chosen candidate's best
throughput over the best fp32 candidate's, from that one run. A second export with `--precision fp32` at the same load
publishes the fp32 side, so each side is served in the config the tool publishes for it (--int8: one export with
generated samples and the served search off, so INT8 candidates are built too, and the best INT8 one is republished
beside the best fp32 one in the rules' configs). Both are loaded into one local tritonserver (stand-in backends: pip
openvino / torch / onnxruntime in Triton's python backend) and perf_analyzer measures them at that concurrency on the
profiled sample, in alternating rounds (A B B A ...); the served ratio is the ratio of the medians. Timings on a shared
machine move: run it when it is quiet.

    .venv/bin/python benchmarks/precision.py [--models cnn,transformer,resnet,encoder] [--int8] [--concurrency 8] [--rounds 4]

One line per model, the last lines machine-readable:
    precision model=NAME chosen=BACKEND/PRECISION served_ratio=X in_process_ratio=Y cosine=Z
and benchmarks/results/precision.json (results.py): those figures per model ("NAME --int8" with --int8), with the settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # results: the benchmarks' records

from optimizer.model.reference import resolve_signature  # noqa: E402
from optimizer.model.samples import ShapePoint, generate_feed, load_feeds, save_feeds  # noqa: E402
from optimizer.model.signature import parse_value_range  # noqa: E402
from optimizer.model.source import load_model  # noqa: E402
from optimizer.records.tune_result import TuneResult  # noqa: E402
from optimizer.triton.runtime.local_serving import local_config, needs_translation, private_model  # noqa: E402
from optimizer.triton.config.model_config import canonical, parse  # noqa: E402
from optimizer.triton.runtime.perf_analyzer import (  # noqa: E402
    ConcurrencyRange,
    PerfAnalyzerFailed,
    PerfSettings,
    run_perf_analyzer,
)
from optimizer.triton.runtime.perf_analyzer_input import write_input_data  # noqa: E402
from optimizer.triton.repository.publish import PublishOptions, publish  # noqa: E402
from optimizer.triton.runtime.server import LocalTritonServer  # noqa: E402
from optimizer.triton.measure.validation.checks import reference_feeds  # noqa: E402
from optimizer.triton.measure.validation.expectation import load_export_reference  # noqa: E402
from results import line_figures, merge_models, write_result  # noqa: E402

MODELS = {
    "cnn": ("optimizer.examples.cnn:build", []),
    "transformer": ("optimizer.examples.transformer:build", ["--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999"]),
    "resnet": (str(ROOT / "benchmarks" / "precision_models.py") + ":resnet", []),
    "encoder": (str(ROOT / "benchmarks" / "precision_models.py") + ":encoder", ["--value-range", "input_ids:0:7999"]),
}
"""The bundled examples, an image model and a text encoder (random weights, seeded). The transformer is exported as its
module says (a dynamic sequence of 1-128 tokens), so it is measured at 128 tokens; without --input its 16-token example
fixes the shape, and at that size the server's per-request cost hides the model's."""


def precision_of(cand: dict) -> str:
    return (cand.get("artifact") or {}).get("metadata", {}).get("precision", "fp32")


def samples_for(spec: str, extra: list[str], path: Path) -> Path:
    """Four generated batches of 4 at the max of every axis (the --int8 run's "real" samples)."""
    model = load_model(spec)
    ranges = dict(parse_value_range(extra[i + 1]) for i, a in enumerate(extra) if a == "--value-range")
    sig = resolve_signature(model, [], ranges, [], True)
    save_feeds(path, [generate_feed(sig, ShapePoint(4, "max"), seed=40 + k) for k in range(4)])
    return path


def export(spec: str, extra: list[str], root: Path, int8: bool, concurrency: int, precision: str = "auto", name: str = "reduced") -> dict:
    """One export into root/repo/NAME. Without --int8 the served search runs for the benchmark's load, so each side is
    served in the config the tool publishes for it: the rules' config alone can put an OpenVINO winner at its in-process
    peak, a large max_batch_size that the openvino backend pads every execution to. --int8 republishes the best INT8
    candidate from the result, so its exports keep the rules' configs."""
    report = root / ("report" if name == "reduced" else f"report-{name}")
    search = ["--serve-search", "off"] if int8 else ["--concurrency", str(concurrency)]
    cmd = [sys.executable, "-m", "optimizer.cli", "-q", "export", spec, *extra, "--repository", str(root / "repo"),
           "--report-dir", str(report), "--cache-dir", str(root / "cache"), *search, "--name", name, "--precision", precision]
    if int8:  # auto with real samples: fp32, bf16 where native and INT8 candidates side by side
        cmd += ["--samples", str(samples_for(spec, extra, root / "samples.npz"))]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return json.loads((report / "report.json").read_text())


def served(root: Path, names: list[str], concurrency: int, rounds: int) -> dict[str, list[float]]:
    """perf_analyzer throughput of each model, alternating A B B A ... at one concurrency. A platform the local 2.51
    core does not know (torch_aoti) is served from a translated private copy, as `aitune-export validate` does."""
    reference = load_export_reference(root / "report" / "report.json")
    out: dict[str, list[float]] = {n: [] for n in names}
    repo = root / "served"
    for folder in sorted((root / "repo").iterdir()):  # each model, and a torch-aoti winner's positional model behind its ensemble
        if folder.name in names or folder.name.split("__")[0] in names:
            config = parse((folder / "config.pbtxt").read_text())
            private_model(folder, repo, folder.name, canonical(local_config(config) if needs_translation(config) else config))
    with LocalTritonServer(repo, log_path=root / "tritonserver.log") as server:
        data = {}
        for n in names:
            server.load(n)
            # the sample in-process profiling timed (every dynamic axis at its maximum), as the served search sends it: the
            # correctness samples mix 1-token and 128-token rows, which a server cannot batch together
            feeds = load_feeds(reference.profile_feed) if reference.profile_feed else reference_feeds(reference, server.client("http").get_model_config(n))[0]
            rows = [{k: v[i:i + 1] for k, v in f.items()} for f in feeds for i in range(next(iter(f.values())).shape[0])]
            data[n] = write_input_data(root / f"input-{n}.json", rows, batching=True)
        settings = PerfSettings(concurrency=ConcurrencyRange(concurrency, concurrency), protocol="grpc",
                                measurement_interval_ms=3000, stability_percentage=100)
        for r in range(rounds):
            pair = {}
            for n in (names if r % 2 == 0 else list(reversed(names))):
                try:
                    row = run_perf_analyzer(n, server.grpc_url, data[n], root / "perf" / f"{n}-{r}", settings).rows[0]
                except PerfAnalyzerFailed as err:  # a window that never settled on a busy machine: this round is dropped
                    print(f"  round {r + 1} {n:<8} not settled ({str(err)[:80]}); round dropped", flush=True)
                    break
                pair[n] = row.throughput
                print(f"  round {r + 1} {n:<8} {row.throughput:8.1f} infer/s  p95 {row.p95_ms:7.1f} ms", flush=True)
            if len(pair) == len(names):  # only rounds where both were measured count (ABBA pairs)
                for n, value in pair.items():
                    out[n].append(value)
    return out


def one(name: str, int8: bool, concurrency: int, rounds: int, info: dict | None = None) -> str:
    """The model's line; `info` gets what the line does not say (the candidates compared, the rounds served)."""
    info = {} if info is None else info
    spec, extra = MODELS[name]
    with tempfile.TemporaryDirectory(prefix=f"precision-{name}-") as tmp:
        root = Path(tmp)
        doc = export(spec, extra, root, int8, concurrency)
        result = TuneResult.from_json(doc["result"])
        cands = {c["name"]: c for c in doc["result"]["candidates"]}
        passed = [c for c in cands.values() if c["status"] == "passed"]
        if int8:  # the best INT8 candidate, whichever precision the export selected
            best_int8 = max((c for c in passed if precision_of(c) == "int8"), key=lambda c: c["decision"]["profiles"] and
                            max(p["throughput"] for p in c["decision"]["profiles"]), default=None)
            if best_int8 is None:
                return f"precision model={name} chosen=none/int8 served_ratio=nan in_process_ratio=nan cosine=nan (no INT8 candidate passed)"
            if best_int8["name"] != result.selected:
                (root / "repo" / "reduced").rename(root / "selected")
                publish(replace(result, selected=best_int8["name"], max_batch_size=best_int8["decision"]["max_batch_size"]),
                        PublishOptions(root / "repo", "reduced"))
            result = replace(result, selected=best_int8["name"], max_batch_size=best_int8["decision"]["max_batch_size"])
        chosen = cands[result.selected]
        fp32 = max((c for c in cands.values() if c["status"] == "passed" and precision_of(c) == "fp32"),
                   key=lambda c: max((p["throughput"] for p in c["decision"]["profiles"]), default=0.0), default=None)
        best = {n: max((p["throughput"] for p in (c["decision"] or {}).get("profiles", [])), default=0.0) for n, c in cands.items()}
        for n, c in cands.items():
            acc = ((c.get("correctness") or {}).get("accuracy") or {})
            cos = min((o["cosine"] for o in acc.get("outputs", [])), default=None)
            print(f"  {n:<26} {c['status']:<7} {best[n]:9.1f}/s" + (f"  cosine {cos:.6f}" if cos is not None else "")
                  + (f"  {c['reason'][:110]}" if c["reason"] else ""), flush=True)
        acc = (chosen.get("correctness") or {}).get("accuracy") or {}
        cosine = min((o["cosine"] for o in acc.get("outputs", [])), default=1.0)
        label = f"{chosen['backend']}/{precision_of(chosen)}"
        info.update(chosen_candidate=chosen["name"], fp32_candidate=fp32["name"] if fp32 else "none")
        if fp32 is None:
            return f"precision model={name} chosen={label} served_ratio=nan in_process_ratio=nan cosine={cosine:.6f} (no fp32 candidate passed)"
        in_process = best[chosen["name"]] / best[fp32["name"]]
        if fp32["name"] == chosen["name"]:
            return f"precision model={name} chosen={label} served_ratio=1.00 in_process_ratio=1.00 cosine={cosine:.6f}"
        if int8:
            publish(replace(result, selected=fp32["name"], max_batch_size=fp32["decision"]["max_batch_size"]),
                    PublishOptions(root / "repo", "fp32"))
        else:  # the fp32 side as the tool publishes it for this load: its own export, served search included
            served_fp32 = export(spec, extra, root, False, concurrency, precision="fp32", name="fp32")["result"]["selected"]
            print(f"  fp32 export chose {served_fp32} (in-process best fp32 above: {fp32['name']})", flush=True)
            info["fp32_served"] = served_fp32
        mbs = {n: parse((root / "repo" / n / "config.pbtxt").read_text()).max_batch_size for n in ("reduced", "fp32")}
        print(f"  served: reduced = {chosen['name']} (max batch {mbs['reduced']}), fp32 (max batch {mbs['fp32']}), "
              f"concurrency {concurrency}", flush=True)
        tput = served(root, ["fp32", "reduced"], concurrency, rounds)
        ratio = statistics.median(tput["reduced"]) / statistics.median(tput["fp32"]) if tput["fp32"] else float("nan")
        print(f"  served over {len(tput['fp32'])} of {rounds} rounds", flush=True)
        info["served_rounds"] = len(tput["fp32"])
        return f"precision model={name} chosen={label} served_ratio={ratio:.2f} in_process_ratio={in_process:.2f} cosine={cosine:.6f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--int8", action="store_true", help="give generated samples (auto then adds INT8) and compare the best INT8 candidate with fp32")
    parser.add_argument("--concurrency", type=int, default=8, help="perf_analyzer's concurrency for both models")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds (A B B A ...); medians are compared")
    args = parser.parse_args()
    lines, figures = [], {}
    for name in args.models.split(","):
        print(f"{name}:", flush=True)
        info: dict = {}
        lines.append(one(name, args.int8, args.concurrency, args.rounds, info))
        print(lines[-1], flush=True)
        figures[f"{name} --int8" if args.int8 else name] = {**{k: v for k, v in line_figures(lines[-1]).items() if k != "model"}, **info}
    print("\n".join(lines))
    write_result("precision", merge_models("precision", figures, {"settings": {
        "rounds": args.rounds, "concurrency": args.concurrency, "int8": args.int8,
        "served_ratio": "median reduced / median fp32 over the rounds both were measured in (A B B A ...); no interval",
        "in_process_ratio": "the chosen candidate's best throughput over the best fp32 candidate's, one export"}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
