"""--input / --value-range / --output-names parsing and the dtype table."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.errors import SignatureError
from optimizer.model.dtypes import DTYPES, dtype_from_name, dtype_from_numpy, dtype_from_onnx
from optimizer.model.signature import (
    Axis,
    TensorSpec,
    merge_specs,
    parse_input_spec,
    parse_output_names,
    parse_value_range,
)


def test_static_and_dynamic_dims():
    spec = parse_input_spec("image:float32:3x64x64")
    assert spec.name == "image" and spec.dtype.name == "float32"
    assert [a.triton_dim for a in spec.axes] == [3, 64, 64]
    spec = parse_input_spec("input_ids:int64:1-128")
    assert spec.axes == (Axis(1, 128),)
    assert spec.axes[0].triton_dim == -1


def test_commas_and_aliases():
    spec = parse_input_spec("x:fp16:3,224,224")
    assert spec.dtype.name == "float16" and len(spec.axes) == 3


def test_scalar_per_sample():
    assert parse_input_spec("flag:bool:").axes == ()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("image:float32", "three ':'-separated fields"),
        ("image:float33:3x64x64", "unknown dtype 'float33'"),
        ("image:float32:3xax64", "dimension 'a'"),
        ("image:float32:0x64", "invalid"),
        ("image:float32:128-1", "invalid"),
        (":float32:3", "empty name"),
        ("my-image:float32:3", "not valid for every backend"),
    ],
)
def test_malformed_input_specs_name_the_problem_and_the_fix(text, fragment):
    with pytest.raises(SignatureError, match="(?i)" + fragment.replace("(", r"\(").replace(")", r"\)")) as err:
        parse_input_spec(text)
    assert "e.g." in str(err.value) or "use" in str(err.value)


def test_value_range_and_output_names():
    assert parse_value_range("input_ids:0:999") == ("input_ids", (0.0, 999.0))
    with pytest.raises(SignatureError, match="NAME:LOW:HIGH"):
        parse_value_range("input_ids:0")
    with pytest.raises(SignatureError, match="LOW <= HIGH"):
        parse_value_range("input_ids:9:1")
    assert parse_output_names(["logits__0,probs__1"]) == ["logits__0", "probs__1"]
    with pytest.raises(SignatureError, match="repeats"):
        parse_output_names(["a", "a"])


def test_merge_rejects_unknown_input_and_wrong_rank():
    inferred = [TensorSpec("image", DTYPES["float32"], (Axis(3, 3), Axis(8, 8)))]
    with pytest.raises(SignatureError, match="model's inputs are: image"):
        merge_specs(inferred, ["image"], [parse_input_spec("img:float32:3x8")], {})
    with pytest.raises(SignatureError, match="3 per-sample dims"):
        merge_specs(inferred, ["image"], [parse_input_spec("image:float32:3x8x8")], {})
    merged = merge_specs(inferred, ["image"], [parse_input_spec("image:float32:3x4-16")], {})
    assert merged[0].axes[1] == Axis(4, 16)
    # forward(*args): no argument names, the examples' names stand in, and an unknown --input is still refused
    positional = [TensorSpec("input__0", DTYPES["float32"], (Axis(3, 3),))]
    with pytest.raises(SignatureError, match="model's inputs are: input__0"):
        merge_specs(positional, [], [parse_input_spec("x:float32:3")], {})
    assert [t.name for t in merge_specs(positional, [], [], {})] == ["input__0"]


def test_dtype_table_round_trips():
    for dt in DTYPES.values():
        assert dtype_from_name(dt.name) is dt
        assert dtype_from_name(dt.triton) is dt
        assert dtype_from_onnx(dt.onnx_elem_type) is dt
        if dt.name != "bfloat16":
            assert dtype_from_numpy(np.dtype(dt.name)) is dt


def test_dtype_table_matches_torch_and_onnx():
    import onnx
    import torch

    for dt in DTYPES.values():  # (it checked `... or dt.name == "bfloat16"`, which passed for bfloat16 whatever the table said)
        torch_dtype = getattr(torch, dt.torch_name)
        assert isinstance(torch_dtype, torch.dtype) and torch.empty(0, dtype=torch_dtype).element_size() == dt.itemsize
    bf16 = DTYPES["bfloat16"]  # numpy has no bfloat16: compare with ONNX and torch directly
    assert bf16.onnx_elem_type == onnx.TensorProto.BFLOAT16 and getattr(torch, bf16.torch_name) is torch.bfloat16
    for dt in (d for d in DTYPES.values() if d is not bf16):
        assert onnx.helper.tensor_dtype_to_np_dtype(dt.onnx_elem_type) == np.dtype(dt.name)
        assert torch.empty(0, dtype=getattr(torch, dt.torch_name)).numpy().dtype == np.dtype(dt.name)



def test_every_triton_type_has_its_byte_size():
    """the warmup rule (optimizer/triton/config/rules/warmup.py) sizes warmup files from this; TYPE_STRING has no fixed size."""
    import torch
    from tritonclient.grpc import model_config_pb2

    from optimizer.model.dtypes import triton_itemsize

    for dt in DTYPES.values():
        assert triton_itemsize(dt.triton) == dt.itemsize == torch.empty(0, dtype=getattr(torch, dt.torch_name)).element_size()
    assert [triton_itemsize(f"TYPE_UINT{n}") for n in (16, 32, 64)] == [2, 4, 8]
    assert triton_itemsize("TYPE_STRING") == triton_itemsize("TYPE_INVALID") == 0
    assert all(triton_itemsize(name) >= 0 for name in model_config_pb2.DataType.keys())

_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
_dim = st.one_of(st.integers(1, 512).map(str), st.tuples(st.integers(1, 64), st.integers(0, 64)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"))


@given(_name, st.sampled_from(sorted(DTYPES)), st.lists(_dim, max_size=4))
def test_parser_accepts_every_well_formed_spec(name, dtype, dims):
    spec = parse_input_spec(f"{name}:{dtype}:{'x'.join(dims)}")
    assert spec.name == name and spec.dtype.name == dtype and len(spec.axes) == len(dims)
    for text, axis in zip(dims, spec.axes):
        assert str(axis) == (text if "-" not in text or text.split("-")[0] != text.split("-")[1] else text.split("-")[0])


@given(st.text(max_size=30))
def test_parser_never_crashes_on_garbage(text):
    try:
        parse_input_spec(text)
    except SignatureError as err:
        assert str(err)


def test_a_bfloat16_tensor_at_the_models_boundary_is_refused_with_the_way_round_it():
    """A bf16 output would read as float32 in the signature while the published TorchScript returns bf16 where its config
    promises TYPE_FP32, and a bf16 input would get float32 samples and fail inside the model: both are refused, with
    the way round it."""
    from optimizer.model.reference import resolve_signature
    from optimizer.model.signature import parse_input_spec
    from optimizer.model.source import load_model

    with pytest.raises(SignatureError, match="returns a bfloat16 output.*return .float\\(\\).*--precision bf16"):
        resolve_signature(load_model("tests.fixtures.models:bf16_head"))
    with pytest.raises(SignatureError, match="takes bfloat16 input 'x'.*cast inside forward"):
        resolve_signature(load_model("tests.fixtures.models:mlp"), [parse_input_spec("x:bfloat16:16")])
