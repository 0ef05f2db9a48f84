"""Model Analyzer's own search (triton-model-analyzer 1.58) run beside a benchmark, on the export's model_analyzer.yaml:
closed-loop at one concurrency (benchmarks/served_grid.py) or its request-rate search under a latency constraint
(benchmarks/rate.py). Its pick becomes a contender measured the same way as ours.

Local launch mode as the YAML is written: Model Analyzer starts the bundled tritonserver 2.51 through the launcher that
gives it LD_LIBRARY_PATH and the python stub's PATH, and perf_analyzer through its launcher; the venv's bin goes first on
PATH too. Results, checkpoints and the output repository go to a fresh folder (an old checkpoint would be reused as if
measured now).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from served_lab import Variant, locally, point_of

from optimizer.triton.config.model_config import parse

THROUGHPUT = "Throughput (infer/sec)"


def concurrency_search(yaml_path: str | None, concurrency: int, max_batch: int, instances: int, work: Path, timeout_s: float) -> dict[str, Any]:
    """Its brute search bounded as served_grid's grid: max batch up to the grid's largest, instances up to the grid's
    most, at the grid's one concurrency. Its best: the row of most throughput."""
    flags = ["--run-config-search-min-concurrency", str(concurrency), "--run-config-search-max-concurrency", str(concurrency),
             "--run-config-search-max-instance-count", str(instances)]
    if max_batch > 0:
        flags += ["--run-config-search-max-model-batch-size", str(max_batch)]
    doc = run(yaml_path, flags, work, timeout_s)
    rows = doc.get("rows") or []
    if rows:
        best = max(rows, key=lambda r: _float(r.get(THROUGHPUT)))
        doc["best"] = {"config": best.get("Model Config Path"), "throughput": _float(best.get(THROUGHPUT)),
                       "p99_ms": _float(best.get("p99 Latency (ms)")), "max_batch_size": best.get("Max Batch Size"),
                       "instances": best.get("Instance Group"), "concurrency": best.get("Concurrency")}
    return doc


def rate_search(yaml_path: str | None, budget_ms: float, percentile: int, max_batch: int, instances: int, work: Path,
                timeout_s: float, min_rate: int = 16, max_rate: int = 4096) -> dict[str, Any]:
    """Its request-rate search (request_rate_search_enable: rates doubling from min_rate to max_rate, Poisson arrivals)
    bounded as rate.py's grid, with the latency budget as its constraint at `percentile`. The export's YAML searches
    concurrency, which Model Analyzer refuses beside a rate search, so a copy without those keys runs. Its pick: the
    config of the row of most throughput among the rows within the constraint, as Model Analyzer ranks them."""
    if not yaml_path or not Path(yaml_path).is_file():
        return run(yaml_path, [], work, timeout_s)
    cfg = yaml.safe_load(Path(yaml_path).read_text())
    for key in ("run_config_search_min_concurrency", "run_config_search_max_concurrency", "concurrency"):
        cfg.pop(key, None)
    field = f"perf_latency_p{percentile}"
    cfg.update(request_rate_search_enable=True, run_config_search_min_request_rate=min_rate, run_config_search_max_request_rate=max_rate,
               run_config_search_max_instance_count=instances, run_config_search_max_model_batch_size=max_batch,
               constraints={field: {"max": budget_ms}},
               inference_output_fields=["model_name", "batch_size", "request_rate", "model_config_path", "instance_group", "max_batch_size",
                                        "satisfies_constraints", "perf_throughput", field, "perf_latency_p99"])
    cfg["perf_analyzer_flags"] = {**(cfg.get("perf_analyzer_flags") or {}), "request-distribution": "poisson"}
    work.mkdir(parents=True, exist_ok=True)
    rate_yaml = work / "model_analyzer_rate.yaml"
    rate_yaml.write_text(yaml.safe_dump(cfg, sort_keys=False))
    doc = run(str(rate_yaml), [], work, timeout_s)
    within = [r for r in doc.get("rows") or [] if str(r.get("Satisfies Constraints", "")).strip().lower() == "yes"]
    if doc.get("rows") and not within:
        doc.update(status="failed", reason=f"no row within {field} <= {budget_ms:g} ms")
    elif within:
        best = max(within, key=lambda r: _float(r.get(THROUGHPUT)))
        doc["best"] = {"config": best.get("Model Config Path"), "throughput": _float(best.get(THROUGHPUT)),
                       f"p{percentile}_ms": _float(best.get(f"p{percentile} Latency (ms)")), "max_batch_size": best.get("Max Batch Size"),
                       "instances": best.get("Instance Group"), "request_rate": best.get("Request Rate")}
    return doc


def run(yaml_path: str | None, flags: list[str], work: Path, timeout_s: float) -> dict[str, Any]:
    """`model-analyzer profile -f YAML FLAGS` into work/model_analyzer: what ran, its measured rows and the seconds it took
    (status "skipped" with the reason where it is not installed or the export wrote no YAML)."""
    binary = Path(sys.executable).parent / "model-analyzer"
    if not binary.is_file():
        return {"status": "skipped", "reason": f"{binary} is missing: pip install 'aitune-export[model-analyzer]'"}
    if not yaml_path or not Path(yaml_path).is_file():
        return {"status": "skipped", "reason": f"the export wrote no model_analyzer.yaml ({yaml_path}); re-run the export"}
    out = work / "model_analyzer"
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)  # Model Analyzer refuses a checkpoint folder whose parent is missing
    command = [str(binary), "profile", "-f", yaml_path, "--export-path", str(out), "--checkpoint-directory", str(out / "checkpoints"),
               "--output-model-repository-path", str(out / "output_model_repository"), "--override-output-model-repository", *flags]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}  # the launchers bring their own
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    t0 = time.monotonic()
    proc = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # Model Analyzer checkpoints and stops its server on Ctrl-C
        try:
            text, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
        text = f"{text}\n(stopped after {timeout_s:.0f} s: --ma-timeout)"
    seconds = round(time.monotonic() - t0, 1)
    (work / "model_analyzer.log").write_text(text)
    doc: dict[str, Any] = {"status": "ran", "returncode": proc.returncode, "seconds": seconds, "command": command,
                           "export_path": str(out), "output_tail": text[-3000:]}
    results = out / "results" / "metrics-model-inference.csv"
    if not results.is_file():
        doc.update(status="failed", reason=_ma_error(text) or f"exit status {proc.returncode} and no {results.name}")
        return doc
    with open(results, newline="") as f:
        doc["rows"] = [r for r in csv.DictReader(f) if _float(r.get(THROUGHPUT)) > 0]
    if not doc["rows"]:
        doc.update(status="failed", reason=f"{results.name} has no measured row")
    return doc


def ma_variant(ma: dict[str, Any], thread_parameter: str | None) -> Variant | None:
    """Model Analyzer's pick as a contender (its output repository's config.pbtxt), if it found one."""
    best = ma.get("best")
    path = Path(ma.get("export_path", "")) / "output_model_repository" / str(best.get("config")) / "config.pbtxt" if best else None
    if path is None or not path.is_file():
        return None
    text = path.read_text()
    return Variant("model analyzer", point_of(parse(text), thread_parameter), locally(text))


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _ma_error(text: str) -> str:
    """Model Analyzer's own error line, if it printed one (an exception's message or an ERROR log line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    picked = [line for line in lines if "Exception" in line or "ERROR" in line or "Error:" in line]
    return (picked or lines[-1:] or [""])[-1][:400]
