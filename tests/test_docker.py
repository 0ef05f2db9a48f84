"""The Docker build stage: the Dockerfile lints and has the promised shape, its export command works natively,
and the server stage refuses a mismatched release pair. (No Docker engine here: the image is never built.)"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from optimizer.triton.config.model_config import parse
from tests.conftest import ROOT, run_cli

DOCKERFILE = ROOT / "docker" / "Dockerfile"


PARSE = """import json, sys, dockerfile
print(json.dumps([c._asdict() for c in dockerfile.parse_file(sys.argv[1])]))
"""


@functools.cache
def _commands() -> tuple[SimpleNamespace, ...]:
    """The Dockerfile's instructions (cmd, value, original, json, ...), parsed by the `dockerfile` package in a child
    process: the package is Go (cgo) and brings Go's runtime and signal handling into whichever process imports it. A
    pytest worker died during this file's second parse ("node down: Not properly terminated"); a run the round before
    lost one at the same point of the suite."""
    r = subprocess.run([sys.executable, "-c", PARSE, str(DOCKERFILE)], capture_output=True, text=True, timeout=120, check=True)
    return tuple(SimpleNamespace(**c) for c in json.loads(r.stdout))


def test_hadolint_passes():
    hadolint = Path(sys.executable).parent / "hadolint"
    r = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_one_release_argument_feeds_both_stages():
    cmds = _commands()
    first_from = next(i for i, c in enumerate(cmds) if c.cmd == "FROM")
    assert any(c.cmd == "ARG" and c.value[0].startswith("RELEASE=") for c in cmds[:first_from])
    froms = [c.value for c in cmds if c.cmd == "FROM"]
    images = [v[0] for v in froms]
    assert "nvcr.io/nvidia/pytorch:${RELEASE}-py3" in images
    assert "nvcr.io/nvidia/tritonserver:${RELEASE}-py3" in images
    stages = {v[-1] for v in froms if len(v) == 3}
    assert {"export-env", "export", "serve"} <= stages


def test_default_release_is_the_default_triton_release_and_reaches_the_export():
    """--triton-release defaults to the release the Dockerfile builds on, and the export stage targets the one it was given."""
    from optimizer.records.triton_releases import DEFAULT_RELEASE

    cmds = _commands()
    first_from = next(i for i, c in enumerate(cmds) if c.cmd == "FROM")
    (arg,) = [c.value[0] for c in cmds[:first_from] if c.cmd == "ARG" and c.value[0].startswith("RELEASE=")]
    assert arg == f"RELEASE={DEFAULT_RELEASE}"
    export = next(c.original for c in cmds if c.cmd == "RUN" and "aitune-export export" in c.original)
    assert '--triton-release "${RELEASE}"' in export


def test_server_stage_exposes_ports_checks_health_and_starts_tritonserver():
    cmds = _commands()
    serve = cmds[max(i for i, c in enumerate(cmds) if c.cmd == "FROM"):]
    expose = next(c for c in serve if c.cmd == "EXPOSE")
    assert set(expose.value) == {"8000", "8001", "8002"}
    health = next(c for c in serve if c.cmd == "HEALTHCHECK")
    assert "/v2/health/ready" in health.original
    entry = next(c for c in serve if c.cmd == "ENTRYPOINT")
    assert entry.json and entry.value[0] == "tritonserver" and "--model-repository=/models" in entry.value
    assert any(c.cmd == "RUN" and "check_release.py" in c.original for c in serve)


def test_export_stage_runs_aitune_export_with_the_settings_file():
    runs = [c.original for c in _commands() if c.cmd == "RUN"]
    assert any("aitune-export export --config /workspace/export.toml --repository /models" in r for r in runs)
    assert not any("pip install" in r and "torch" in r.split("pip install", 1)[1].split("[")[0] for r in runs), "never reinstall torch"


@pytest.mark.slow
def test_export_stage_command_natively_with_the_same_settings_file(in_tmp: Path):
    """The export stage's exact command, minus the container: what it produces is what the server stage copies."""
    models, report = in_tmp / "models", in_tmp / "aitune" / "report"
    r = run_cli("export", "--config", str(ROOT / "docker" / "export.toml"), "--repository", str(models),
                "--report-dir", str(report), "--max-batch-size", "4", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    config = parse((models / "cnn" / "config.pbtxt").read_text())
    assert config.name == "cnn" and config.instance_group[0].kind == 2  # KIND_CPU: servable by any server image
    files = {p.name for p in (models / "cnn" / "1").iterdir()}
    assert files & {"model.onnx", "model.pt"}
    doc = json.loads((report / "report.json").read_text())
    assert doc["settings"]["backend"] == ["onnxruntime", "torchscript"] and doc["settings"]["device"] == "cpu"
    assert {c["backend"] for c in doc["result"]["candidates"]} == {"onnxruntime", "torchscript"}


def _check_release(report: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("NVIDIA_TRITON_SERVER_VERSION", "TENSORRT_VERSION")}
    return subprocess.run([sys.executable, str(ROOT / "docker" / "check_release.py"), str(report)],
                          capture_output=True, text=True, env={**clean, **env})


def _report(tmp_path: Path, ngc: dict, backend: str) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"result": {"environment": {"ngc": ngc}, "selected": f"{backend}[cuda]",
                                           "candidates": [{"name": f"{backend}[cuda]", "backend": backend}]}}))
    return path


def test_release_check_accepts_a_matching_pair_and_refuses_a_mismatch(tmp_path: Path):
    report = _report(tmp_path, {"NVIDIA_PYTORCH_VERSION": "24.10", "TENSORRT_VERSION": "10.5.0"}, "tensorrt")
    assert _check_release(report, NVIDIA_TRITON_SERVER_VERSION="24.10", TENSORRT_VERSION="10.5.0").returncode == 0
    r = _check_release(report, NVIDIA_TRITON_SERVER_VERSION="24.12", TENSORRT_VERSION="10.7.0")
    assert r.returncode == 1
    assert "NGC PyTorch 24.10 but this is NGC Triton 24.12" in r.stderr and "TensorRT 10.5.0" in r.stderr
    assert "--build-arg RELEASE" in r.stderr
    assert _check_release(tmp_path / "missing.json").returncode == 2


def test_release_check_only_warns_about_tensorrt_when_no_plan_is_served(tmp_path: Path):
    report = _report(tmp_path, {"NVIDIA_PYTORCH_VERSION": "24.10", "TENSORRT_VERSION": "10.5.0"}, "onnxruntime")
    r = _check_release(report, NVIDIA_TRITON_SERVER_VERSION="24.10", TENSORRT_VERSION="10.7.0")
    assert r.returncode == 0 and "warning" in r.stderr
