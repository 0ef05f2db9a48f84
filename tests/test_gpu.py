"""On a GPU only: the CUDA candidates build, load, match eager PyTorch and publish KIND_GPU configs.

Everywhere else every test here is skipped with the real reason: torch's "no CUDA device" for the
torch candidates, and for TensorRT the real import or builder error (here, on the project's CPU
machines: "ModuleNotFoundError: No module named 'tensorrt'"). scripts/gpu_check.sh runs this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.backend import backend_named
from optimizer.backend.base import Availability
from optimizer.backend.cuda import torch_cuda_availability
from optimizer.backend.tensorrt import tensorrt_status
from optimizer.model.reference import resolve_signature, run_reference
from optimizer.model.samples import ShapePoint, generate_feed
from optimizer.model.signature import parse_input_spec
from optimizer.model.source import load_model
from optimizer.task.correctness import compare_outputs, precision_tolerances
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def _cuda() -> Availability:
    try:
        return torch_cuda_availability("cuda")
    except Exception as err:
        return Availability(False, f"{type(err).__name__}: {err}")


CUDA = _cuda()
_TRT = tensorrt_status()  # the import error first: it is the reason on every machine without TensorRT
TRT = _TRT if not _TRT or CUDA else Availability(False, f"no CUDA: {CUDA.reason}")
needs_cuda = pytest.mark.skipif(not CUDA, reason=f"no CUDA: {CUDA.reason}")
needs_tensorrt = pytest.mark.skipif(not TRT, reason=TRT.reason)

CNN = ("optimizer.examples.cnn:build", {}, [ShapePoint(1, "max"), ShapePoint(16, "max")])
ENCODER = (
    "optimizer.examples.transformer:build",
    {"input_specs": [parse_input_spec("input_ids:int64:1-128")], "value_ranges": {"input_ids": (0, 999)}},
    [ShapePoint(1, "min"), ShapePoint(16, "max"), ShapePoint(3, "min")],
)


def _matches_eager(backend_name: str, example: tuple, tmp_path: Path, precision: str = "fp32", **settings) -> dict:
    spec, sig_kwargs, points = example
    model = load_model(spec)
    sig = resolve_signature(model, **sig_kwargs)
    backend = backend_named(backend_name, precision=precision, **settings)
    av = backend.availability("cuda")
    if not av:
        pytest.skip(f"{backend_name}: {av.reason}")
    artifact = backend.build(model, sig, tmp_path / backend_name, (1, 16), "cuda")
    tolerances = precision_tolerances(sig, precision)
    reference = load_model(spec)  # on the CPU, in fp32
    with backend.load(artifact, "cuda", load_model(spec)) as runner:
        for i, point in enumerate(points):
            feed = generate_feed(sig, point, seed=i)
            case = compare_outputs(point.label, sig.output_names, [o.dtype.name for o in sig.outputs], runner.infer(feed),
                                   run_reference(reference, sig.input_names, feed), tolerances)
            assert case.passed, case.outputs
    return artifact.metadata


@needs_cuda
@pytest.mark.parametrize("example", [CNN, ENCODER], ids=["cnn", "encoder"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_torchscript_on_cuda_matches_eager(example, precision, tmp_path):
    meta = _matches_eager("torchscript", example, tmp_path, precision)
    assert meta["precision"] == precision


@needs_cuda
@pytest.mark.parametrize("backend_name", ["onnxruntime", "onnxruntime-trt"])
def test_onnxruntime_gpu_providers_match_eager(backend_name, tmp_path):
    _matches_eager(backend_name, CNN, tmp_path)  # skips with the provider reason when onnxruntime-gpu is missing


@needs_tensorrt
@pytest.mark.parametrize("example", [CNN, ENCODER], ids=["cnn", "encoder"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_engine_matches_eager_and_records_its_profile(example, precision, tmp_path):
    meta = _matches_eager("tensorrt", example, tmp_path, precision, cache_dir=str(tmp_path / "cache"))
    assert meta["engine_max_batch"] == 16 and meta["compute_capability"] and meta["precision"] == precision


@needs_tensorrt
def test_tensorrt_reuses_its_timing_cache_and_refuses_batches_beyond_the_profile(tmp_path):
    from optimizer.errors import BackendError

    model = load_model(CNN[0])
    sig = resolve_signature(model)
    backend = backend_named("tensorrt", cache_dir=str(tmp_path / "cache"))
    first = backend.build(model, sig, tmp_path / "a", (1, 8), "cuda")
    second = backend.build(model, sig, tmp_path / "b", (1, 8), "cuda")
    assert not first.metadata["timing_cache_reused"] and second.metadata["timing_cache_reused"]
    with backend.load(second, "cuda") as runner:
        runner.infer(generate_feed(sig, ShapePoint(8, "max"), seed=0))
        with pytest.raises(BackendError):
            runner.infer(generate_feed(sig, ShapePoint(9, "max"), seed=0))


@needs_cuda
def test_cuda_out_of_memory_is_recognized_and_released():
    import torch

    from optimizer.task.device_memory import is_allocation_failure, release_device_memory

    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.cuda.OutOfMemoryError) as caught:
        torch.empty(int(free * 4), dtype=torch.uint8, device="cuda")
    assert is_allocation_failure(caught.value)
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del block
    assert torch.cuda.memory_reserved() >= 256 * 2**20
    release_device_memory("cuda")
    assert torch.cuda.memory_reserved() < 256 * 2**20


@needs_cuda
def test_export_on_cuda_publishes_a_kind_gpu_model(tmp_path):
    backends = ["--backend", "torchscript"] + (["--backend", "tensorrt", "--allow-version-mismatch"] if TRT else [])  # any TensorRT
    r = run_cli("export", "--device", "cuda", "--max-batch-size", "8", *backends, "--repository", "repo", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from optimizer.triton.config.model_config import parse

    config = parse((tmp_path / "repo" / "cnn" / "config.pbtxt").read_text())
    assert config.instance_group[0].kind == 1 and list(config.instance_group[0].gpus) == [0]  # KIND_GPU
    report = json.loads((tmp_path / "aitune-reports" / "cnn" / "report.json").read_text())
    chosen = next(c for c in report["result"]["candidates"] if c["name"] == report["result"]["selected"])
    engine_max = chosen["artifact"]["metadata"].get("engine_max_batch")
    assert config.max_batch_size <= (engine_max or 8)
