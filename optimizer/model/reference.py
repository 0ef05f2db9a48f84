"""The reference the candidates are checked against, and the signature it reveals.

For a PyTorch source the reference is eager PyTorch in the model's own precision; for an ONNX
source it is ONNX Runtime with graph optimizations disabled (the model as given).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from optimizer.errors import SignatureError
from optimizer.model.dtypes import dtype_from_numpy, dtype_from_onnx
from optimizer.model.samples import Feed, ShapePoint, generate_feed
from optimizer.model.signature import (
    Axis,
    InputSpec,
    Signature,
    TensorSpec,
    default_output_names,
    merge_specs,
)
from optimizer.model.loaded_model import LoadedModel

log = logging.getLogger(__name__)


def flatten_outputs(value: Any) -> list[Any]:
    """A model's return value as a flat list of tensors (tensor, tuple/list, dict, a ModelOutput, or any type registered
    with torch's pytree, as torch.export flattens it)."""
    return [t for _, t in flatten_with_paths(value)]


def flatten_with_paths(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """flatten_outputs with each tensor's place in the return value: "logits", "aux[1].norm", "[0]" ("" for a lone
    tensor), so a client of output__<i> can tell which one it reads."""
    if isinstance(value, (tuple, list)):
        return [pt for i, v in enumerate(value) for pt in flatten_with_paths(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [pt for k, v in value.items() for pt in flatten_with_paths(v, f"{path}.{k}" if path else str(k))]
    from torch.utils import _pytree

    node = _pytree.SUPPORTED_NODES.get(type(value))
    if node is not None:
        children, context = node.flatten_fn(value)
        keys = context if isinstance(context, (list, tuple)) and len(context) == len(children) and all(isinstance(k, str) for k in context) else None
        return [pt for i, v in enumerate(children)
                for pt in flatten_with_paths(v, (f"{path}.{keys[i]}" if path else keys[i]) if keys else f"{path}[{i}]")]
    return [(path, value)]


def run_reference(model: LoadedModel, signature_inputs: Sequence[str], feed: Feed, paths: list[str] | None = None) -> list[np.ndarray]:
    """Outputs of the reference for one feed, in return order, as numpy arrays; `paths`, when given, receives each
    output's place in forward()'s return value (see flatten_with_paths)."""
    if model.format == "onnx":
        return _run_onnx_reference(model, feed)
    import torch

    args = [torch.from_numpy(np.ascontiguousarray(feed[n])) for n in signature_inputs]
    with torch.inference_mode():
        try:
            result = model.module(*args)
        except Exception as err:
            shapes = ", ".join(f"{n}{list(feed[n].shape)}" for n in signature_inputs)
            raise SignatureError(
                f"the model failed on sample inputs {shapes}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}; "
                "check --input dims and dtypes (dims exclude the batch axis) and --value-range."
            ) from err
    flat = flatten_with_paths(result)
    outs = [t for _, t in flat]
    if paths is not None:
        paths[:] = [p for p, _ in flat]
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad:
        raise SignatureError(f"the model returns non-tensor outputs ({', '.join(bad)}); return tensors, a tuple or a dict of tensors.")
    if any(o.dtype == torch.bfloat16 for o in outs):
        raise SignatureError(BF16_BOUNDARY.format(what="returns a bfloat16 output", fix="return .float() from forward()"))
    return [o.detach().numpy().copy() for o in outs]


_ORT_CACHE: dict[str, Any] = {}


def _run_onnx_reference(model: LoadedModel, feed: Feed) -> list[np.ndarray]:
    import onnxruntime as ort

    key = str(model.onnx_path)
    if key not in _ORT_CACHE:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        _ORT_CACHE[key] = ort.InferenceSession(key, opts, providers=["CPUExecutionProvider"])
    return list(_ORT_CACHE[key].run(None, feed))


def inferred_inputs(model: LoadedModel, batching: bool) -> tuple[list[str], list[TensorSpec]]:
    """What the model itself says about its inputs: names, and dtypes/dims where it knows them."""
    if model.format == "onnx":
        return _onnx_inputs(model, batching)
    specs = []
    for name, arr in (model.example_inputs or {}).items():
        if batching and arr.ndim == 0:
            raise SignatureError(f"example input {name!r} is a scalar, which has no batch axis; use --no-batching.")
        ranges = (model.axis_ranges or {}).get(name) or [None] * arr.ndim
        if batching and model.axis_ranges is not None and ranges[0] is None:
            raise SignatureError(
                f"the exported program fixes the batch axis of {name!r} to {arr.shape[0]}; export it with "
                f"dynamic_shapes={{{name!r}: {{0: torch.export.Dim('batch')}}}} or use --no-batching."
            )
        axes = []
        for i, d in enumerate(arr.shape):
            if batching and i == 0:
                continue
            r = ranges[i]
            if r is not None and r[1] == 0:
                raise SignatureError(f"axis {i} of {name!r} is dynamic without an upper bound; give its range with --input {name}:DTYPE:DIMS.")
            axes.append(Axis(*r) if r is not None else Axis(d, d))
        value_range = None
        dt = dtype_from_numpy(arr.dtype)
        if not dt.is_float and arr.size and dt.name != "bool":
            value_range = (float(arr.min()), float(arr.max()))
        specs.append(TensorSpec(name, dt, tuple(axes), value_range))
    return model.forward_names, specs


def _onnx_inputs(model: LoadedModel, batching: bool) -> tuple[list[str], list[TensorSpec]]:
    import onnx

    proto = onnx.load(str(model.onnx_path), load_external_data=False)
    initializers = {i.name for i in proto.graph.initializer}
    names, specs = [], []
    for vi in proto.graph.input:
        if vi.name in initializers:
            continue
        names.append(vi.name)
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if batching:
            if not dims:
                raise SignatureError(f"ONNX input {vi.name!r} is a scalar, which has no batch axis; use --no-batching.")
            dims = dims[1:]
        if any(d is None for d in dims):
            continue  # a symbolic axis needs its range from --input
        specs.append(TensorSpec(vi.name, dtype_from_onnx(tt.elem_type), tuple(Axis(d, d) for d in dims)))
    return names, specs


BF16_BOUNDARY = ("the model {what}: bfloat16 has no numpy dtype, so the samples, the correctness check and numpy clients cannot "
                 "carry it; {fix}, or keep the model in float32 and give --precision bf16 (bf16 compute behind float32 inputs "
                 "and outputs, which clients keep).")
"""Why a bfloat16 tensor at the model's boundary is refused: observed through numpy it would read as float32, the config
would promise TYPE_FP32, and the served model would return bf16 where clients expect float32 (the backend fails with
"Got unsupported ScalarType BFloat16")."""


def resolve_signature(
    model: LoadedModel,
    input_specs: Sequence[InputSpec] = (),
    value_ranges: dict[str, tuple[float, float]] | None = None,
    output_names: Sequence[str] = (),
    batching: bool = True,
) -> Signature:
    """The full signature: inputs from the model and the user's specs, outputs observed by running the reference.

    Outputs are observed at the min and max of every dynamic axis and at two batch sizes; an output
    axis that changes between them is dynamic.
    """
    names, inferred = inferred_inputs(model, batching)
    inputs = merge_specs(inferred, names, input_specs, value_ranges or {}, optional=model.optional_forward_names)
    sig = Signature(inputs=inputs, batching=batching)
    bf16 = [t.name for t in inputs if t.dtype.name == "bfloat16"]
    if bf16:
        raise SignatureError(BF16_BOUNDARY.format(what=f"takes bfloat16 input {bf16[0]!r}",
                                                  fix="take float32 and cast inside forward() (x.to(torch.bfloat16))"))
    points = [ShapePoint(b, p) for b in ((1, 2) if batching else (0,)) for p in ("min", "max")]
    observed: list[list[np.ndarray]] = []
    paths: list[str] = []
    for i, point in enumerate(points):
        observed.append(run_reference(model, sig.input_names, generate_feed(sig, point, seed=i), paths if i == 0 else None))
    counts = {len(o) for o in observed}
    if len(counts) != 1:
        raise SignatureError("the model returns a different number of outputs for different input shapes; return a fixed structure.")
    count = counts.pop()
    if count == 0:
        raise SignatureError("the model returns no tensors; return at least one tensor.")
    if model.format == "onnx" and output_names and list(output_names) != model.output_names:
        raise SignatureError(
            f"an ONNX model keeps its graph's output names ({', '.join(model.output_names)}); drop --output-names."
        )
    names_out = list(output_names) or model.output_names or default_output_names(count)
    if len(names_out) != count:
        raise SignatureError(f"--output-names gives {len(names_out)} names but the model returns {count} outputs; give {count}.")
    clash = set(names_out) & set(sig.input_names)
    if clash:
        raise SignatureError(f"output name(s) {', '.join(sorted(clash))} repeat an input name; choose distinct --output-names.")
    # a dict, a ModelOutput or nesting: record where each output__<i> comes from (a lone tensor or a flat tuple needs no map)
    nested = len(paths) == count and any(not re.fullmatch(r"(\[\d+\])?", p) for p in paths)
    outputs = []
    for k, name in enumerate(names_out):
        shapes = [o[k].shape for o in observed]
        if batching:
            for point, shape in zip(points, shapes):
                if not shape or shape[0] != point.batch:
                    raise SignatureError(
                        f"output {name!r} has shape {list(shape)} for batch {point.batch}: its first axis is not the batch axis; "
                        "use --no-batching for models that do not batch along axis 0."
                    )
            shapes = [s[1:] for s in shapes]
        ranks = {len(s) for s in shapes}
        if len(ranks) != 1:
            raise SignatureError(f"output {name!r} changes rank with the input shape ({shapes}); return a fixed rank.")
        axes = tuple(Axis(min(s[i] for s in shapes), max(s[i] for s in shapes)) for i in range(ranks.pop()))
        if any(a.min < 1 for a in axes) if axes else False:
            raise SignatureError(f"output {name!r} has an empty axis ({shapes}); Triton needs every dim >= 1.")
        outputs.append(TensorSpec(name, dtype_from_numpy(observed[0][k].dtype), axes, origin=paths[k] if nested else ""))
    if not batching:  # found here, not after every candidate was built and measured (the config rules refuse it too)
        scalar = next((t.name for t in (*inputs, *outputs) if not t.axes), None)
        if scalar is not None:
            raise SignatureError(
                f"tensor {scalar!r} is a scalar in a non-batching model; Triton rejects it (\"cannot have empty reshape for "
                "non-batching model as scalar tensors are not supported\"). Give it one dimension (x.reshape(1) in "
                "forward()), or export with batching."
            )
    return replace(sig, outputs=tuple(outputs))
