"""Every kind of MODEL source loads, and every bad one fails with one actionable line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from optimizer.errors import ModelLoadError, SignatureError
from optimizer.model.reference import resolve_signature, run_reference
from optimizer.model.signature import parse_input_spec
from optimizer.model.source import default_model_name, load_model

FIX = "tests.fixtures.models"


def test_default_is_the_bundled_cnn():
    m = load_model(None)
    assert m.name == "cnn" and m.forward_names == ["image"]
    sig = resolve_signature(m)
    assert sig.inputs[0].dtype.name == "float32" and sig.inputs[0].triton_dims == [3, 64, 64]
    assert sig.output_names == ["output__0"] and sig.outputs[0].triton_dims == [10]


def test_package_module_callable_with_two_outputs():
    m = load_model(f"{FIX}:two_inputs")
    sig = resolve_signature(m)
    assert sig.input_names == ["a", "b"]
    assert sig.output_names == ["output__0", "output__1"]
    assert sig.outputs[1].triton_dims == [] and sig.outputs[0].triton_dims == [8]


def test_file_py_callable(tmp_path: Path):
    src = tmp_path / "my_model.py"
    src.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, tokens):\n        return tokens.float().sum(1, keepdim=True)\n"
                   "def make():\n    return M(), (torch.ones(1, 5, dtype=torch.int32),)\n")
    m = load_model(f"{src}:make")
    assert m.name == "my_model" and m.forward_names == ["tokens"]
    sig = resolve_signature(m)
    assert sig.inputs[0].dtype.name == "int32"


def test_generic_factory_names_take_the_module_name():
    assert default_model_name("optimizer.examples.cnn:build") == "cnn"
    assert default_model_name("models/resnet.py:create_model") == "resnet"
    assert default_model_name("pkg.mod:ResNet50") == "ResNet50"
    assert default_model_name("/x/y/bert base.onnx") == "bert_base"


def test_torchscript_archive_needs_specs(tmp_path: Path):
    from tests.fixtures.models import TinyMLP

    path = tmp_path / "mlp.pt"
    torch.jit.script(TinyMLP()).save(str(path))
    m = load_model(str(path))
    assert m.forward_names == ["x"] and m.name == "mlp"
    with pytest.raises(SignatureError, match=r"--input x:DTYPE:DIMS"):
        resolve_signature(m)
    sig = resolve_signature(m, [parse_input_spec("x:float32:16")])
    assert sig.outputs[0].triton_dims == [4]


def test_exported_program(tmp_path: Path):
    from tests.fixtures.models import TinyMLP

    ep = torch.export.export(TinyMLP().eval(), (torch.randn(2, 16),), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    path = tmp_path / "mlp.pt2"
    torch.export.save(ep, str(path))
    m = load_model(str(path))
    sig = resolve_signature(m)
    assert sig.input_names == ["x"] and sig.inputs[0].triton_dims == [16]


def test_exported_program_with_a_fixed_batch_says_how_to_export_it(tmp_path: Path):
    from tests.fixtures.models import TinyMLP

    path = tmp_path / "static.pt2"
    torch.export.save(torch.export.export(TinyMLP().eval(), (torch.randn(2, 16),)), str(path))
    with pytest.raises(SignatureError, match=r"fixes the batch axis of 'x' to 2.*Dim\('batch'\)"):
        resolve_signature(load_model(str(path)))


def test_onnx_file_keeps_graph_names(tmp_path: Path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x], [y],
                          [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "double.onnx")
    m = load_model(str(tmp_path / "double.onnx"))
    assert m.format == "onnx" and m.forward_names == ["x"]
    sig = resolve_signature(m)
    assert sig.output_names == ["y"]
    out = run_reference(m, ["x"], {"x": np.ones((2, 3), np.float32)})
    assert np.array_equal(out[0], np.full((2, 3), 2.0, np.float32))


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("missing/model.onnx", "does not exist"),
        ("missing.pt", "does not exist"),
        ("no/such/file.py:build", "does not exist"),
        ("tests.fixtures.models:nope", "has no attribute 'nope'"),
        ("no_such_package.models:build", "cannot import module"),
        ("tests.fixtures.models:raises", "raised RuntimeError: weights not found"),
        ("tests.fixtures.models:not_a_module", "returned dict, not a torch.nn.Module"),
        ("tests.fixtures.models:NOT_CALLABLE", "not a callable"),
        ("just_words", "neither a file nor"),
        ("tests.fixtures.models:", "empty part"),
    ],
)
def test_bad_model_sources(spec, fragment):
    with pytest.raises(ModelLoadError) as err:
        load_model(spec)
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message


def test_state_dict_is_not_torchscript(tmp_path: Path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(ModelLoadError, match="not a TorchScript archive"):
        load_model(str(path))
