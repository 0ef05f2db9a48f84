"""The one table of Triton facts per serving format: platform, backend, file name, template, I/O naming.

Backends name their row; triton/ reads the same row to render, check and serve a config, so
a platform's file name or backend name is written down exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class TritonPlatform:
    """How Triton serves one artifact format."""

    key: str  # table key and template stem
    platform: str | None  # config `platform` ("onnxruntime_onnx"); None for backend-only formats
    backend: str  # config `backend` and the backends/<dir> Triton looks in
    model_filename: str  # default file in the version directory
    libtorch_io_names: bool  # outputs must be named <name>__<i>
    gpu_only: bool  # cannot run on KIND_CPU
    positional_io: bool = False  # the backend addresses tensors by position: INPUT__<i> / OUTPUT__<i>
    thread_parameter: str | None = None  # the config parameter that sets one instance's intra-op threads
    pads_batch: bool = False  # every execution computes max_batch_size rows, whatever arrives (openvino_backend: ov::set_batch)


PLATFORMS: MappingProxyType[str, TritonPlatform] = MappingProxyType(
    {
        p.key: p
        for p in (
            TritonPlatform("onnxruntime_onnx", "onnxruntime_onnx", "onnxruntime", "model.onnx", False, False, thread_parameter="intra_op_thread_count"),
            TritonPlatform("pytorch_libtorch", "pytorch_libtorch", "pytorch", "model.pt", True, False, thread_parameter="INTRA_OP_THREAD_COUNT"),
            TritonPlatform("torch_aoti", "torch_aoti", "pytorch", "model.pt2", False, False, positional_io=True, thread_parameter="INTRA_OP_THREAD_COUNT"),
            TritonPlatform("tensorrt_plan", "tensorrt_plan", "tensorrt", "model.plan", False, True),
            TritonPlatform("openvino", None, "openvino", "model.xml", False, False, thread_parameter="INFERENCE_NUM_THREADS", pads_batch=True),
        )
    }
)
