"""Candidate backends, one file each, and the registry that names them (the CLI's choices come from here)."""

from __future__ import annotations

from types import MappingProxyType

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.onnxruntime import OnnxRuntimeBackend
from optimizer.backend.onnxruntime_trt import OnnxRuntimeTensorRTBackend
from optimizer.backend.openvino import OpenVinoBackend
from optimizer.backend.tensorrt import TensorRTBackend
from optimizer.backend.torch_aoti import TorchAOTIBackend
from optimizer.backend.torch_eager import TorchEagerBackend
from optimizer.backend.torchscript import TorchScriptBackend
from optimizer.errors import SettingsError
from optimizer.records.artifact import Artifact

BACKENDS: MappingProxyType[str, type[Backend]] = MappingProxyType(
    {
        cls.name: cls
        for cls in (
            TorchEagerBackend,
            TorchScriptBackend,
            OnnxRuntimeBackend,
            OpenVinoBackend,
            TorchAOTIBackend,
            TensorRTBackend,
            OnnxRuntimeTensorRTBackend,
        )
    }
)
"""Every backend by its CLI/report name, in the order candidates are tried."""

EAGER = TorchEagerBackend.name


def backend_named(name: str, **settings: object) -> Backend:
    """An instance of the backend called `name`; unknown names list the known ones."""
    if name not in BACKENDS:
        raise SettingsError(f"unknown backend {name!r}; choose from: {', '.join(BACKENDS)}.")
    return BACKENDS[name](**settings)


__all__ = ["Artifact", "Availability", "BACKENDS", "Backend", "EAGER", "Runner", "backend_named"]
