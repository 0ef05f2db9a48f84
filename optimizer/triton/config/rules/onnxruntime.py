"""The ONNX Runtime backend: execution accelerators, and config tensors against the ONNX graph (onnxruntime_backend src/onnxruntime.cc)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optimizer.triton.config.rules.base import ORT, WILDCARD, ArtifactFacts, RuleViolation, backend_of, shape_text
from optimizer.triton.config.rules.sequence import sequence_controls

ORT_GPU_ACCELERATORS = frozenset({"tensorrt", "cuda"})
ORT_CPU_ACCELERATORS = frozenset({"openvino"})
TRT_PRECISION_MODES = ("FP32", "FP16", "INT8")


def optimization(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """ONNX Runtime backend: execution accelerators it knows, with valid TensorRT options."""
    if not config.HasField("optimization") or backend_of(config) != "onnxruntime":
        return []
    out = []
    ea = config.optimization.execution_accelerators
    for kind, allowed in (("gpu", ORT_GPU_ACCELERATORS), ("cpu", ORT_CPU_ACCELERATORS)):
        for acc in getattr(ea, f"{kind}_execution_accelerator"):
            if acc.name not in allowed:
                out.append(RuleViolation("optimization", ORT, f"unknown Execution Accelerator '{acc.name}' is requested",
                                         f"{kind} accelerators: {', '.join(sorted(allowed))}"))
            if acc.name != "tensorrt":
                continue
            mode = acc.parameters.get("precision_mode")
            if mode is not None and mode not in TRT_PRECISION_MODES:
                out.append(RuleViolation("optimization", ORT, f"unsupported precision mode '{mode}' is requested",
                                         f"use {', '.join(TRT_PRECISION_MODES)}"))
            workspace = acc.parameters.get("max_workspace_size_bytes")
            if workspace is not None and not workspace.isdigit():
                out.append(RuleViolation("optimization", ORT, f"failed to convert '{workspace}' to unsigned long long integral number",
                                         "give the workspace in bytes"))
    return out


def onnx_io(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """ONNX Runtime backend: config tensors match the ONNX graph's names and shapes, and every graph input is fed."""
    # onnxruntime_backend src/onnxruntime.cc ModelInstanceState: sequence controls, then the input count, then each tensor (main, 2026)
    out = _onnx_inputs(config, facts.onnx_inputs) if facts.onnx_inputs is not None else []
    batching = config.max_batch_size > 0
    for kind, tensors, graph in (("input", config.input, facts.onnx_inputs), ("output", config.output, facts.onnx_outputs)):
        if graph is None:
            continue
        for t in tensors:
            if t.name not in graph:
                out.append(RuleViolation("onnx_io", ORT, f"unexpected inference {kind} '{t.name}', allowed {kind}s are: {', '.join(graph)}",
                                         "name config tensors as the ONNX graph does"))
                continue
            model = graph[t.name]
            if model is None:
                continue
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            where = f"model '{config.name}', tensor '{t.name}'"
            if batching:
                if not model or model[0] != WILDCARD:
                    out.append(RuleViolation("onnx_io", ORT, f"{where}: for the model to support batching the shape should have at least 1 "
                                             f"dimension and the first dimension must be -1; but shape expected by the model is {shape_text(model)}",
                                             "export the ONNX file with a dynamic batch axis, or publish with --no-batching"))
                    continue
                full = [WILDCARD] + dims
                ok = len(model) == len(full) and all(m == WILDCARD or c == WILDCARD or m == c for m, c in zip(model[1:], full[1:]))
                if not ok:
                    out.append(RuleViolation("onnx_io", ORT, f"{where}: the model expects {len(model)} dimensions (shape {shape_text(model)}) but the "
                                             f"model configuration specifies {len(full)} dimensions (an initial batch dimension because "
                                             f"max_batch_size > 0 followed by the explicit tensor shape, making complete shape {shape_text(full)})",
                                             "dims exclude the batch axis"))
            elif len(model) != len(dims) or any(m != WILDCARD and c != WILDCARD and m != c for m, c in zip(model, dims)):
                out.append(RuleViolation("onnx_io", ORT, f"{where}: the model expects {len(model)} dimensions (shape {shape_text(model)}) but the "
                                         f"model configuration specifies {len(dims)} dimensions (shape {shape_text(dims)})",
                                         "with max_batch_size 0, dims are the full shape"))
    return out


def _onnx_inputs(config: Any, graph: Mapping[str, list[int] | None]) -> list[RuleViolation]:
    """Every graph input is fed: config inputs (optional ones excepted), batch inputs, sequence controls and states count."""
    out, n = [], config.name
    controls = sequence_controls(config)
    for name in controls.values():
        if name not in graph:
            out.append(RuleViolation("onnx_io", ORT, f"configuration specified sequence control '{name}', but model does not provide that input",
                                     "name the control as the graph input that takes it"))
            continue
        model = graph[name]
        debatched = (model[1:] if config.max_batch_size > 0 else model) if model is not None else [1]
        if debatched != [1]:
            out.append(RuleViolation("onnx_io", ORT, f"unable to load model '{n}', sequence control '{name}' in model has dims "
                                     f"{shape_text(debatched)} but dims [1] is expected", "the control input takes one value per sequence"))
    expected = sum(not t.optional for t in config.input) + len(config.batch_input) + len(controls)
    expected += len(config.sequence_batching.state) if config.HasField("sequence_batching") else 0
    if expected != len(graph):
        missing = [g for g in graph if g not in {t.name for t in config.input} | set(controls.values())]
        out.append(RuleViolation("onnx_io", ORT, f"unable to load model '{n}', configuration expects {expected} inputs, model provides {len(graph)}",
                                 f"list every graph input ({', '.join(graph)}); not in the config: {', '.join(missing) or '-'}"))
    return out
