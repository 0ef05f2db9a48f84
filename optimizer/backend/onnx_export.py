"""torch -> ONNX with the dynamo exporter, dynamic axes taken from the signature (shared by ORT, OpenVINO, TensorRT)."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.backend.torch_export import dynamic_shapes_for, example_args  # shared with torch_aoti.py
from optimizer.errors import BackendError
from optimizer.model.signature import Signature

if TYPE_CHECKING:
    from optimizer.model.source import LoadedModel

log = logging.getLogger(__name__)

DEFAULT_OPSET = 20
"""Opset of torch 2.13's dynamo exporter; the dynamo exporter cannot go below 18."""

EXTERNAL_DATA_BYTES = 1_800_000_000
"""Above this many parameter bytes the weights go to model.onnx.data (protobuf's 2 GB limit)."""


def export_onnx(model: LoadedModel, signature: Signature, path: Path, batch_max: int, opset: int = DEFAULT_OPSET) -> dict[str, Any]:
    """Write `path` (and `path.data` for huge models) from a torch model or copy an ONNX source; returns metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if model.format == "onnx":
        return _copy_onnx(model, path)
    import torch

    module = model.inner_module
    args = example_args(signature)
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters()) if hasattr(module, "parameters") else 0
    external = param_bytes > EXTERNAL_DATA_BYTES
    dynamic = dynamic_shapes_for(signature, batch_max)
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
            )
    except Exception as err:
        log.debug("exporter output:\n%s", chatter.getvalue())
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BackendError(f"torch.onnx.export (dynamo) failed: {type(err).__name__}: {first}") from err
    log.debug("exporter output:\n%s", chatter.getvalue())
    files = [path.name] + ([path.name + ".data"] if (path.parent / (path.name + ".data")).exists() else [])
    return {"exporter": "torch.onnx.export(dynamo=True)", "opset": opset, "external_data": len(files) > 1, "files": files}


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
