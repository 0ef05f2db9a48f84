"""Our rules against the real Triton core (tritonserver 2.51 from nvidia-pytriton), on this CPU machine.

The native backends are not installable here, so each is replaced by a Python-based stand-in
(backends/<name>/model.py answering zeros) - enough for Triton core to run its own validation on the
unchanged config, warmup included. Two checks:
- every golden config from test_triton_config.py loads, except where this machine or this Triton
  version cannot (KIND_GPU without a GPU; torch_aoti before Triton 26.03), with Triton's own reason;
- every broken config whose rule quotes Triton core is rejected by Triton with the very words our rule uses.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optimizer.triton.config.rules import CORE, violations
from optimizer.triton.config.model_config import canonical
from optimizer.triton.repository.publish import PublishOptions, publish
from tests.test_triton_config import CASES, FIXED, PLATFORMS, config_of, golden_result

pytestmark = pytest.mark.slow

STANDIN = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Stand-in for a native backend: answers zeros shaped as the config says (test only)."""

    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.batching = cfg.get("max_batch_size", 0) > 0
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"]), [d if d > 0 else 1 for d in o["dims"]])
                        for o in cfg["output"]]

    def execute(self, requests):
        responses = []
        for r in requests:
            first = r.inputs()[0].as_numpy() if r.inputs() else None
            batch = [first.shape[0]] if self.batching and first is not None else []
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(n, np.zeros(batch + dims, dtype=dt)) for n, dt, dims in self.outputs]))
        return responses
'''

# Core rules Triton cannot show from a file repository, and why.
NOT_REPRODUCIBLE = {
    ("name", "empty"): "Triton fills an empty name from the directory name before validating",
    ("platform_backend", "none"): "Triton guesses the backend from the model file name first; we do not let it guess",
    **{("model_metrics", case): "Triton 2.51 has no model_metrics field: its parser refuses the config first (checked below)"
       for case in ("family", "histogram", "buckets")},
}

# Correct uses of template-settable fields that this machine's Triton 2.51 cannot load, and why.
FIXED_NOT_HERE = {
    "gpus_of_this_machine": "no GPU on this machine",
    "model_metrics": "Triton 2.51 has no model_metrics field",
    "ensemble_two_steps": "its second step names a model this repository does not have",
    "tensorrt_backend_only": "KIND_GPU on GPU 0: no GPU on this machine (with KIND_CPU, which our TensorRT rule refuses, 2.51 loads it)",
}

# Text Triton's own parser refuses (no rule runs): what 2.51 says.
PARSE_REFUSALS = {
    "parse_two_schedulers": ("sequence_batching {\n}\n", 'another member of oneof "scheduling_choice"'),
    "parse_model_metrics": (('model_metrics {\n  metric_control {\n    metric_identifier {\n      family: "nv_inference_request_duration"\n    }\n'
                            '    histogram_options {\n      buckets: [1.0]\n    }\n  }\n}\n'),
                            'Message type "inference.ModelConfig" has no field named "model_metrics"'),
}


@pytest.fixture(scope="module")
def tritonserver(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A private copy of the server tree with the Python stub and the stand-in backends; returns (tree, env)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        pytest.skip("nvidia-pytriton is not installed (pip install 'aitune-export[triton]'): no tritonserver binary here")
    source = Path(spec.origin).parent / "tritonserver"
    libs = Path(spec.origin).parent.parent / "nvidia_pytriton.libs"
    tree = tmp_path_factory.mktemp("tritonserver")
    for part in ("bin", "backends", "caches"):
        shutil.copytree(source / part, tree / part)
    stub = source / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
    shutil.copy2(stub, tree / "backends" / "python")
    for backend in ("onnxruntime", "pytorch", "openvino", "tensorrt"):
        (tree / "backends" / backend).mkdir(exist_ok=True)
        (tree / "backends" / backend / "model.py").write_text(STANDIN)
    env = dict(os.environ, LD_LIBRARY_PATH=str(libs), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return tree, env


def run_server(tree: Path, env: dict[str, str], repo: Path, models: list[str], log: Path) -> str:
    """Start tritonserver on repo (no network), wait until every model has loaded or failed, stop it; returns the log."""
    cmd = [str(tree / "bin" / "tritonserver"), f"--model-repository={repo}", f"--backend-directory={tree / 'backends'}",
           f"--cache-directory={tree / 'caches'}", "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
           "--exit-on-error=false", "--exit-timeout-secs=5", "--log-verbose=0"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            text = log.read_text()
            if "failed to load all models" in text or all(
                    re.search(rf"(successfully loaded|failed to load|failed to load model|Poll failed for model directory) '{m}'", text) for m in models):
                return text
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"tritonserver did not report every model (rc={proc.poll()}); log:\n{log.read_text()[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _write_model(repo: Path, name: str, text: str, model_file: str, warmup: dict[str, int] | None = None) -> None:
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "1" / model_file).write_bytes(b"stand-in backends do not read this")
    (model / "config.pbtxt").write_text(text)
    for fname, size in (warmup or {}).items():
        (model / "warmup").mkdir(exist_ok=True)
        (model / "warmup" / fname).write_bytes(b"\0" * size)


def test_triton_core_agrees_with_our_rules(tritonserver, tmp_path: Path):
    tree, env = tritonserver
    repo = tmp_path / "repo"
    repo.mkdir()
    expected_loaded, expected_reason, expected_words = [], {}, {}
    # golden configs, published the normal way (warmup files included)
    for platform in PLATFORMS:
        name = f"golden_{platform}"
        publish(golden_result(tmp_path / name, platform), PublishOptions(repo, name, warmup=True))
        if platform == "tensorrt_plan":
            # KIND_GPU on the tuned GPU: a machine without it says so (and proves the group got that far)
            expected_reason[name] = f"instance group {name}_0 of model {name} specifies invalid or unsupported gpu id 0"
        elif platform == "torch_aoti":
            expected_reason[name] = f"unexpected platform type 'torch_aoti' for {name}"  # the PyTorch backend serves it from Triton 26.03
        else:
            expected_loaded.append(name)
    # every broken config whose rule quotes Triton core
    bases = {p: config_of(tmp_path / f"base_{p}", p)[0] for p in PLATFORMS}
    for rule, case, platform, mutate, facts, _ in CASES:
        if (rule, case) in NOT_REPRODUCIBLE:
            continue
        name = f"rule_{rule}_{case}"
        config = type(bases[platform])()
        config.CopyFrom(bases[platform])
        config.name = name
        if platform == "tensorrt_plan" and rule == "instance_group":  # reach the profile checks without a GPU
            config.instance_group[0].kind = 2
            config.instance_group[0].ClearField("gpus")
        if mutate is not None:
            mutate(config)
        ours = [v for v in violations(config, facts.__class__(**{**facts.__dict__, "directory_name": name})) if v.source == CORE]
        if not ours:
            continue
        model_file = {"openvino": "model.xml", "tensorrt_plan": "model.plan", "pytorch_libtorch": "model.pt", "torch_aoti": "model.pt2"}.get(
            platform, "model.onnx")
        _write_model(repo, name, canonical(config), model_file, dict(facts.warmup_files or {}) or {"image.data": 768})
        expected_words[name] = ours[0].message
    assert len(expected_words) >= 60  # every core-worded case but those Triton 2.51 cannot show
    # correct uses of template-settable fields load (an ensemble's step names the golden ONNX model)
    for case, platform, mutate, facts in FIXED:
        if case in FIXED_NOT_HERE:
            continue
        name = f"fixed_{case}"
        config = type(bases[platform])()
        config.CopyFrom(bases[platform])
        config.name = name
        mutate(config)
        for step in config.ensemble_scheduling.step:
            step.model_name = "golden_onnxruntime_onnx"
        assert violations(config, facts.__class__(**{**facts.__dict__, "directory_name": name})) == []
        _write_model(repo, name, canonical(config), "model.onnx", {"image.data": 768})
        expected_loaded.append(name)
    # what Triton's parser refuses before any rule
    parse_words = {}
    for name, (extra, words) in PARSE_REFUSALS.items():
        config = type(bases["onnxruntime_onnx"])()
        config.CopyFrom(bases["onnxruntime_onnx"])
        config.name = name
        _write_model(repo, name, canonical(config) + extra, "model.onnx", {"image.data": 768})
        parse_words[name] = words

    log = run_server(tree, env, repo, [*expected_loaded, *expected_reason, *expected_words, *parse_words], tmp_path / "server.log")
    for name in expected_loaded:
        assert f"successfully loaded '{name}'" in log, f"{name} did not load:\n{_lines_about(log, name)}"
    for name, reason in {**expected_reason, **expected_words, **parse_words}.items():
        assert f"successfully loaded '{name}'" not in log, f"Triton accepted {name}, which our rules reject with: {reason}"
        assert reason in log, f"Triton's words for {name} differ from ours ({reason!r}):\n{_lines_about(log, name)}"


def _lines_about(log: str, name: str) -> str:
    return "\n".join(line for line in log.splitlines() if f"'{name}'" in line or f" {name}" in line)[-2000:]
