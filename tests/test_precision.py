"""--precision: a precision a device or backend cannot build is refused with a reason (never run as fp32 under
another label), put into the exported graph for the GPU engines, and judged at the precision's tolerance."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from optimizer.backend import BACKENDS, backend_named
from optimizer.backend.precision import check_precision, reduced_precision_module
from optimizer.errors import BackendError, SettingsError
from optimizer.model.signature import Signature
from optimizer.records.correctness import Tolerance
from optimizer.task.correctness import precision_tolerances
from optimizer.tune_strategy import default_backends
from optimizer.tune_strategy.max_throughput_strategy import MaxThroughputStrategy
from tests.conftest import run_cli, tree_snapshot


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp16"], "--precision fp16 needs --device cuda: CPU candidates compute in fp32, bf16, int8"),
    (["--precision", "int8"], "--precision int8 needs real inputs to calibrate on"),
])
def test_a_precision_the_cpu_run_cannot_build_is_a_usage_error(args, message, in_tmp: Path):
    before = tree_snapshot(in_tmp)
    r = run_cli("export", *args, cwd=in_tmp)
    assert r.returncode == 2, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0]
    assert tree_snapshot(in_tmp) == before


def test_precision_check_before_any_work():
    check_precision("fp32", "cpu")
    check_precision("bf16", "cpu")
    check_precision("auto", "cpu", real_samples=False)
    check_precision("int8", "cpu", real_samples=True)
    check_precision("bf16", "cuda:1")
    with pytest.raises(SettingsError, match="'fp8' is not one of auto, fp32, fp16, bf16, int8"):
        check_precision("fp8", "cuda")
    with pytest.raises(SettingsError, match="--precision int8 is built for the CPU only"):
        check_precision("int8", "cuda", real_samples=True)
    with pytest.raises(SettingsError, match="give --samples FILE.npz or --calibration-samples FILE.npz"):
        check_precision("int8", "cpu", real_samples=False)


@pytest.mark.parametrize("name", [n for n, cls in BACKENDS.items() if "cpu" in cls.devices])
def test_every_cpu_backend_refuses_a_precision_it_cannot_build_with_a_reason(name):
    assert backend_named(name).availability("cpu", quick=True), "fp32 stays available"
    builds = BACKENDS[name].precisions.get("cpu", frozenset({"fp32"}))
    for precision in ("fp16", "bf16", "int8"):
        if precision in builds:
            continue
        av = backend_named(name, precision=precision).availability("cpu", quick=True)
        assert not av and f"not --precision {precision}" in av.reason and "builds fp32" in av.reason


def test_the_cpu_backends_that_build_each_reduced_precision():
    cpu = {n: set(cls.precisions.get("cpu", ())) for n, cls in BACKENDS.items() if "cpu" in cls.devices}
    assert {n for n, p in cpu.items() if "bf16" in p} == {"openvino", "torchscript", "torch-aoti"}
    assert {n for n, p in cpu.items() if "int8" in p} == {"openvino", "onnxruntime"}


def test_a_gpu_backend_names_the_precisions_it_builds():
    av = backend_named("onnxruntime-trt", precision="bf16").availability("cuda")
    assert not av and "builds fp32, fp16 only" in av.reason


def test_the_strategy_applies_the_runs_precision_and_records_the_refusal(tmp_path):
    from optimizer.model.reference import resolve_signature
    from optimizer.model.source import load_model
    from optimizer.task.context import TuneContext

    model = load_model("optimizer.examples.cnn:build")
    ctx = TuneContext(model=model, signature=resolve_signature(model), reference=None, workdir=tmp_path, device="cpu", precision="fp16")  # type: ignore[arg-type]
    strategy = MaxThroughputStrategy(backends=["onnxruntime", "torchscript"], eager_gate="disabled")
    result = strategy.tune(ctx)
    assert result.selected is None
    for cand in result.candidates:
        assert cand.status == "unavailable" and "not --precision fp16" in cand.reason and cand.artifact is None


def test_for_run_keeps_the_other_settings():
    b = backend_named("onnxruntime", graph_level="basic")
    assert b.for_run("fp32") is b
    fp16 = b.for_run("fp16")
    assert fp16.settings == {**b.settings, "precision": "fp16"} and b.settings["precision"] == "fp32"
    assert fp16.cache_key() != b.cache_key()


def test_reduced_precision_tolerances_apply_to_float_outputs_only():
    sig = Signature.from_json({"batching": True, "inputs": [{"name": "x", "dtype": "float32", "dims": ["4"], "value_range": None}],
                               "outputs": [{"name": "logits", "dtype": "float32", "dims": ["2"], "value_range": None},
                                           {"name": "label", "dtype": "int64", "dims": ["1"], "value_range": None}]})
    assert precision_tolerances(sig, "fp32") == {}
    assert precision_tolerances(sig, "fp16") == {"logits": Tolerance(1e-2, 1e-2)}
    assert precision_tolerances(sig, "bf16") == {"logits": Tolerance(5e-2, 5e-2)}
    assert precision_tolerances(sig, "fp16", {"logits": Tolerance(1e-3, 0)}) == {"logits": Tolerance(1e-3, 0)}
    assert precision_tolerances(sig, "fp16", {"": Tolerance(0.5, 0)}) == {"": Tolerance(0.5, 0)}, "the user's default wins"


def test_the_precision_wrapper_keeps_a_float32_interface_and_the_original_module():
    import torch

    from optimizer.model.source import load_model

    module = load_model("optimizer.examples.transformer:build").inner_module
    wrapped = reduced_precision_module(module, "fp16")
    assert reduced_precision_module(module, "fp32") is module
    assert next(module.parameters()).dtype == torch.float32, "the user's module is not converted"
    assert {p.dtype for p in wrapped.parameters()} == {torch.float16}
    ids = torch.randint(0, 999, (2, 16))
    with torch.inference_mode():
        out = wrapped(ids)
        ref = module(ids)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert 0 < float((out - ref).abs().max()) < 1e-2, "it really computes in fp16, and stays close"


def test_the_precision_wrapper_returns_each_output_in_the_signatures_dtype():
    """A float64 model's bf16 candidate must still return float64: its config declares TYPE_FP64, and Triton refuses an
    output whose dtype differs from the config's. Integer outputs pass untouched."""
    import torch

    class Float64Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 3).double()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.lin(x)
            return y, y.argmax(-1)

    wrapped = reduced_precision_module(Float64Model(), "bf16", ["float64", "int64"])
    x = torch.randn(2, 4, dtype=torch.float64)
    with torch.inference_mode():
        y, label = wrapped(x)
    assert y.dtype == torch.float64 and label.dtype == torch.int64
    assert reduced_precision_module(Float64Model(), "bf16")(x)[0].dtype == torch.float32  # no signature: float32, as before


def test_an_onnx_source_cannot_be_converted(tmp_path):
    from optimizer.backend.onnx_export import export_onnx
    from optimizer.model.source import load_model
    from tests.test_gpu_config import _tiny_onnx

    _tiny_onnx(tmp_path / "src" / "model.onnx")
    model = load_model(str(tmp_path / "src" / "model.onnx"))
    with pytest.raises(BackendError, match="--precision fp16 is built into the graph from the PyTorch module"):
        export_onnx(model, None, tmp_path / "out" / "model.onnx", 4, precision="fp16")  # type: ignore[arg-type]


@pytest.mark.slow
def test_fp16_graph_has_fp16_weights_float32_io_and_matches_at_fp16_tolerance(tmp_path):
    import onnx
    import onnxruntime as ort

    from optimizer.backend.onnx_export import export_onnx
    from optimizer.model.reference import resolve_signature, run_reference
    from optimizer.model.samples import ShapePoint, generate_feed
    from optimizer.model.source import load_model
    from optimizer.task.correctness import compare_outputs

    model = load_model("optimizer.examples.cnn:build")
    sig = resolve_signature(model)
    path = tmp_path / "model.onnx"
    meta = export_onnx(model, sig, path, 8, precision="fp16")
    proto = onnx.load(str(path))
    assert meta["precision"] == "fp16"
    assert {onnx.TensorProto.DataType.Name(i.data_type) for i in proto.graph.initializer} == {"FLOAT16"}
    assert [v.type.tensor_type.elem_type for v in [*proto.graph.input, *proto.graph.output]] == [onnx.TensorProto.FLOAT] * 2
    feed = generate_feed(sig, ShapePoint(3, "max"), seed=4)
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    ref = run_reference(model, sig.input_names, feed)
    assert float(np.abs(out[0] - ref[0]).max()) > 0, "the graph computes in fp16, not fp32"
    tolerances = precision_tolerances(sig, "fp16")
    assert compare_outputs("b3", sig.output_names, ["float32"], out, ref, tolerances).passed
    assert not compare_outputs("b3", sig.output_names, ["float32"], out, ref).passed, "fp32 tolerances would reject it"


@pytest.mark.slow
def test_bf16_graph_is_valid_onnx(tmp_path):
    import onnx

    from optimizer.backend.onnx_export import BF16_MIN_OPSET, export_onnx
    from optimizer.model.reference import resolve_signature
    from optimizer.model.source import load_model

    model = load_model("optimizer.examples.cnn:build")
    path = tmp_path / "model.onnx"
    export_onnx(model, resolve_signature(model), path, 8, precision="bf16")
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path))
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= BF16_MIN_OPSET
    assert {onnx.TensorProto.DataType.Name(i.data_type) for i in proto.graph.initializer} == {"BFLOAT16"}


def test_gpu_defaults_put_the_engines_first_and_follow_the_device():
    assert default_backends.aot(False, "cuda:1")[:2] == ["tensorrt", "onnxruntime-trt"]
    assert default_backends.aot(False, "cuda")[2:] == default_backends.aot(False, "cpu") == list(default_backends.AOT)
    assert default_backends.aot(True, "cuda") == list(default_backends.AOT_DISTRIBUTED)
    strategy = MaxThroughputStrategy()

    def names(device: str) -> list[str]:
        return [b.name for b in strategy._candidate_backends(SimpleNamespace(model=SimpleNamespace(module=None), device=device))]

    assert names("cuda:0")[:2] == ["tensorrt", "onnxruntime-trt"]
    assert "tensorrt" not in names("cpu"), "a reused strategy drops GPU engines on the CPU"
    assert names("cuda")[:2] == ["tensorrt", "onnxruntime-trt"]
