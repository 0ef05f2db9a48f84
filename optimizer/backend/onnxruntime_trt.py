"""ONNX Runtime with the TensorRT execution provider (`onnxruntime_onnx`, model.onnx + a TensorRT accelerator).

The same model.onnx as the `onnxruntime` candidate, served by Triton's onnxruntime backend with
`optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" ... } } }`.
The in-process session gets the very options the config carries (precision, workspace, explicit
profile shapes), so what is measured is what Triton runs. TensorRT takes the subgraphs it supports,
CUDA the rest.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeRunner
from optimizer.backend.trt_profiles import ShapeRange, engine_max_batch, opt_batch_for, optimization_profile, ort_profile_shapes
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel

TRT_PROVIDER = "TensorrtExecutionProvider"

SERVER_ENGINE_CACHE = "/tmp/aitune-export/ort-trt-engines"
"""Where Triton's onnxruntime backend keeps the engines it builds (a path on the serving machine)."""


class OnnxRuntimeTensorRTBackend(OnnxRuntimeBackend):
    """model.onnx under ONNX Runtime's TensorRT execution provider, with one profile over 1..max batch."""

    name = "onnxruntime-trt"
    devices = frozenset({"cuda"})
    workflow = frozenset({"aot"})
    precisions = MappingProxyType({"cuda": frozenset({"fp32", "fp16"})})
    cache_subdir = "tensorrt"
    default_settings = {
        **OnnxRuntimeBackend.default_settings,
        # ORT's extended/all levels fuse nodes into com.microsoft operators TensorRT cannot take (they
        # fall back to CUDA); basic keeps the graph TensorRT-shaped
        "graph_level": "basic",
        "workspace_mb": 4096,
        "opt_batch": None,
        "opt_batch_from": None,
        "engine_cache_path": SERVER_ENGINE_CACHE,
        "cache_dir": None,  # the timing cache's root; None: timing_cache_dir(); a run sets <cache root>/tensorrt
    }

    def _availability(self, device: str) -> Availability:
        try:
            import onnxruntime as ort
        except Exception as err:
            return Availability(False, f"onnxruntime cannot be imported: {err}")
        have = ort.get_available_providers()
        if TRT_PROVIDER not in have:
            return Availability(False, f"{TRT_PROVIDER} is not in this onnxruntime build (has: {', '.join(have)}); "
                                       "install onnxruntime-gpu and TensorRT.")
        return Availability(True, f"onnxruntime {ort.__version__} lists {TRT_PROVIDER}")

    def with_batch_hint(self, knee: int) -> Backend:
        """The profile's optimal batch at eager's measured knee, unless opt_batch was set explicitly."""
        if self.settings["opt_batch"] is not None:
            return self
        return type(self)(**{**self.settings, "opt_batch": int(knee), "opt_batch_from": "eager PyTorch's measured knee"})

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        artifact = super().build(model, signature, workdir, batch_range, device)
        opt, rule = (opt_batch_for(batch_range[1], self.settings["opt_batch"], self.settings["opt_batch_from"])
                     if signature.batching else (None, "the model does not batch"))
        profile = optimization_profile(signature, batch_range[1], opt)
        artifact.metadata.update({
            "provider": TRT_PROVIDER,
            "precision": self.settings["precision"],
            "workspace_mb": self.settings["workspace_mb"],
            "profiles": [[r.to_json() for r in profile]],
            "engine_max_batch": engine_max_batch([profile], signature),
            "opt_batch": opt,
            "opt_batch_rule": rule,
        })
        return artifact

    def providers(self, artifact: Artifact, device: str) -> list[Any]:
        """TensorRT first (with the options the config carries), CUDA for what TensorRT leaves, CPU last."""
        from optimizer.backend.tensorrt import timing_cache_dir

        index = Device.of(device).cuda_index
        options: dict[str, Any] = {
            "device_id": index,
            "trt_max_workspace_size": int(self.settings["workspace_mb"]) * 2**20,
            "trt_fp16_enable": self.settings["precision"] == "fp16",
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(Path(artifact.directory) / "ort_trt_engines"),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(timing_cache_dir(self.settings["cache_dir"]) / "ort"),
            **ort_profile_shapes(_profile(artifact)),
        }
        Path(options["trt_timing_cache_path"]).mkdir(parents=True, exist_ok=True)
        return [(TRT_PROVIDER, options), ("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        return OnnxRuntimeTensorRTRunner(artifact, device, self.settings["graph_level"], self.providers(artifact, device))

    def triton_settings(self, artifact: Artifact) -> dict[str, Any]:
        settings = super().triton_settings(artifact)
        settings["gpu_execution_accelerator"] = tensorrt_accelerator(
            _profile(artifact), self.settings["precision"], int(self.settings["workspace_mb"]), self.settings["engine_cache_path"]
        )
        return settings


def tensorrt_accelerator(profile: list[ShapeRange], precision: str, workspace_mb: int, engine_cache_path: str) -> dict[str, Any]:
    """The `gpu_execution_accelerator { name: "tensorrt" }` entry of Triton's onnxruntime backend
    (its README's parameter table: precision_mode, max_workspace_size_bytes, engine cache, profiles)."""
    return {
        "name": "tensorrt",
        "parameters": {
            "precision_mode": "FP16" if precision == "fp16" else "FP32",
            "max_workspace_size_bytes": str(workspace_mb * 2**20),
            "trt_engine_cache_enable": "1",
            "trt_engine_cache_path": engine_cache_path,
            **ort_profile_shapes(profile),
        },
    }


def _profile(artifact: Artifact) -> list[ShapeRange]:
    profiles = artifact.metadata.get("profiles") or [[]]
    return [ShapeRange.from_json(r) for r in profiles[0]]


class OnnxRuntimeTensorRTRunner(OnnxRuntimeRunner):
    """The ONNX Runtime session with the TensorRT EP; TensorRT builds its engines when the session starts."""

    def _activate(self) -> None:
        # Importing the tensorrt wheel loads libnvinfer into this process, where ONNX Runtime's dlopen
        # then finds it even when the wheel's library folder is not on LD_LIBRARY_PATH.
        with contextlib.suppress(Exception):
            import tensorrt  # noqa: F401
        super()._activate()
