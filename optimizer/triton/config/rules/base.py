"""What every rule shares: who enforces it, the facts beside the config, the shape of a finding, small helpers.

Each rule quotes the wording of the component that enforces it (the package's docstring lists them), so a user who
has seen the server's error recognizes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from optimizer.records.triton_platforms import PLATFORMS

WILDCARD = -1
CORE = "Triton core"
ORT = "ONNX Runtime backend"
LIBTORCH = "PyTorch backend"
TRT = "TensorRT backend"
OPENVINO = "OpenVINO backend"
OURS = "aitune-export"
BACKEND_NAMES = MappingProxyType({"onnxruntime": ORT, "pytorch": LIBTORCH, "tensorrt": TRT, "openvino": OPENVINO})


# platform -> the backend Triton resolves it to (core AutoCompleteBackendFields; torch_aoti since Triton 26.03):
# ours from the one platform table, plus the TensorFlow platforms Triton also knows
PLATFORM_BACKEND = MappingProxyType({
    **{p.platform: p.backend for p in PLATFORMS.values() if p.platform},
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
})
# core AutoCompleteBackendFields, as far as the config alone decides (the version folder's files aside): a config naming no backend
# gets the first of these whose platform or default_model_filename it names, and a typed backend's missing platform is filled in
# (core main, 2026; 2.51 the same but for torch_aoti and model.pt2, which arrived in 26.03)
_CORE_BACKEND_ORDER = ("tensorrt", "onnxruntime", "openvino", "pytorch", "python")
FILE_BACKEND = MappingProxyType({**{p.model_filename: p.backend for p in PLATFORMS.values()}, "model.py": "python"})
BACKEND_PLATFORM = MappingProxyType({"tensorrt": "tensorrt_plan", "onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch"})
_TF_FILES = MappingProxyType({"model.savedmodel": "tensorflow_savedmodel", "model.graphdef": "tensorflow_graphdef"})
LIBTORCH_NAMED = frozenset(p.platform for p in PLATFORMS.values() if p.libtorch_io_names)  # outputs <name>__<index>
GPU_ONLY = frozenset(p.platform for p in PLATFORMS.values() if p.gpu_only)


# backends core knows by type: a platform must resolve to the same one (others accept any platform)
TYPED_BACKENDS = frozenset({"tensorrt", "onnxruntime", "pytorch", "tensorflow"})


@dataclass(frozen=True)
class ArtifactFacts:
    """What the artifact and the repository say, for the rules that need more than the config (None: unknown)."""

    directory_name: str | None = None
    onnx_inputs: Mapping[str, list[int] | None] | None = None  # graph input -> shape (-1 symbolic), in graph order
    onnx_outputs: Mapping[str, list[int] | None] | None = None
    engine_max_batch: int | None = None  # TensorRT: the largest batch every selected profile accepts
    engine_profile_count: int | None = None
    versions: tuple[int, ...] | None = None  # version directories the model has once published
    warmup_files: Mapping[str, int] | None = None  # file under <model>/warmup/ -> size in bytes
    gpu_count: int | Callable[[], int | None] | None = None  # GPUs of the machine the config is for; a callable asks when needed


@dataclass(frozen=True)
class RuleViolation:
    """One broken rule: whose wording it quotes, the words, and what to change.

    `warn`: Triton loads the config (or whether it does cannot be decided here); `when` completes "<source> ...:"
    with what happens instead of a refusal, e.g. "loads it, but at request time a batch ... may fail with"."""

    rule: str
    source: str
    message: str
    fix: str = ""
    warn: bool = False
    when: str = ""


Rule = Callable[[Any, ArtifactFacts], list[RuleViolation]]


def shape_text(dims: Any) -> str:
    """Dims as Triton prints them in its messages: [-1,3,8,8]."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def is_tensorrt(config: Any) -> bool:
    """Whether the config is a TensorRT engine's (by platform, backend or default file)."""
    return backend_of(config) == "tensorrt"


def gpu_only(config: Any) -> bool:
    """Whether the config's platform runs on a GPU only."""
    return config.platform in GPU_ONLY or is_tensorrt(config)


def backend_of(config: Any) -> str:
    """The backend Triton resolves the config to: its backend, else the one its platform or default_model_filename names ("" for none)."""
    if config.backend:
        return config.backend
    if config.platform in PLATFORM_BACKEND and PLATFORM_BACKEND[config.platform] == "tensorflow":
        return "tensorflow"
    if not config.platform and config.default_model_filename in _TF_FILES:
        return "tensorflow"
    for backend in _CORE_BACKEND_ORDER:
        if PLATFORM_BACKEND.get(config.platform) == backend or FILE_BACKEND.get(config.default_model_filename) == backend:
            return backend
    return ""


def platform_of(config: Any) -> str:
    """The platform core validates the config with: its platform, else the one core fills in for its backend ("" for none)."""
    if config.platform:
        return config.platform
    if config.backend in ("", "tensorflow") and config.default_model_filename in _TF_FILES:
        return _TF_FILES[config.default_model_filename]
    return BACKEND_PLATFORM.get(backend_of(config), "")


def element_count(dims: Any) -> int:
    """triton::common::GetElementCount: -1 when any dim is variable, 0 for no dims."""
    dims = list(dims)
    if any(d == WILDCARD for d in dims):
        return WILDCARD
    return math.prod(dims) if dims else 0
