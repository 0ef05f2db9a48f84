"""The Triton configs of GPU artifacts, rendered, parsed into Triton's schema and checked by its load rules:
KIND_GPU on the tuned GPU, max_batch_size never above a TensorRT engine's profile max, CUDA graphs,
and the ONNX Runtime TensorRT accelerator block with the same options the in-process session used.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.backend.onnxruntime_trt import OnnxRuntimeTensorRTBackend, tensorrt_accelerator
from optimizer.backend.tensorrt import TensorRTBackend
from optimizer.backend.trt_profiles import optimization_profile
from optimizer.errors import BackendError, ConfigRuleError
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.records.candidate import Candidate
from optimizer.records.measurements import BatchProfile, MaxBatchDecision
from optimizer.records.reference_set import ReferenceSet
from optimizer.records.tune_result import TuneResult
from optimizer.triton.config.model_config import parse
from optimizer.triton.repository.publish import PublishOptions, prepare_config, publish

SIG = Signature.from_json({
    "batching": True,
    "inputs": [{"name": "input_ids", "dtype": "int64", "dims": ["1-128"], "value_range": [0, 999]}],
    "outputs": [{"name": "output__0", "dtype": "float32", "dims": ["2"], "value_range": None}],
})


def _profile(batch: int, latency_ms: float) -> BatchProfile:
    return BatchProfile(batch, latency_ms, latency_ms, latency_ms, latency_ms, latency_ms, batch / latency_ms * 1000, 50, 5, True, 0.01, 0.0)


def _result(artifact: Artifact, max_batch: int) -> TuneResult:
    """A finished run whose selected candidate is `artifact`, measured at batch 1..max_batch."""
    sizes = sorted({1, max(1, max_batch // 2), max_batch})
    decision = MaxBatchDecision([_profile(b, 1.0 + b / 8) for b in sizes], max_batch, sizes[-1], sizes[-1], "saturation")
    name = f"{artifact.backend}[{artifact.device}]"
    cand = Candidate(name, artifact.backend, artifact.device, status="passed", artifact=artifact, decision=decision)
    return TuneResult(
        model_name="enc", source={}, signature=SIG.to_json(), device=artifact.device, strategy="max-throughput", workflow="aot",
        candidates=[cand], eager=None, selected=name, max_batch_size=max_batch, selection_reason="test",
        reference=ReferenceSet("", "", [], ""),
    )


def _trt_artifact(tmp_path: Path, device: str, engine_max: int, **settings) -> Artifact:
    (tmp_path / "art").mkdir(exist_ok=True)
    (tmp_path / "art" / "model.plan").write_bytes(b"engine bytes")
    profile = optimization_profile(SIG, engine_max)
    art = Artifact("tensorrt", device, str(tmp_path / "art"), ["model.plan"], SIG.to_json(), "tensorrt_plan",
                   metadata={"engine_max_batch": engine_max, "profiles": [[r.to_json() for r in profile]]}, batch_range=(1, engine_max))
    art.triton_settings = TensorRTBackend(**settings).triton_settings(art)
    return art


def _tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT), helper.make_node("ReduceMean", ["f"], ["m"], keepdims=1),
         helper.make_node("Concat", ["m", "m"], ["output__0"], axis=1)],
        "enc", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("output__0", TensorProto.FLOAT, ["batch", 2])],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))


def test_tensorrt_engine_config_is_kind_gpu_on_the_tuned_gpu(tmp_path):
    art = _trt_artifact(tmp_path, "cuda:1", 64)
    config = parse(prepare_config(_result(art, 64), PublishOptions(tmp_path / "repo", "enc"))[0])
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 64
    group = config.instance_group[0]
    assert group.kind == 1 and list(group.gpus) == [1]  # KIND_GPU on cuda:1
    assert list(config.input[0].dims) == [-1], "the sequence axis stays dynamic"
    assert not config.optimization.HasField("cuda"), "CUDA graphs only when asked for"
    published = publish(_result(art, 64), PublishOptions(tmp_path / "repo", "enc"))
    assert (published.model_dir / "1" / "model.plan").read_bytes() == b"engine bytes"


def test_max_batch_size_above_the_engine_profile_is_refused_with_tritons_words(tmp_path):
    art = _trt_artifact(tmp_path, "cuda", 32)
    with pytest.raises(ConfigRuleError, match="specified max-batch 64 but TensorRT engine only supports max-batch 32"):
        prepare_config(_result(art, 64), PublishOptions(tmp_path / "repo", "enc"))
    assert not (tmp_path / "repo" / "enc").exists()


def test_cuda_graphs_are_an_option_of_the_engine_config(tmp_path):
    art = _trt_artifact(tmp_path, "cuda", 16, cuda_graphs=True)
    config = parse(prepare_config(_result(art, 16), PublishOptions(tmp_path / "repo", "enc"))[0])
    assert config.optimization.cuda.graphs is True


def test_a_tensorrt_engine_never_gets_kind_cpu(tmp_path):
    art = _trt_artifact(tmp_path, "cpu", 16)
    config = parse(prepare_config(_result(art, 16), PublishOptions(tmp_path / "repo", "enc"))[0])
    assert config.instance_group[0].kind == 1  # KIND_GPU, whatever device the record claims


def _ort_trt_artifact(tmp_path: Path, precision: str) -> tuple[OnnxRuntimeTensorRTBackend, Artifact]:
    _tiny_onnx(tmp_path / "art" / "model.onnx")
    backend = OnnxRuntimeTensorRTBackend(precision=precision, workspace_mb=2048)
    profile = optimization_profile(SIG, 16, opt_batch=4)
    art = Artifact(backend.name, "cuda:1", str(tmp_path / "art"), ["model.onnx"], SIG.to_json(), "onnxruntime_onnx",
                   metadata={"engine_max_batch": 16, "profiles": [[r.to_json() for r in profile]]}, batch_range=(1, 16))
    art.triton_settings = backend.triton_settings(art)
    return backend, art


def test_onnxruntime_tensorrt_ep_config_carries_precision_workspace_cache_and_profiles(tmp_path):
    backend, art = _ort_trt_artifact(tmp_path, "fp16")
    config = parse(prepare_config(_result(art, 16), PublishOptions(tmp_path / "repo", "enc"))[0])
    assert config.platform == "onnxruntime_onnx" and config.instance_group[0].kind == 1 and list(config.instance_group[0].gpus) == [1]
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert [a.name for a in accelerators] == ["tensorrt"]
    assert dict(accelerators[0].parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": str(2048 * 2**20),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/tmp/aitune-export/ort-trt-engines",
        "trt_profile_min_shapes": "input_ids:1x1",
        "trt_profile_opt_shapes": "input_ids:4x128",
        "trt_profile_max_shapes": "input_ids:16x128",
    }
    assert config.optimization.graph.level == -1, "basic graph optimizations keep the graph TensorRT-shaped"
    assert "intra_op_thread_count" not in config.parameters


def test_the_in_process_session_gets_the_options_the_config_carries(tmp_path):
    backend, art = _ort_trt_artifact(tmp_path, "fp16")
    (name, options), cuda, cpu = backend.providers(art, "cuda:1")
    params = art.triton_settings["gpu_execution_accelerator"]["parameters"]
    assert name == "TensorrtExecutionProvider" and cuda == ("CUDAExecutionProvider", {"device_id": 1}) and cpu == "CPUExecutionProvider"
    assert options["device_id"] == 1
    assert options["trt_fp16_enable"] is (params["precision_mode"] == "FP16")
    assert options["trt_max_workspace_size"] == int(params["max_workspace_size_bytes"])
    assert options["trt_engine_cache_enable"] is True
    for key in ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes"):
        assert options[key] == params[key]
    _, fp32 = _ort_trt_artifact(tmp_path / "fp32", "fp32")
    assert fp32.triton_settings["gpu_execution_accelerator"]["parameters"]["precision_mode"] == "FP32"


def test_accelerator_block_without_profiles_for_a_static_non_batching_model():
    block = tensorrt_accelerator([], "fp32", 1024, "/cache")
    assert block["name"] == "tensorrt" and not any(k.startswith("trt_profile") for k in block["parameters"])


def test_torch_artifacts_on_a_gpu_are_kind_gpu(tmp_path):
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "model.pt").write_bytes(b"x")
    art = Artifact("torchscript", "cuda:2", str(tmp_path / "art"), ["model.pt"], SIG.to_json(), "pytorch_libtorch", batch_range=(1, 8))
    config = parse(prepare_config(_result(art, 8), PublishOptions(tmp_path / "repo", "enc"))[0])
    assert config.instance_group[0].kind == 1 and list(config.instance_group[0].gpus) == [2]


def _ort_has_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(_ort_has_cuda(), reason="this onnxruntime has a CUDA provider, so it does not fall back")
def test_a_session_that_fell_back_from_the_gpu_provider_is_refused(tmp_path):
    # ONNX Runtime only warns when the CUDA (or TensorRT) provider cannot start and runs on the CPU;
    # measuring that as a GPU candidate would misreport it. This onnxruntime has no CUDA provider.
    import warnings

    from optimizer.backend.onnxruntime import OnnxRuntimeRunner

    _tiny_onnx(tmp_path / "art" / "model.onnx")
    art = Artifact("onnxruntime", "cuda", str(tmp_path / "art"), ["model.onnx"], SIG.to_json(), "onnxruntime_onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(BackendError, match="did not enable CUDAExecutionProvider \\(the session runs on CPUExecutionProvider\\)"):
            with OnnxRuntimeRunner(art, "cuda", "all"):
                pass
