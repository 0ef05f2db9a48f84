"""TensorRT on a machine without it: the profiles, the engine build as TensorRT 11's API sees it, the
timing cache, the availability report and the Triton config of an engine.

The engine build goes through `build_engine(trt, ...)` with a recording stand-in for the `tensorrt`
module (tests/fixtures/tensorrt_standin.py) that accepts only names compiled into the real 11.4
bindings. What it cannot tell, whether TensorRT builds and runs these engines correctly on a GPU,
is tests/test_gpu.py's job (skipped here, with the real reason).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from optimizer.backend.tensorrt import TensorRTBackend, build_engine, network_flags, tensorrt_status, timing_cache_file
from optimizer.backend.trt_profiles import ShapeRange, engine_max_batch, navigator_opt_batch, opt_batch_for, optimization_profile, ort_profile_shapes
from optimizer.cli import main
from optimizer.errors import BackendError
from optimizer.model.signature import Signature
from tests.fixtures.tensorrt_standin import StandinTensorRT, is_real_api_name


def _sig(batching: bool = True) -> Signature:
    """Token ids and a mask (dynamic sequence 1-128), a static 3x8x8 image, one float output."""
    return Signature.from_json({
        "batching": batching,
        "inputs": [
            {"name": "input_ids", "dtype": "int64", "dims": ["1-128"], "value_range": [0, 999]},
            {"name": "attention_mask", "dtype": "int64", "dims": ["1-128"], "value_range": [0, 1]},
            {"name": "image", "dtype": "float32", "dims": ["3", "8", "8"], "value_range": None},
        ],
        "outputs": [{"name": "output__0", "dtype": "float32", "dims": ["2"], "value_range": None}],
    })


def _tiny_onnx(path: Path, names: tuple[str, ...] = ("x",)) -> Path:
    """A real ONNX file: each input [batch, 4] float32 -> Relu -> output__i."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in names]
    outputs = [helper.make_tensor_value_info(f"output__{i}", TensorProto.FLOAT, ["batch", 4]) for i in range(len(names))]
    nodes = [helper.make_node("Relu", [n], [f"output__{i}"]) for i, n in enumerate(names)]
    model = helper.make_model(helper.make_graph(nodes, "tiny", inputs, outputs), opset_imports=[helper.make_opsetid("", 20)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


# -- profiles ----------------------------------------------------------------------------------

def test_profile_covers_batch_1_to_max_and_every_dynamic_axis():
    profile = {r.name: r for r in optimization_profile(_sig(), 64)}
    assert profile["input_ids"] == ShapeRange("input_ids", (1, 1), (32, 128), (64, 128))
    assert profile["attention_mask"] == ShapeRange("attention_mask", (1, 1), (32, 128), (64, 128))
    # a static per-sample shape still varies in its batch axis
    assert profile["image"] == ShapeRange("image", (1, 3, 8, 8), (32, 3, 8, 8), (64, 3, 8, 8))


def test_optimal_batch_is_the_measured_knee_else_navigators_rule():
    assert {m: navigator_opt_batch(m) for m in (1, 2, 3, 8, 16, 64, 100, 256)} == {1: 1, 2: 2, 3: 2, 8: 8, 16: 16, 64: 32, 100: 32, 256: 128}
    assert opt_batch_for(256, None)[0] == 128 and "Model Navigator" in opt_batch_for(256, None)[1]
    assert opt_batch_for(256, 8, "eager PyTorch's measured knee") == (8, "8: eager PyTorch's measured knee")
    assert opt_batch_for(16, 64)[0] == 16, "a knee above the profile max is capped"
    assert [r.opt[0] for r in optimization_profile(_sig(), 64, opt_batch=8)] == [8, 8, 8]
    with pytest.raises(BackendError, match="outside the profile's batch range"):
        optimization_profile(_sig(), 4, opt_batch=8)


def test_non_batching_model_gets_ranges_only_for_dynamic_inputs():
    sig = _sig(batching=False)
    profile = optimization_profile(sig, 0)
    assert [r.name for r in profile] == ["input_ids", "attention_mask"]
    assert profile[0] == ShapeRange("input_ids", (1,), (128,), (128,))
    assert engine_max_batch([profile], sig) is None


def test_engine_max_batch_is_the_smallest_input_maximum_over_profiles():
    sig = _sig()
    first = optimization_profile(sig, 64)
    second = [ShapeRange(r.name, (1, *r.min[1:]), (64, *r.opt[1:]), (128, *r.max[1:])) for r in first if r.name != "image"]
    assert engine_max_batch([first], sig) == 64
    assert engine_max_batch([first, second], sig) == 64, "image only reaches 64, so the engine serves 64"
    with pytest.raises(BackendError, match="image"):
        engine_max_batch([second], sig)


def test_ort_profile_shapes_use_onnx_runtimes_spelling():
    shapes = ort_profile_shapes(optimization_profile(_sig(), 16))
    assert shapes == {
        "trt_profile_min_shapes": "input_ids:1x1,attention_mask:1x1,image:1x3x8x8",
        "trt_profile_opt_shapes": "input_ids:16x128,attention_mask:16x128,image:16x3x8x8",
        "trt_profile_max_shapes": "input_ids:16x128,attention_mask:16x128,image:16x3x8x8",
    }


# -- the build, as the TensorRT 11 API sees it -------------------------------------------------

def test_the_standin_knows_what_tensorrt_11_removed():
    # the fixture is the real 11.4 bindings: strong typing stays, weak-typing flags are gone
    assert is_real_api_name("STRONGLY_TYPED") and is_real_api_name("set_memory_pool_limit")
    assert not is_real_api_name("FP16") and not is_real_api_name("EXPLICIT_BATCH")
    assert not is_real_api_name("platform_has_fast_fp16") and not is_real_api_name("max_workspace_size")
    builder = StandinTensorRT().Builder(None)
    with pytest.raises(AttributeError, match="platform_has_fast_fp16"):
        builder.platform_has_fast_fp16  # noqa: B018 (removed in TensorRT 11)


def test_engine_build_makes_the_calls_tensorrt_11_expects(tmp_path):
    trt = StandinTensorRT()
    onnx_path = _tiny_onnx(tmp_path / "model.onnx", ("a", "b"))
    profile = [ShapeRange("a", (1, 4), (8, 4), (16, 4)), ShapeRange("b", (1, 4), (8, 4), (16, 4))]
    built = build_engine(trt, onnx_path, [profile], 512 * 2**20, b"old-cache", optimization_level=5, expected_inputs=["a", "b"])

    assert trt._recorded("IBuilder.create_network") == [(1 << 1,)], "strongly typed: the graph's dtypes decide the precision"
    assert trt._recorded("OnnxParser.parse_from_file") == [(str(onnx_path),)], "from the file, so external weights resolve"
    assert trt._recorded("IBuilderConfig.set_memory_pool_limit") == [(0, 512 * 2**20)]  # MemoryPoolType.WORKSPACE
    assert trt._recorded("IBuilderConfig.builder_optimization_level=") == [(5,)]
    assert trt._recorded("IOptimizationProfile.set_shape") == [("a", (1, 4), (8, 4), (16, 4)), ("b", (1, 4), (8, 4), (16, 4))]
    assert trt._recorded("IBuilderConfig.add_optimization_profile") == [(0,)]
    assert trt._recorded("IBuilderConfig.create_timing_cache") == [(b"old-cache",)]
    assert [args[1] for args in trt._recorded("IBuilderConfig.set_timing_cache")] == [False], "a mismatched cache is not used"
    assert trt._recorded("IBuilderConfig.set_flag") == [], "no weak-typing precision flags (removed in TensorRT 11)"
    order = trt._called()
    assert order.index("IBuilderConfig.set_timing_cache") < order.index("IBuilder.build_serialized_network")
    assert built.plan == b"standin-plan" and built.timing_cache == b"old-cache[entry]"
    assert built.inputs == ["a", "b"] and built.outputs == ["output__0", "output__1"]
    assert network_flags(trt) == 2


def test_parser_rejection_quotes_the_parser(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(BackendError, match="ONNX parser rejected model.onnx: ModelImporter"):
        build_engine(StandinTensorRT(), bad, [], 2**20)


def test_failed_build_quotes_tensorrts_log(tmp_path):
    onnx_path = _tiny_onnx(tmp_path / "model.onnx")
    with pytest.raises(BackendError, match="could not build an engine from model.onnx: .*out of memory"):
        build_engine(StandinTensorRT(build_fails=True), onnx_path, [[ShapeRange("x", (1, 4), (1, 4), (2, 4))]], 2**20)


def test_graph_inputs_must_match_the_signature(tmp_path):
    onnx_path = _tiny_onnx(tmp_path / "model.onnx", ("x",))
    with pytest.raises(BackendError, match=r"inputs \['x'\], the signature expects \['image'\]"):
        build_engine(StandinTensorRT(), onnx_path, [], 2**20, expected_inputs=["image"])


@pytest.mark.slow
def test_backend_build_writes_the_plan_metadata_and_reuses_the_timing_cache(tmp_path, monkeypatch):
    from optimizer.model.reference import resolve_signature
    from optimizer.model.source import load_model

    trt = StandinTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    model = load_model("optimizer.examples.cnn:build")
    sig = resolve_signature(model)
    backend = TensorRTBackend(cache_dir=str(tmp_path / "cache"), workspace_mb=1024)
    art = backend.build(model, sig, tmp_path / "first", (1, 16), "cuda")

    assert art.files == ["model.plan"] and art.path.read_bytes() == b"standin-plan"
    meta = art.metadata
    assert meta["tensorrt"] == "11.4.0.106" and meta["precision"] == "fp32" and meta["engine_max_batch"] == 16
    assert meta["profiles"] == [[{"name": "image", "min": [1, 3, 64, 64], "opt": [16, 3, 64, 64], "max": [16, 3, 64, 64]}]]
    assert "compute_capability" in meta and meta["timing_cache_reused"] is False
    assert trt._recorded("IBuilderConfig.set_memory_pool_limit") == [(0, 1024 * 2**20)]
    cache = Path(meta["timing_cache"])
    assert cache == timing_cache_file(tmp_path / "cache", "11.4.0.106", meta["compute_capability"]) and cache.read_bytes() == b"[entry]"

    # the next build starts from the persisted cache, and eager's knee sets the optimal batch
    second = backend.for_run("fp16").with_batch_hint(4).build(model, sig, tmp_path / "second", (1, 16), "cuda")
    assert trt._recorded("IBuilderConfig.create_timing_cache")[-1] == (b"[entry]",)
    assert second.metadata["timing_cache_reused"] is True and cache.read_bytes() == b"[entry][entry]"
    assert second.metadata["profiles"][0][0]["opt"] == [4, 3, 64, 64] and "eager" in second.metadata["opt_batch_rule"]
    import onnx

    graph = onnx.load(str(tmp_path / "second" / "onnx" / "model.onnx"))
    assert {onnx.TensorProto.DataType.Name(i.data_type) for i in graph.graph.initializer} == {"FLOAT16"}, "fp16 lives in the graph"
    assert trt._recorded("IBuilderConfig.set_flag") == []


# -- availability ------------------------------------------------------------------------------

def _real_import_error() -> str | None:
    try:
        import tensorrt  # noqa: F401
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


@pytest.mark.skipif(_real_import_error() is None, reason="tensorrt imports on this machine")
def test_availability_reports_the_real_import_error():
    err = _real_import_error()
    assert TensorRTBackend().availability("cuda").reason == f"tensorrt cannot be imported: {err}"
    assert err in TensorRTBackend().availability("cpu").reason and "runs on cuda only" in TensorRTBackend().availability("cpu").reason
    r = CliRunner().invoke(main, ["backends", "--json", "--device", "cuda"])
    row = {row["name"]: row for row in json.loads(r.output)["backends"]}["tensorrt"]
    assert row["available"] is False and err in row["reason"]


def test_availability_gates_on_version_and_builder(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", StandinTensorRT(version="8.6.1"))
    assert "TensorRT 8.6.1 is too old" in tensorrt_status().reason
    nullptr = TypeError("pybind11::init(): factory function returned nullptr")
    monkeypatch.setitem(sys.modules, "tensorrt", StandinTensorRT(builder_error=nullptr))
    status = tensorrt_status()
    assert not status and "builder cannot be created" in status.reason and "factory function returned nullptr" in status.reason
    monkeypatch.setitem(sys.modules, "tensorrt", StandinTensorRT())
    assert tensorrt_status() and tensorrt_status().reason == "TensorRT 11.4.0.106"
    assert not TensorRTBackend(precision="fp16").availability("cpu")
