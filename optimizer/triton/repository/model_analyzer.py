"""A Triton Model Analyzer config (YAML) for users who want its search on top of ours.

Written next to the report, never inside the served repository, with everything it names made
beside it (model_analyzer/: results, checkpoints, logs, two launcher scripts and the base
repository Model Analyzer varies), so `model-analyzer profile -f model_analyzer.yaml` runs as
written (triton-model-analyzer 1.58: `pip install 'aitune-export[model-analyzer]'`).

Local launch mode: Model Analyzer starts the same tritonserver 2.51 `aitune-export validate`
uses (the prepared server home: its binary, backends and stand-ins) on loopback ports chosen when
the file is written. Model Analyzer starts its first server without `triton_server_environment`,
and the wheel's binary needs LD_LIBRARY_PATH (and the python stub this interpreter's PATH), so
`triton_server_path` is a launcher script (model_analyzer/bin/tritonserver) that sets them and
execs the binary; `perf_analyzer_path` is one for perf_analyzer 2.51, which links the CUDA runtime
even on CPU. Why not remote mode against a server the user starts: that server would need the
same home, environment and flags by hand, plus metrics, which the local server keeps off; another
server is the same file with `--triton-launch-mode remote` and its endpoints on the command line
(flags override the YAML). Without nvidia-pytriton the file is written in remote mode.

The search: Model Analyzer's brute search varies max_batch_size (powers of two) and instance
count of a *base* config and keeps the rest of it. The published config pins
`dynamic_batching.preferred_batch_size` (Model Analyzer calls every max_batch_size below their
largest "illegal" and stops walking) and `model_warmup` batch sizes up to the published max batch
(a smaller max_batch_size fails to load); the base config is the published one without both, in
model_analyzer/repository/<name>/ (its version folders are links to the published ones).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.machine import cpu_cores
from optimizer.triton.config.spec import config_signature

if TYPE_CHECKING:
    from optimizer.records.tune_result import TuneResult
    from optimizer.triton.config.spec import ConfigSpec
    from optimizer.triton.repository.atomic import Published

log = logging.getLogger(__name__)

FILENAME = "model_analyzer.yaml"
WORK_DIR = "model_analyzer"
PERF_ANALYZER_INPUT = "perf_analyzer_input.json"
"""publish.py writes perf_analyzer's --input-data under this name beside the report (after this file)."""
DEFAULT_ENDPOINTS = {"http": "localhost:8000", "grpc": "localhost:8001", "metrics": "http://localhost:8002/metrics"}
"""Remote mode (no local server here): Triton's default ports."""
MAX_INSTANCES = 4


def analyzer_config(published: Published, result: TuneResult, spec: ConfigSpec, out_dir: Path,
                    local: dict[str, Any] | None = None, perf_analyzer: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Model Analyzer settings as a mapping (key order is the order written).

    `local`: the local server (`local_server()`); None writes remote mode against Triton's default ports.
    `perf_analyzer`: the local perf_analyzer (`local_perf_analyzer()`); None leaves Model Analyzer's default (PATH).
    """
    mbs = spec.max_batch_size
    cpu = spec.instance_group["kind"] == "KIND_CPU"
    published_count = int(spec.instance_group.get("count", 1) or 1)
    max_instances = max(published_count, min(MAX_INSTANCES, cpu_cores()) if cpu else MAX_INSTANCES, 1)
    work = (out_dir / WORK_DIR).resolve()
    cfg: dict[str, Any] = {
        "model_repository": str(work / "repository"),
        "triton_launch_mode": "local" if local else "remote",
    }
    if local:
        cfg.update({
            "triton_http_endpoint": local["http"],
            "triton_grpc_endpoint": local["grpc"],
            "triton_metrics_url": local["metrics"],
            "triton_server_path": str(work / "bin" / "tritonserver"),
            "triton_server_flags": local["flags"],
            "triton_output_path": str(work / "tritonserver.log"),
        })
    else:
        cfg.update({
            "triton_http_endpoint": DEFAULT_ENDPOINTS["http"],
            "triton_grpc_endpoint": DEFAULT_ENDPOINTS["grpc"],
            "triton_metrics_url": DEFAULT_ENDPOINTS["metrics"],
        })
    if perf_analyzer:
        cfg["perf_analyzer_path"] = str(work / "bin" / "perf_analyzer")
    cfg.update({
        "client_protocol": "grpc",
        "export_path": str(work),
        "checkpoint_directory": str(work / "checkpoints"),
        "output_model_repository_path": str(work / "output_model_repository"),
        "override_output_model_repository": True,
        "perf_output": True,
        "perf_output_path": str(work / "perf_analyzer.log"),
        "run_config_search_mode": "brute",
        "run_config_search_min_instance_count": 1,
        "run_config_search_max_instance_count": max_instances,
    })
    if mbs > 0:
        cfg["run_config_search_min_model_batch_size"] = 1
        cfg["run_config_search_max_model_batch_size"] = _pow2_at_least(mbs)
    cfg["run_config_search_min_concurrency"] = 1
    cfg["run_config_search_max_concurrency"] = _pow2_at_least(2 * max(mbs, 1) * max_instances)
    cfg["objectives"] = ["perf_latency_p99"] if result.strategy == "min-latency" else ["perf_throughput"]
    if result.latency_budget_ms is not None:
        cfg["constraints"] = {"perf_latency_p99": {"max": result.latency_budget_ms}}
    flags: dict[str, Any] = perf_analyzer_windows()
    if _writes_input_data(result):
        flags["input-data"] = str((out_dir / PERF_ANALYZER_INPUT).resolve())  # explicit shapes: no --shape needed
    else:
        shapes = _shapes(spec, result)
        if shapes:
            flags["shape"] = shapes
    if flags:
        cfg["perf_analyzer_flags"] = flags
    cfg["profile_models"] = {spec.name: {"cpu_only": True} if cpu else {}}
    return cfg


def perf_analyzer_windows() -> dict[str, Any]:
    """perf_analyzer measures as `aitune-export validate` does (PerfSettings: time windows, a tolerance that settles on
    a shared machine) instead of Model Analyzer's request-count windows, which it keeps enlarging on a busy CPU."""
    from optimizer.triton.runtime.perf_analyzer import PerfSettings

    settings = PerfSettings()
    return {"measurement-mode": "time_windows", "measurement-interval": settings.measurement_interval_ms,
            "stability-percentage": settings.stability_percentage, "max-trials": settings.max_trials}


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _writes_input_data(result: TuneResult) -> bool:
    """Whether publish writes perf_analyzer_input.json beside the report (it does when the profiled request mix exists)."""
    return Path(result.reference.profile_feed).is_file()


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


def local_perf_analyzer() -> dict[str, Any] | None:
    """perf_analyzer 2.51 from this environment and the CUDA runtime folder it links (None: not installed)."""
    from optimizer.triton.runtime.perf_analyzer import cuda_runtime_lib_dir, find_perf_analyzer
    from optimizer.triton.runtime.install import ToolMissing

    try:
        binary = find_perf_analyzer()
    except ToolMissing:
        return None
    lib = cuda_runtime_lib_dir()
    return {"binary": str(binary), "libraries": [str(lib)] if lib is not None else [], "path": []}


def local_server(cache_dir: Path | None = None) -> dict[str, Any] | None:
    """What Model Analyzer needs to start the local tritonserver itself: the prepared home's binary, the libraries and
    PATH it needs (server_environment), the flags LocalTritonServer passes (backends, caches, a python-backend
    shared-memory prefix of its own, loopback addresses) and free loopback ports. None (reason logged) when no local
    tritonserver is installed."""
    from optimizer.triton.runtime.install import ToolMissing, find_triton, homes_root, prepare_home, server_environment
    from optimizer.triton.runtime.server import SHM_PREFIX, free_port

    try:
        install = find_triton()
        home = prepare_home(install, homes_root(cache_dir))  # under the run's one cache root (--cache-dir)
    except (ToolMissing, OSError) as err:
        log.info("Model Analyzer config in remote mode: no local tritonserver (%s)", err)
        return None
    ports: list[int] = []
    while len(ports) < 3:
        port = free_port()
        if port not in ports:
            ports.append(port)
    ours = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    libraries = [p for p in server_environment(install)["LD_LIBRARY_PATH"].split(os.pathsep) if p and p not in ours]
    flags = {
        "backend-directory": str(home.backends),
        "cache-directory": str(home.caches),
        "backend-config": f"python,shm-region-prefix-name={SHM_PREFIX}aitune_ma{secrets.token_hex(4)}_",
        "http-address": "127.0.0.1",
        "grpc-address": "127.0.0.1",
        "metrics-address": "127.0.0.1",
        "exit-timeout-secs": 10,
    }
    return {"http": f"127.0.0.1:{ports[0]}", "grpc": f"127.0.0.1:{ports[1]}", "metrics": f"http://127.0.0.1:{ports[2]}/metrics",
            "binary": str(home.binary), "libraries": libraries, "path": [str(Path(sys.executable).parent)], "flags": flags}


def write_launcher(path: Path, tool: dict[str, Any], what: str) -> Path:
    """A /bin/sh script that puts the tool's libraries on LD_LIBRARY_PATH (and folders on PATH) and execs it, so the
    process Model Analyzer starts and signals is the tool itself."""
    lines = ["#!/bin/sh", f"# {what}, with the environment it needs; written by aitune-export for model_analyzer.yaml."]
    if tool["libraries"]:
        libs = shlex.quote(os.pathsep.join(tool["libraries"]))
        lines.append(f'LD_LIBRARY_PATH={libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}; export LD_LIBRARY_PATH')
    if tool["path"]:
        lines.append(f'PATH={shlex.quote(os.pathsep.join(tool["path"]))}:"$PATH"; export PATH')
    lines += ["unset PYTHONPATH", f'exec {shlex.quote(tool["binary"])} "$@"']
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, path)
    return path


def write_base_repository(work: Path, published: Published) -> Path:
    """work/repository/<name>/: the published config.pbtxt without preferred_batch_size and model_warmup, and links to
    the published model's other entries (version folders); replaced as a whole. Returns the model folder."""
    from optimizer.triton.config.model_config import canonical, parse

    model_dir = published.model_dir.resolve()
    repo = work / "repository"
    tmp = work / ".repository.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    base = tmp / model_dir.name
    base.mkdir(parents=True)
    config = parse((model_dir / "config.pbtxt").read_text(), str(model_dir / "config.pbtxt"))
    if config.HasField("dynamic_batching"):
        config.dynamic_batching.ClearField("preferred_batch_size")
    config.ClearField("model_warmup")
    (base / "config.pbtxt").write_text(canonical(config))
    for entry in sorted(model_dir.iterdir()):
        if entry.name not in ("config.pbtxt", "warmup"):
            (base / entry.name).symlink_to(entry)
    shutil.rmtree(repo, ignore_errors=True)
    os.replace(tmp, repo)
    return repo / model_dir.name


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


def _header(path: Path, cfg: dict[str, Any], published: Published, result: TuneResult, spec: ConfigSpec) -> str:
    name, work, pa = spec.name, cfg["export_path"], cfg["perf_analyzer_flags"]
    data = f"the request mix the export measured ({PERF_ANALYZER_INPUT})" if "input-data" in pa else "random data"
    decision = result.selected_candidate.decision
    remote_flags = ("--triton-launch-mode remote --triton-http-endpoint HOST:8000 --triton-grpc-endpoint HOST:8001"
                    " --triton-metrics-url http://HOST:8002/metrics")
    lines = [
        f"Triton Model Analyzer (triton-model-analyzer 1.58) config for model {name!r}, written by aitune-export.",
        f"Run:  model-analyzer profile -f {path}",
    ]
    if cfg["triton_launch_mode"] == "local":
        lines += [
            "  Model Analyzer starts the local tritonserver 2.51 itself (the one `aitune-export validate` uses;",
            "  triton_server_path is a launcher that gives it its libraries), with the flags and on the loopback ports",
            "  below (change a port if it is taken), once per config it measures; perf_analyzer_path is a launcher",
            "  for this environment's perf_analyzer.",
            f"Another server instead (running, --model-control-mode=explicit, metrics on, serving the model as {name!r}):",
            f"  add  {remote_flags}",
        ]
    else:
        lines += [
            "  Remote mode (no local tritonserver was installed when this was written): first start one, metrics on:",
            f"  tritonserver --model-repository={published.model_dir.parent.resolve()} --model-control-mode=explicit --load-model={name}",
            f"  Another host: add  {remote_flags.removeprefix('--triton-launch-mode remote ')}",
        ]
    lines.append("  (command-line flags override this file; e.g. --run-config-search-max-concurrency 2 for a quicker search)")
    if cfg["triton_launch_mode"] == "local" and spec.instance_group["kind"] != "KIND_CPU":
        repo = published.model_dir.parent.resolve()
        lines += [
            "GPU model: in local mode Model Analyzer reads GPUs through DCGM (libdcgm.so) and hides from the server any GPU",
            "  numba cannot see; without DCGM start the server yourself: triton_server_path with",
            f"  --model-repository={repo} --model-control-mode=explicit,",
            "  the flags below and the ports as --http-port/--grpc-port/--metrics-port; then add the remote flags with",
            "  those 127.0.0.1 endpoints and --dcgm-disable.",
        ]
    lines += [
        f"Search (brute): {_search_text(cfg)}.",
        f"  The export published max_batch_size {spec.max_batch_size}, {spec.instance_group.get('count', 1)} instance(s):",
        f"  {decision.explanation if decision else 'no measurement'}.",
        f"  Model Analyzer varies {cfg['model_repository']}/{name}/config.pbtxt:",
        "  the published config without preferred_batch_size (it would skip every max_batch_size below them) and",
        "  model_warmup (its batch sizes must fit max_batch_size).",
        f"perf_analyzer: {data}, {pa['measurement-interval']} ms time windows stable within {pa['stability-percentage']}%.",
        f"Results, reports, checkpoints and logs: {work}",
        "  (writing this file again empties the checkpoints: Model Analyzer would reuse the old model's measurements).",
    ]
    if result.latency_budget_ms is not None and result.percentile != 99:
        lines.append(f"Model Analyzer constrains p99 latency; the export's budget applied to p{result.percentile}.")
    return "".join(f"# {line}\n" for line in lines)


def _search_text(cfg: dict[str, Any]) -> str:
    parts = []
    if "run_config_search_max_model_batch_size" in cfg:
        parts.append(f"max_batch_size {cfg['run_config_search_min_model_batch_size']}..{cfg['run_config_search_max_model_batch_size']}"
                     " (powers of two)")
    parts.append(f"instances {cfg['run_config_search_min_instance_count']}..{cfg['run_config_search_max_instance_count']}")
    parts.append(f"concurrency {cfg['run_config_search_min_concurrency']}..{cfg['run_config_search_max_concurrency']}")
    return " x ".join(parts)


def write_model_analyzer_config(out_dir: Path, published: Published, result: TuneResult, spec: ConfigSpec,
                                cache_dir: Path | None = None) -> Path:
    """Write out_dir/model_analyzer.yaml atomically, with what it names under out_dir/model_analyzer/ (launchers, base
    repository, an empty checkpoint folder: Model Analyzer would reuse a previous model's measurements); returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = (out_dir / FILENAME).resolve()
    local, perf_analyzer = local_server(cache_dir), local_perf_analyzer()
    cfg = analyzer_config(published, result, spec, out_dir, local, perf_analyzer)
    work = Path(cfg["export_path"])
    work.mkdir(parents=True, exist_ok=True)
    if local:
        write_launcher(Path(cfg["triton_server_path"]), local, "tritonserver 2.51 from the nvidia-pytriton wheel (the local server)")
    if perf_analyzer:
        write_launcher(Path(cfg["perf_analyzer_path"]), perf_analyzer, "perf_analyzer 2.51 from the tritonclient wheel")
    checkpoints = Path(cfg["checkpoint_directory"])
    shutil.rmtree(checkpoints, ignore_errors=True)
    checkpoints.mkdir()
    write_base_repository(work, published)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(_header(path, cfg, published, result, spec) + to_yaml(cfg) + "\n")
    os.replace(tmp, path)
    return path
