"""`aitune-export inspect`: the signature, candidates and strategy an export would use, with nothing built or written."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from optimizer.cli import main
from tests.conftest import tree_snapshot


def _inspect(*args: str) -> dict:
    r = CliRunner().invoke(main, ["inspect", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)  # stdout is one JSON document and nothing else


def test_bundled_example_signature_candidates_and_defaults(in_tmp: Path):
    doc = _inspect()
    assert doc["model"]["name"] == "cnn" and doc["model"]["format"] == "torch"
    sig = doc["signature"]
    assert sig["batching"] is True
    assert sig["inputs"] == [{"name": "image", "dtype": "float32", "dims": ["3", "64", "64"], "triton_dims": [3, 64, 64],
                              "dynamic_axes": [], "value_range": None}]
    assert [(o["name"], o["dtype"], o["dims"]) for o in sig["outputs"]] == [("output__0", "float32", ["10"])]
    cands = {c["name"]: c for c in doc["candidates"]}
    assert cands["torch-eager[cpu]"]["role"] == "baseline" and cands["torch-eager[cpu]"]["triton_platform"] is None
    assert cands["torchscript[cpu]"] | {"reason": ""} == {"name": "torchscript[cpu]", "backend": "torchscript", "role": "candidate",
                                                          "triton_platform": "pytorch_libtorch", "model_file": "model.pt",
                                                          "will_run": True, "reason": ""}
    assert cands["onnxruntime[cpu]"]["will_run"] and cands["onnxruntime[cpu]"]["model_file"] == "model.onnx"
    st = doc["strategy"]
    assert (st["name"], st["workflow"], st["device"], st["eager_gate"]) == ("max-throughput", "aot", "cpu", "enabled")
    assert st["batch_policy"]["max_batch_size"] is None and st["batch_policy"]["search_cap"] == 256
    assert st["batch_policy"]["percentile"] == 95 and st["batch_policy"]["latency_budget_ms"] is None
    assert st["correctness_points"] == ["batch=1,axes=max", "batch=3,axes=max"]
    assert st["tolerances"]["float32"] == {"atol": 1e-4, "rtol": 1e-4}
    assert tree_snapshot(in_tmp) == {}  # nothing built, nothing written


def test_dynamic_axes_value_ranges_and_options_are_reflected():
    doc = _inspect("optimizer.examples.transformer:build", "--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999",
                   "--strategy", "latency-budget", "--latency-budget-ms", "40", "--percentile", "99", "--backend", "onnxruntime")
    (ids,) = doc["signature"]["inputs"]
    assert ids["dims"] == ["1-128"] and ids["triton_dims"] == [-1] and ids["dynamic_axes"] == [0]
    assert ids["value_range"] == [0.0, 999.0]
    assert [c["name"] for c in doc["candidates"]] == ["torch-eager[cpu]", "onnxruntime[cpu]"]
    policy = doc["strategy"]["batch_policy"]
    assert (doc["strategy"]["name"], policy["latency_budget_ms"], policy["percentile"]) == ("latency-budget", 40.0, 99)
    assert doc["strategy"]["correctness_points"] == ["batch=1,axes=min", "batch=1,axes=max", "batch=3,axes=min", "batch=3,axes=max"]


def test_unavailable_candidates_say_why():
    doc = _inspect("--device", "cuda", "--eager-gate", "disabled")
    assert {c["role"] for c in doc["candidates"]} == {"candidate"}  # no eager baseline when the gate is disabled
    ort = next(c for c in doc["candidates"] if c["backend"] == "onnxruntime")
    assert ort["name"] == "onnxruntime[cuda]" and not ort["will_run"] and "CUDAExecutionProvider" in ort["reason"]


def test_text_output_lists_tensors_candidates_and_limits():
    r = CliRunner().invoke(main, ["inspect", "--max-batch-size", "16"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("model       cnn  (callable optimizer.examples.cnn:build, torch)")
    assert any(l.split()[:4] == ["image", "float32", "3x64x64", "triton"] for l in lines)
    assert any(l.split()[:2] == ["onnxruntime[cpu]", "onnxruntime_onnx"] and l.endswith("will run") for l in lines)
    assert any(l.split()[:2] == ["batch", "sizes"] and "up to 16 (--max-batch-size)" in l for l in lines)


def test_bad_spec_is_one_line_exit_2(in_tmp: Path):
    r = CliRunner().invoke(main, ["inspect", "--input", "img:float32:3x64x64", "--json"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "model's inputs are: image" in r.stderr
    assert tree_snapshot(in_tmp) == {}


def test_cuda_lists_exactly_what_export_tries_in_order_with_the_given_tolerances(in_tmp: Path):
    """inspect and export plan from the same RunPlan: on --device cuda both try the GPU engines first."""
    from tests.conftest import run_cli

    doc = _inspect("--device", "cuda", "--eager-gate", "disabled", "--tolerance", "1e-3", "--tolerance", "output__0=2e-3,1e-2")
    planned = [c["name"] for c in doc["candidates"]]
    assert planned[:2] == ["tensorrt[cuda]", "onnxruntime-trt[cuda]"] and "onnxruntime[cuda]" in planned
    assert doc["strategy"]["tolerance_overrides"] == {"*": {"atol": 1e-3, "rtol": 1e-3}, "output__0": {"atol": 2e-3, "rtol": 1e-2}}
    r = run_cli("export", "--device", "cuda", "--eager-gate", "disabled", "--json", "--report-dir", "rep", cwd=in_tmp)
    if not _gpu_here():  # export refuses at once, in one line, with nothing written
        assert r.returncode == 2 and r.stderr.startswith("error: --device cuda:") and "no CUDA device" in r.stderr, r.stderr
        assert not (in_tmp / "rep").exists() and not (in_tmp / "model_repository").exists()
        return
    # with a GPU (TensorRT or not) export records every candidate it tried, in order
    tried = [c["name"] for c in json.loads((in_tmp / "rep" / "report.json").read_text())["result"]["candidates"]]
    assert tried == planned, r.stderr


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available() or Path("/dev/nvidiactl").exists()


def test_a_release_caveat_is_printed_once_per_backend(in_tmp: Path):
    """torchscript[cpu] and torchscript[cpu,bf16] each carry the same torch caveat: inspect printed it twice."""
    from optimizer.app.inspect import describe, inspect_model
    from optimizer.settings import ExportSettings

    inspection = inspect_model(ExportSettings(model="tests.fixtures.models:mlp"))
    doc = inspection.to_json()
    doc["triton_release"]["checks"] = doc["triton_release"]["checks"] * 2  # as two precisions of each backend give
    object.__setattr__(inspection, "to_json", lambda: doc)
    caveats = [line for line in describe(inspection) if line.startswith("  torchscript torch:")]
    assert len(caveats) == 1


def test_a_per_sample_scalar_shows_the_dims_and_reshape_config_pbtxt_gets():
    # (a * b).sum(dim=1) is one value per sample: published as dims [1] with reshape [], which inspect shows too
    doc = _inspect("tests.fixtures.models:two_inputs")
    added, summed = doc["signature"]["outputs"]
    assert added["triton_dims"] == [8] and "triton_reshape" not in added
    assert summed["dims"] == [] and summed["triton_dims"] == [1] and summed["triton_reshape"] == []
    text = CliRunner().invoke(main, ["inspect", "tests.fixtures.models:two_inputs"]).stdout
    assert "triton dims [1] reshape []" in text
