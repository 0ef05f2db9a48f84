"""Every kind of MODEL source loads, and every bad one fails with one actionable line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from optimizer.errors import ModelLoadError, SignatureError
from optimizer.model.reference import resolve_signature, run_reference
from optimizer.model.signature import parse_input_spec
from optimizer.model.loaded_model import default_model_name
from optimizer.model.source import load_model

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


HF_STYLE = """import torch
class Encoder(torch.nn.Module):
    # as Hugging Face models do: every input optional, by keyword or by position
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4)
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, return_dict=None):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1).float()
        if token_type_ids is not None:
            h = h + token_type_ids.unsqueeze(-1).float()
        return {"pooled": h.sum(1)}
ids = torch.tensor([[3, 7, 9, 1], [4, 4, 2, 0]])
mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])
def positional():
    torch.manual_seed(0)
    return Encoder(), (ids, mask)
def by_name_out_of_order():
    torch.manual_seed(0)
    return Encoder(), {"attention_mask": mask, "input_ids": ids}
def skipping():
    torch.manual_seed(0)
    return Encoder(), {"input_ids": ids, "token_type_ids": mask}
def no_examples():
    torch.manual_seed(0)
    return Encoder()
"""


@pytest.mark.parametrize("factory", ["positional", "by_name_out_of_order"])
def test_optional_forward_arguments_are_named_and_ordered_as_forward_takes_them(tmp_path: Path, factory: str):
    """Hugging Face style forward(input_ids=None, attention_mask=None, ...): examples given by position or by name in
    any order become inputs named after forward()'s arguments, in its order, and reach the right arguments."""
    src = tmp_path / "hf_style.py"
    src.write_text(HF_STYLE)
    m = load_model(f"{src}:{factory}")
    sig = resolve_signature(m)
    assert sig.input_names == ["input_ids", "attention_mask"]
    feed = {"input_ids": np.array([[5, 6, 7, 8]]), "attention_mask": np.array([[1, 0, 0, 1]])}
    got = run_reference(m, sig.input_names, feed)[0]
    with torch.no_grad():
        want = m.module(input_ids=torch.tensor(feed["input_ids"]), attention_mask=torch.tensor(feed["attention_mask"]))["pooled"]
    np.testing.assert_array_equal(got, want.numpy())


def test_optional_forward_arguments_from_input_specs_follow_forwards_order(tmp_path: Path):
    src = tmp_path / "hf_style.py"
    src.write_text(HF_STYLE)
    m = load_model(f"{src}:no_examples")
    specs = [parse_input_spec("attention_mask:int64:4"), parse_input_spec("input_ids:int64:4")]
    sig = resolve_signature(m, specs, value_ranges={"input_ids": (0, 49), "attention_mask": (0, 1)})
    assert sig.input_names == ["input_ids", "attention_mask"]
    with pytest.raises(SignatureError, match=r"the model's inputs are: \(none required\); optional: input_ids, attention_mask"):
        resolve_signature(m, [parse_input_spec("ids:int64:4")])
    with pytest.raises(SignatureError, match=r"forward\(\) takes only optional arguments \(input_ids, attention_mask, token_type_ids, "
                       r"return_dict\) and none was given; name the inputs you serve with --input, e\.g\. --input input_ids:DTYPE:DIMS"):
        resolve_signature(m)


def test_an_optional_argument_skipped_before_a_given_one_is_one_line(tmp_path: Path):
    src = tmp_path / "hf_style.py"
    src.write_text(HF_STYLE)
    with pytest.raises(SignatureError) as info:
        resolve_signature(load_model(f"{src}:skipping"))
    assert "input 'token_type_ids' comes after forward() argument 'attention_mask'" in str(info.value)
    assert "--input attention_mask:DTYPE:DIMS" in str(info.value)
    misnamed = tmp_path / "hf_misnamed.py"
    misnamed.write_text(HF_STYLE + "def misnamed():\n    return Encoder(), {'input_ids': ids, 'mask': mask}\n")
    with pytest.raises(ModelLoadError, match=r"example input 'mask', which is not a positional argument of forward\(\)"):
        load_model(f"{misnamed}:misnamed")


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


def test_a_scalar_in_a_non_batching_model_is_refused_with_the_signature():
    """Triton refuses a scalar tensor without batching; the signature shows it, so it is refused there, before any
    candidate is built and measured, not when publishing."""
    m = load_model("tests.fixtures.models:returns_scalar")
    with pytest.raises(SignatureError, match=r"tensor 'output__1' is a scalar in a non-batching model.*reshape\(1\)"):
        resolve_signature(m, batching=False)


def test_nested_outputs_record_where_each_output_comes_from():
    """A dict / ModelOutput / nested tuple is flattened into output__0, output__1, ...: the signature (report.json,
    inspect, report.md) says which part of forward()'s return value each one is, or a client cannot tell."""
    from optimizer.model.signature import Signature

    sig = resolve_signature(load_model("tests.fixtures.models:nested_outputs"))
    assert [t.origin for t in sig.outputs] == ["[0]", "[1][0]", "[1][1].a", "[1][1].b"]
    assert Signature.from_json(sig.to_json()).outputs == sig.outputs
    assert [t.origin for t in resolve_signature(load_model("tests.fixtures.models:two_inputs")).outputs] == ["", ""]
    plain = resolve_signature(load_model("tests.fixtures.models:mlp"))
    assert plain.outputs[0].origin == "" and "origin" not in plain.to_json()["outputs"][0]  # unchanged records, cache keys
