"""A Triton Model Analyzer config (YAML, remote mode) for users who want its search on top of ours.

Written next to the report, never inside the served repository. Remote mode profiles a tritonserver
the user starts on the published repository with --model-control-mode=explicit (reference
triton_runtime.md §4 shows such a run); the search bounds come from what the export measured.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.machine import cpu_cores
from optimizer.triton.model_config import config_signature

if TYPE_CHECKING:
    from optimizer.records.tune_result import TuneResult
    from optimizer.triton.model_config import ConfigSpec
    from optimizer.triton.repository import Published

FILENAME = "model_analyzer.yaml"
DEFAULT_ENDPOINTS = {"http": "localhost:8000", "grpc": "localhost:8001", "metrics": "http://localhost:8002/metrics"}


def analyzer_config(published: Published, result: TuneResult, spec: ConfigSpec, out_dir: Path) -> dict[str, Any]:
    """The Model Analyzer settings as a mapping (key order is the order written)."""
    mbs = spec.max_batch_size
    cpu = spec.instance_group["kind"] == "KIND_CPU"
    max_instances = max(1, min(4, cpu_cores())) if cpu else 4
    work = (out_dir / "model_analyzer").resolve()
    cfg: dict[str, Any] = {
        "model_repository": str(published.model_dir.parent.resolve()),
        "triton_launch_mode": "remote",
        "triton_http_endpoint": DEFAULT_ENDPOINTS["http"],
        "triton_grpc_endpoint": DEFAULT_ENDPOINTS["grpc"],
        "triton_metrics_url": DEFAULT_ENDPOINTS["metrics"],
        "client_protocol": "grpc",
        "export_path": str(work),
        "checkpoint_directory": str(work / "checkpoints"),
        "output_model_repository_path": str(work / "output_model_repository"),
        "override_output_model_repository": True,
        "run_config_search_mode": "brute",
        "run_config_search_max_instance_count": max_instances,
        "run_config_search_max_concurrency": _pow2_at_least(2 * max(mbs, 1) * max_instances),
    }
    if mbs > 0:
        cfg["run_config_search_min_model_batch_size"] = 1
        cfg["run_config_search_max_model_batch_size"] = _pow2_at_least(mbs)
    cfg["objectives"] = ["perf_latency_p99"] if result.strategy == "min-latency" else ["perf_throughput"]
    if result.latency_budget_ms is not None:
        cfg["constraints"] = {"perf_latency_p99": {"max": result.latency_budget_ms}}
    shapes = _shapes(spec, result)
    if shapes:
        cfg["perf_analyzer_flags"] = {"shape": shapes}
    cfg["profile_models"] = {spec.name: {"cpu_only": True} if cpu else {}}
    return cfg


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _shapes(spec: ConfigSpec, result: TuneResult) -> list[str]:
    """perf_analyzer --shape for inputs with -1 dims, at the largest size of each dynamic axis (as measured)."""
    artifact = result.selected_candidate.artifact
    sig = config_signature(artifact)[0] if artifact is not None else None  # the config's tensor names
    out = []
    for entry in spec.inputs:
        if -1 not in entry.dims or sig is None:
            continue
        dims = sig.input(entry.name).shape(None, "max")
        out.append(f"{entry.name}:{','.join(str(d) for d in dims)}")
    return out


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML for nested dicts/lists of scalars; strings are JSON-quoted, which YAML reads as plain strings."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines.append(to_yaml(v, indent + 1))
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}-")
                lines.append(to_yaml(v, indent + 1))
            else:
                lines.append(f"{pad}- {_scalar(v)}")
    return "\n".join(lines)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def write_model_analyzer_config(out_dir: Path, published: Published, result: TuneResult, spec: ConfigSpec) -> Path:
    """Write out_dir/model_analyzer.yaml atomically; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILENAME
    cfg = analyzer_config(published, result, spec, out_dir)
    header = (
        f"# Triton Model Analyzer config for model {spec.name!r}, written by aitune-export (remote mode).\n"
        f"# 1. tritonserver --model-repository={cfg['model_repository']} --model-control-mode=explicit --load-model={spec.name}\n"
        f"# 2. model-analyzer profile -f {path.resolve()}\n"
        f"# The export measured max_batch_size {spec.max_batch_size} ({result.selected_candidate.decision.explanation if result.selected_candidate.decision else 'no measurement'});"
        " Model Analyzer searches batch size and instance count around it.\n"
    )
    if result.latency_budget_ms is not None and result.percentile != 99:
        header += f"# Model Analyzer constrains p99 latency; the export's budget applied to p{result.percentile}.\n"
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(header + to_yaml(cfg) + "\n")
    os.replace(tmp, path)
    return path
