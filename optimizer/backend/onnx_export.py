"""torch -> ONNX with the dynamo exporter, dynamic axes taken from the signature (shared by ORT, OpenVINO, TensorRT)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.backend.torch_export import dynamic_shapes_for, example_args  # shared with torch_aoti.py
from optimizer.errors import BackendError
from optimizer.model.signature import Signature

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel

log = logging.getLogger(__name__)

DEFAULT_OPSET = 20
"""Opset of torch 2.13's dynamo exporter; the dynamo exporter cannot go below 18."""

BF16_MIN_OPSET = 22
"""Opset 22 is the first that allows bfloat16 in Conv, Gemm and most other compute operators."""

EXTERNAL_DATA_BYTES = 1_800_000_000
"""Above this many parameter bytes the weights go to model.onnx.data (protobuf's 2 GB limit)."""


def export_onnx(model: LoadedModel, signature: Signature, path: Path, batch_max: int, opset: int = DEFAULT_OPSET,
                precision: str = "fp32") -> dict[str, Any]:
    """Write `path` (and `path.data` for huge models) from a torch model or copy an ONNX source; returns metadata.

    A reduced `precision` ("fp16", "bf16") is put into the graph itself (weights and math in that dtype,
    float32 inputs and outputs; see backend/precision.py), which only a PyTorch source allows.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if model.format == "onnx":
        if precision != "fp32":
            raise BackendError(
                f"--precision {precision} is built into the graph from the PyTorch module, and this model is an ONNX file; "
                "export from the PyTorch model, or use --precision fp32."
            )
        return _copy_onnx(model, path)
    import torch

    from optimizer.backend.precision import reduced_precision_module

    module = reduced_precision_module(model.inner_module, precision, [t.dtype.torch_name for t in signature.outputs])
    args = example_args(signature)
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters()) if hasattr(module, "parameters") else 0
    external = param_bytes > EXTERNAL_DATA_BYTES
    dynamic: Any = dynamic_shapes_for(signature, batch_max)
    if module is not model.inner_module:  # torch.export sees the precision wrapper's forward(*args) as one argument
        dynamic = (tuple(dynamic[n] for n in signature.input_names),)
    if precision == "bf16":
        opset = max(opset, BF16_MIN_OPSET)
    chatter = io.StringIO()  # the exporter prints progress lines to stdout; keep them for the log
    try:
        with contextlib.redirect_stdout(chatter):
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=True,
                external_data=external,
                opset_version=opset,
                input_names=signature.input_names,
                output_names=signature.output_names,
                dynamic_shapes=dynamic,
                # onnxscript's graph optimizer folds BatchNorm into bf16 convolutions as float32 weights (an
                # invalid graph); TensorRT and ONNX Runtime fold and fuse on their own, so reduced-precision
                # graphs are exported as traced
                optimize=precision == "fp32",
            )
    except Exception as err:
        log.debug("exporter output:\n%s", chatter.getvalue())
        raise BackendError(f"torch.onnx.export (dynamo) failed: {type(err).__name__}: {exporter_cause(str(err))}") from err
    log.debug("exporter output:\n%s", chatter.getvalue())
    _check_dynamic_axes(path, signature)
    if precision != "fp32":
        _check_graph(path, precision)
    files = [path.name] + ([path.name + ".data"] if (path.parent / (path.name + ".data")).exists() else [])
    return {"exporter": "torch.onnx.export(dynamo=True)", "opset": opset, "external_data": len(files) > 1, "files": files,
            "precision": precision}


def _check_dynamic_axes(path: Path, signature: Signature) -> None:
    """Every axis the signature observed varying is variable in the graph. torch.onnx.export (dynamo) can keep an input
    axis dynamic and still bake its traced length into the computation (an nn.LSTM/nn.GRU over the sequence axis):
    the graph then fails at any other length with an opaque Reshape error; say which axis instead."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    offset = 1 if signature.batching else 0
    declared = {v.name: v.type.tensor_type.shape.dim for v in [*graph.input, *graph.output]}
    for spec in (*signature.inputs, *signature.outputs):
        dims = declared.get(spec.name)
        for i in spec.dynamic_axes:
            if dims is not None and len(dims) > i + offset and dims[i + offset].HasField("dim_value"):
                a = spec.axes[i]
                raise BackendError(
                    f"the exported graph fixes {spec.name!r} axis {i + offset} to {dims[i + offset].dim_value}, which varies "
                    f"({a.min}-{a.max}) in the model: the exporter baked one length into the computation (an nn.LSTM or "
                    "nn.GRU over that axis does this); give that axis one size in --input to build this backend, or leave "
                    "the axis dynamic for the other backends."
                )


def _check_graph(path: Path, precision: str) -> None:
    """A reduced-precision graph must be valid ONNX (types agree everywhere), or consumers fail obscurely."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BackendError(f"the {precision} ONNX graph torch exported is not valid ONNX ({first}); use --precision fp16 or fp32.") from err


def _copy_onnx(model: LoadedModel, path: Path) -> dict[str, Any]:
    import onnx

    src = Path(model.onnx_path)
    proto = onnx.load(str(src), load_external_data=False)
    external = sorted(
        {e.value for init in proto.graph.initializer for e in init.external_data if e.key == "location"}
    )
    if external:
        # keep the weights beside the model under the names the graph refers to
        for rel in external:
            shutil.copy2(src.parent / rel, path.parent / rel)
    shutil.copy2(src, path)
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return {"exporter": "copied ONNX source", "opset": opset, "external_data": bool(external), "files": [path.name, *external]}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def exporter_cause(message: str) -> str:
    """The line of an exporter's error that names the cause, without terminal colours. torch.onnx's own first line only
    says which step failed ("Failed to export the model with torch.export. This is step 1/3 ... Next steps:"); the
    cause follows its "## Exception summary" heading."""
    lines = [line.strip() for line in _ANSI.sub("", message).splitlines() if line.strip()]
    if not lines:
        return "no message"
    after = next((i for i, line in enumerate(lines) if line.startswith("## Exception summary")), None)
    if after is not None and after + 1 < len(lines):
        return f"{lines[0].split('. ')[0]}: {lines[after + 1]}"
    return lines[0]
