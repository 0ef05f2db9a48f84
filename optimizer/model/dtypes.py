"""The one dtype table of the project: torch <-> numpy <-> ONNX <-> Triton.

Every other module converts through these functions so that a dtype has one spelling per
framework and the mappings cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from optimizer.errors import SignatureError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    """One element type as every framework spells it."""

    name: str  # canonical: the numpy name ("float32")
    torch_name: str  # attribute of the torch module ("float32")
    onnx_elem_type: int  # onnx.TensorProto enum value
    triton: str  # model config enum ("TYPE_FP32")
    triton_wire: str  # HTTP/gRPC datatype ("FP32")
    is_float: bool

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype (bfloat16 has none: it raises SignatureError)."""
        if self.name == "bfloat16":
            raise SignatureError("bfloat16 has no numpy dtype; use float32 samples and --precision bf16 instead.")
        return np.dtype(self.name)

    @property
    def itemsize(self) -> int:
        """Bytes per element (bfloat16, which has no numpy dtype, is 2)."""
        return 2 if self.name == "bfloat16" else self.numpy.itemsize


_ROWS = (
    # name       torch       onnx triton        wire    float
    ("float32", "float32", 1, "TYPE_FP32", "FP32", True),
    ("float16", "float16", 10, "TYPE_FP16", "FP16", True),
    ("bfloat16", "bfloat16", 16, "TYPE_BF16", "BF16", True),
    ("float64", "float64", 11, "TYPE_FP64", "FP64", True),
    ("int64", "int64", 7, "TYPE_INT64", "INT64", False),
    ("int32", "int32", 6, "TYPE_INT32", "INT32", False),
    ("int16", "int16", 5, "TYPE_INT16", "INT16", False),
    ("int8", "int8", 3, "TYPE_INT8", "INT8", False),
    ("uint8", "uint8", 2, "TYPE_UINT8", "UINT8", False),
    ("bool", "bool", 9, "TYPE_BOOL", "BOOL", False),
)

DTYPES: MappingProxyType[str, DType] = MappingProxyType({r[0]: DType(*r) for r in _ROWS})

_ALIASES = MappingProxyType(
    {
        "fp32": "float32", "float": "float32", "f32": "float32",
        "fp16": "float16", "half": "float16", "f16": "float16",
        "bf16": "bfloat16",
        "fp64": "float64", "double": "float64", "f64": "float64",
        "long": "int64", "i64": "int64",
        "int": "int32", "i32": "int32",
        "short": "int16", "i16": "int16",
        "i8": "int8", "u8": "uint8",
        "boolean": "bool",
    }
)


def dtype_from_name(name: str) -> DType:
    """Parse a user-given dtype name ("float32", "fp16", "int64", "TYPE_FP32", "FP32")."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in DTYPES:
        return DTYPES[key]
    for dt in DTYPES.values():
        if name.strip().upper() in (dt.triton, dt.triton_wire):
            return dt
    raise SignatureError(
        f"unknown dtype {name!r}; use one of: {', '.join(DTYPES)} (aliases: {', '.join(sorted(_ALIASES))})."
    )


def dtype_from_numpy(dtype: Any) -> DType:
    """The table row of a numpy dtype."""
    key = np.dtype(dtype).name
    if key not in DTYPES:
        raise SignatureError(f"numpy dtype {key!r} is not supported; use one of: {', '.join(DTYPES)}.")
    return DTYPES[key]


def dtype_from_torch(dtype: torch.dtype) -> DType:
    """The table row of a torch dtype."""
    key = str(dtype).removeprefix("torch.")
    if key not in DTYPES:
        raise SignatureError(f"torch dtype {key!r} is not supported; use one of: {', '.join(DTYPES)}.")
    return DTYPES[key]


def dtype_from_onnx(elem_type: int) -> DType:
    """The table row of an onnx.TensorProto element type."""
    for dt in DTYPES.values():
        if dt.onnx_elem_type == elem_type:
            return dt
    raise SignatureError(f"ONNX element type {elem_type} is not supported; use one of: {', '.join(DTYPES)}.")


def torch_from_dtype(dt: DType) -> torch.dtype:
    """The torch dtype of a table row (imports torch)."""
    import torch

    return getattr(torch, dt.torch_name)


def triton_dtype_from_torch(dtype: torch.dtype) -> str:
    """Triton's config enum name ("TYPE_FP32") for a torch dtype."""
    return dtype_from_torch(dtype).triton


def triton_dtype_from_numpy(dtype: Any) -> str:
    """Triton's config enum name for a numpy dtype."""
    return dtype_from_numpy(dtype).triton


def triton_itemsize(triton: str) -> int:
    """Bytes per element of a Triton config type ("TYPE_FP32" -> 4); 0 for TYPE_STRING (no fixed size) or an unknown type."""
    for dt in DTYPES.values():
        if triton == dt.triton:
            return dt.itemsize
    if triton.startswith("TYPE_UINT"):  # Triton's wider unsigned types: never exported, but a config may name them
        return np.dtype(triton.removeprefix("TYPE_").lower()).itemsize
    return 0
