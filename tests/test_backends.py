"""Each backend builds an artifact, loads it in its own runtime and matches eager PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimizer.backend import BACKENDS, backend_named
from optimizer.errors import BackendError
from optimizer.model.reference import resolve_signature, run_reference
from optimizer.model.samples import ShapePoint, generate_feed
from optimizer.model.signature import Signature, parse_input_spec
from optimizer.model.source import load_model
from optimizer.records.correctness import Tolerance
from optimizer.task.correctness import compare_outputs

pytestmark = pytest.mark.slow

# torch-aoti (a slow compile per build) and openvino (CPU-dependent precision) have their own module: test_cpu_backends.py
PUBLISHED = [n for n, cls in BACKENDS.items() if cls.publishable and "cpu" in cls.devices and n not in ("torch-aoti", "openvino")]


def _check(backend_name: str, spec: str, points: list[ShapePoint], tmp_path: Path, **sig_kwargs):
    model = load_model(spec)
    sig = resolve_signature(model, **sig_kwargs)
    backend = backend_named(backend_name)
    assert backend.availability("cpu"), backend.availability("cpu").reason
    artifact = backend.build(model, sig, tmp_path / backend_name, (1, 16), "cpu")
    assert artifact.path.exists() and artifact.path.name == backend.model_filename
    with backend.load(artifact, "cpu", model) as runner:
        for i, point in enumerate(points):
            feed = generate_feed(sig, point, seed=i)
            outs = runner.infer(feed)
            ref = run_reference(model, sig.input_names, feed)
            case = compare_outputs(point.label, sig.output_names, [o.dtype.name for o in sig.outputs], outs, ref)
            assert case.passed, case.outputs
    return artifact


@pytest.mark.parametrize("backend_name", PUBLISHED)
def test_cnn_matches_eager_at_two_batch_sizes(backend_name, tmp_path):
    _check(backend_name, "optimizer.examples.cnn:build", [ShapePoint(1, "max"), ShapePoint(5, "max")], tmp_path)


@pytest.mark.parametrize("backend_name", PUBLISHED)
def test_transformer_matches_eager_at_sequence_1_and_128(backend_name, tmp_path):
    art = _check(
        backend_name,
        "optimizer.examples.transformer:build",
        [ShapePoint(1, "min"), ShapePoint(3, "max"), ShapePoint(2, "min"), ShapePoint(1, "max")],
        tmp_path,
        input_specs=[parse_input_spec("input_ids:int64:1-128")],
        value_ranges={"input_ids": (0, 999)},
    )
    assert Signature.from_json(art.signature).inputs[0].triton_dims == [-1]


def test_onnx_export_is_opset_18_or_newer_with_dynamic_axes(tmp_path):
    import onnx

    art = _check("onnxruntime", "optimizer.examples.transformer:build", [ShapePoint(2, "max")], tmp_path,
                 input_specs=[parse_input_spec("input_ids:int64:1-128")], value_ranges={"input_ids": (0, 999)})
    proto = onnx.load(str(art.path), load_external_data=False)
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 18
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert all(d.dim_param and not d.HasField("dim_value") for d in dims), "batch and sequence must both stay dynamic"
    assert art.files == ["model.onnx"], "small models are written as one file"


def test_torchscript_refuses_output_names_libtorch_cannot_serve(tmp_path):
    model = load_model("optimizer.examples.cnn:build")
    sig = resolve_signature(model, output_names=["logits"])
    with pytest.raises(BackendError, match=r"<name>__<index>.*--output-names logits__0"):
        backend_named("torchscript").build(model, sig, tmp_path, (1, 4), "cpu")


def test_torchscript_saves_nested_and_dict_outputs_flat_as_libtorch_serves_them(tmp_path):
    """Triton's libtorch backend takes a tensor or a flat tuple of tensors: an LSTM's `out, (h, c)` or a dict saved into
    model.pt as returned would fail every served request, so model.pt returns them flat, in order."""
    import torch

    model = load_model("tests.fixtures.models:nested_outputs")
    sig = resolve_signature(model)
    art = backend_named("torchscript").build(model, sig, tmp_path, (1, 4), "cpu")
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    outs = torch.jit.load(str(tmp_path / "model.pt"))(x)
    assert isinstance(outs, tuple) and all(isinstance(o, torch.Tensor) for o in outs)
    assert [o.tolist() for o in outs] == [(x + 1).tolist(), (x * 2).tolist(), (x * 3).tolist(), (x - 1).tolist()]
    assert len(sig.output_names) == 4 and art.files == ["model.pt"]


def test_an_onnx_export_failure_names_its_cause_without_terminal_colours():
    from optimizer.backend.onnx_export import exporter_cause

    message = ("Failed to export the model with torch.export. \x1b[96mThis is step 1/3\x1b[0m of exporting the model to ONNX. "
               "Next steps:\n- Modify the model code.\n\n## Exception summary\n\n<class 'torch._dynamo.exc.UserError'>: "
               "Dynamic control flow is not supported at the moment.\n\n(Refer to the full stack trace above.)")
    cause = exporter_cause(message)
    assert cause == ("Failed to export the model with torch.export: <class 'torch._dynamo.exc.UserError'>: "
                     "Dynamic control flow is not supported at the moment.")
    assert exporter_cause("\x1b[31mplain failure\x1b[0m\nmore") == "plain failure"


def test_runner_checks_the_feed_before_running(tmp_path):
    model = load_model("optimizer.examples.cnn:build")
    sig = resolve_signature(model)
    backend = backend_named("onnxruntime")
    art = backend.build(model, sig, tmp_path, (1, 4), "cpu")
    with backend.load(art, "cpu") as runner:
        with pytest.raises(BackendError, match="expects float32 of rank 4"):
            runner.infer({"image": np.zeros((1, 3, 64, 64), np.float64)})
    with pytest.raises(BackendError, match="not active"):
        runner.infer(generate_feed(sig, ShapePoint(1, "max")))


def test_backend_settings_are_checked():
    with pytest.raises(BackendError, match="has no setting"):
        backend_named("onnxruntime", threads=3)
    assert backend_named("onnxruntime").cache_key() != backend_named("onnxruntime", graph_level="basic").cache_key()


def test_outputs_smaller_than_the_tolerance_are_judged_against_their_own_scale():
    # a randomly initialised mobilenet_v3_small answers around 1e-11: under fp32's atol 1e-4 any answer that size passed
    rng = np.random.default_rng(0)
    tiny = rng.standard_normal((2, 10)) * 1e-11
    garbage = compare_outputs("batch=2", ["output__0"], ["float32"], [rng.standard_normal((2, 10)) * 1e-11], [tiny])
    assert not garbage.passed and "every reference value is below atol 0.0001" in garbage.outputs[0].note
    reordered = compare_outputs("batch=2", ["output__0"], ["float32"], [tiny * (1 + 1e-6)], [tiny])
    assert reordered.passed  # fp32 reordering moves a value by about 1e-6 of itself
    ordinary = compare_outputs("batch=2", ["output__0"], ["float32"], [tiny * 1e10 + 5e-5], [tiny * 1e10])
    assert ordinary.passed  # outputs above atol: atol and rtol alone decide, as before
    loosened = compare_outputs("batch=2", ["output__0"], ["float32"], [rng.standard_normal((2, 10)) * 1e-11], [tiny], {"": Tolerance(1e-4, 1e-4)})
    assert loosened.passed  # the user's own --tolerance (even the default's value) is theirs: not second-guessed
