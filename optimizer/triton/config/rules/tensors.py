"""Inputs and outputs: names, data types, dims and reshape (ValidateIOShape), and batch_input/batch_output (ValidateBatchIO)."""

from __future__ import annotations

from typing import Any

from optimizer.triton.config.rules.base import CORE, WILDCARD, ArtifactFacts, RuleViolation, element_count, platform_of


def _io_shape(kind: str, t: Any, config: Any) -> str | None:
    """ValidateIOShape (model_config_utils.cc), message without Triton's trailing ' for <model>'."""
    if not t.name:
        return f"model {kind} must specify 'name'"
    p = f"model {kind} '{t.name}' "
    if t.data_type == 0:
        return p + "must specify 'data_type'"
    if len(t.dims) == 0:
        return p + "must specify 'dims'"
    if t.HasField("reshape") and len(t.reshape.shape) == 0 and config.max_batch_size == 0:
        return p + "cannot have empty reshape for non-batching model as scalar tensors are not supported"
    if any(d < 1 and d != WILDCARD for d in t.dims):
        return p + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if t.HasField("reshape"):
        shape = list(t.reshape.shape)
        if any(d < 1 and d != WILDCARD for d in shape):
            return p + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
        dims_size, reshape_size = element_count(t.dims), element_count(shape)
        if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
            return p + "has different size for dims and reshape"
        if dims_size == WILDCARD:
            a, b = _trunks(t.dims), _trunks(shape)
            if len(a) != len(b):
                return p + "has different number of variable-size dimensions for dims and reshape"
            if a != b:
                return p + "has different size for dims and reshape"
    return None


def _trunks(dims: Any) -> list[int]:
    """Element counts of the runs of fixed dims between variable-size ones."""
    counts, current = [], 1
    for d in dims:
        if d == WILDCARD:
            counts.append(current)
            current = 1
        else:
            current *= d
    return counts + [current]


def io(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: every input and output has a name, a data type and valid dims (and reshape)."""
    out, platform = [], platform_of(config)  # core checks the platform it completed (backend "tensorrt" alone is tensorrt_plan)
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            msg = _io_shape(kind, t, config)
            if msg is None and kind == "input" and t.format in (1, 2) and len(t.dims) != 3:  # FORMAT_NHWC / FORMAT_NCHW
                msg = "model input NHWC/NCHW require 3 dims"
            if msg is None and t.is_shape_tensor and platform != "tensorrt_plan":
                msg = "shape tensors are only supported for TensorRT platform"
            if msg is None and t.is_non_linear_format_io:
                if platform != "tensorrt_plan":
                    msg = "Non-linear IO format is only supported for the TensorRT platform"
                elif len(t.dims) != 3:
                    msg = f"Non-linear IO format {kind} requires 3 dims"
            if msg:
                out.append(RuleViolation("io", CORE, f"{msg} for {config.name}", "dims exclude the batch axis; each is >= 1 or -1"))
    return out


def batch_io(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: batch_input/batch_output kinds, sources and targets name config tensors."""
    # Triton core ValidateBatchIO via ValidateModelIOConfig, which appends " for <model>" (core main, 2026; checked against 2.51)
    from tritonclient.grpc import model_config_pb2

    msg = _batch_io_error(config, model_config_pb2)
    if msg is None:
        return []
    return [RuleViolation("batch_io", CORE, f"{msg} for {config.name}", "batch_input/batch_output name config inputs/outputs as sources and targets")]


def _batch_io_error(config: Any, pb: Any) -> str | None:
    inputs, outputs = {t.name for t in config.input}, {t.name for t in config.output}
    for b in config.batch_input:
        kind = pb.BatchInput.Kind.Name(b.kind) if b.kind in pb.BatchInput.Kind.values() else str(b.kind)
        if b.kind not in pb.BatchInput.Kind.values():
            return f"unknown batch input kind '{kind}'"
        if len(b.source_input) != 1:
            return f"batch input kind '{kind}' expects 1 source input, got {len(b.source_input)}"
        if pb.DataType.Name(b.data_type) not in ("TYPE_INT32", "TYPE_FP32"):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        for source in b.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
    for b in config.batch_output:
        kind = pb.BatchOutput.Kind.Name(b.kind) if b.kind in pb.BatchOutput.Kind.values() else str(b.kind)
        if b.kind not in pb.BatchOutput.Kind.values():
            return f"unknown batch output kind '{kind}'"
        if len(b.source_input) != 1:
            return f"batch output kind '{kind}' expects 1 source input, got {len(b.source_input)}"
        for source in b.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
        seen = set()
        for target in b.target_name:
            if target not in outputs:
                return f"unknown target output name '{target}'"
            if target in seen:
                return f"target output name '{target}' can only be specified once"
            seen.add(target)
    return None
