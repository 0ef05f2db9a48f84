"""Backend parameters: the values each backend converts at load time (its own source's wording)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from optimizer.triton.config.rules.base import BACKEND_NAMES, ArtifactFacts, RuleViolation, backend_of

# Known backend parameters and their types: bool (true/false/1/0), int, or a tuple of allowed words.
PARAMETER_TYPES: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "onnxruntime": MappingProxyType({
        "intra_op_thread_count": int, "inter_op_thread_count": int, "execution_mode": ("0", "1"),
        "enable_mem_arena": bool, "enable_mem_pattern": bool, "memory.enable_memory_arena_shrinkage": str,
        "session.use_device_allocator_for_initializers": ("0", "1"),
    }),
    "pytorch": MappingProxyType({
        "DISABLE_OPTIMIZED_EXECUTION": bool, "INFERENCE_MODE": bool, "DISABLE_CUDNN": bool,
        "ENABLE_WEIGHT_SHARING": bool, "ENABLE_CACHE_CLEANING": bool, "ENABLE_JIT_EXECUTOR": bool,
        "ENABLE_JIT_PROFILING": bool, "ENABLE_TENSOR_FUSER": bool, "INTRA_OP_THREAD_COUNT": int,
        "INTER_OP_THREAD_COUNT": int,
    }),
    # tensorrt_backend src/model_state.cc ParseParameters (since 25.05; older releases ignore it): USER_MANAGED is TensorRT's, not the backend's
    "tensorrt": MappingProxyType({"execution_context_allocation_strategy": ("STATIC", "ON_PROFILE_CHANGE")}),
    "openvino": MappingProxyType({
        "PERFORMANCE_HINT": ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"), "INFERENCE_NUM_THREADS": int,
        "CPU_THREADS_NUM": int, "SKIP_OV_DYNAMIC_BATCHSIZE": ("YES", "NO"), "ENABLE_BATCH_PADDING": ("YES", "NO"),
        "RESHAPE_IO_LAYERS": ("YES", "NO"),
    }),
})

# (backend, parameter) -> the backend's own words for a value it refuses ({value}, {model}); others get ours
CHOICE_WORDS: Mapping[tuple[str, str], str] = MappingProxyType({
    ("tensorrt", "execution_context_allocation_strategy"): ("Invalid value for 'execution_context_allocation_strategy': '{value}' for model "
                                                            "instance '{model}'. Supported values are 'STATIC' and 'ON_PROFILE_CHANGE'."),
})


def parameters(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Backends: known parameters have values the backend can convert."""
    backend = backend_of(config)
    known = PARAMETER_TYPES.get(backend, {})
    out = []
    for key, value in config.parameters.items():
        kind, text = known.get(key), value.string_value
        source = BACKEND_NAMES.get(backend, f"{backend} backend")
        if kind is bool and text.lower() not in ("true", "false", "1", "0"):
            out.append(RuleViolation("parameters", source, f"failed to convert {key} '{text}' to boolean value", 'use "true" or "false"'))
        elif kind is int and not re.fullmatch(r"[+-]?\d+", text.strip()):
            out.append(RuleViolation("parameters", source, f"failed to convert {key} '{text}' to integral number", "use a whole number"))
        elif isinstance(kind, tuple) and text not in kind:
            words = CHOICE_WORDS.get((backend, key), "parameter {key} is '{value}'; the {backend} backend accepts {choices}")
            out.append(RuleViolation("parameters", source, words.format(key=key, value=text, backend=backend, model=config.name,
                                                                        choices=", ".join(kind)), f"use one of {', '.join(kind)}"))
    return out
