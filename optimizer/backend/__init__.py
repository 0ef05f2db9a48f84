"""Candidate backends, one file each, and the registry that names them (the CLI's choices come from here)."""

from __future__ import annotations

from types import MappingProxyType

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.onnxruntime import OnnxRuntimeBackend
from optimizer.backend.onnxruntime_trt import OnnxRuntimeTensorRTBackend
from optimizer.backend.openvino import OpenVinoBackend
from optimizer.backend.precision import refusal
from optimizer.backend.tensorrt import TensorRTBackend
from optimizer.backend.torch_aoti import TorchAOTIBackend
from optimizer.backend.torch_eager import TorchEagerBackend
from optimizer.backend.torchscript import TorchScriptBackend
from optimizer.errors import SettingsError
from optimizer.records.artifact import Artifact
from optimizer.vocab import Device

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


def check_named_precision(names: list[str], precision: str, device: str | Device) -> None:
    """A --backend named on purpose that does not build --precision on this device is refused now, not after the other candidates ran."""
    if precision == "auto":
        return  # auto's precisions are checked as candidates
    device_kind = Device.of(device).kind
    for name in names:
        backend = backend_named(name).for_run(precision)
        builds = backend.precisions.get(device_kind, frozenset({"fp32"}))
        if device_kind in backend.devices and precision not in builds:
            raise SettingsError(refusal(name, device_kind, precision, builds))


__all__ = ["Artifact", "Availability", "BACKENDS", "Backend", "EAGER", "Runner", "backend_named", "check_named_precision"]
