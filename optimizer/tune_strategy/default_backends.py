"""The default candidate lists shared by the concrete strategies (one place to change them)."""

from __future__ import annotations

AOT = ("torchscript", "onnxruntime", "openvino", "torch-aoti")
"""AOT candidates for an ordinary module, in the order they are tried (FirstWins honours it).
No CPU backend wins everywhere: ORT wins MLPs and CNNs, AOTInductor transformer encoders."""

AOT_DISTRIBUTED = ("torchscript",)
"""Graph exporters that cannot carry collectives (ONNX, TensorRT, OpenVINO) are left out for distributed modules;
so is AOTInductor until compiling a DTensor-sharded module is tested."""

AOT_CUDA = ("tensorrt", "onnxruntime-trt")
"""Tried first on a GPU, before the AOT list: the engines users expect to win there (unavailable ones say why)."""

JIT = ("torchscript", "onnxruntime")
"""Cheap-to-build candidates for the JIT workflow, which measures only recorded batch sizes."""

JIT_DISTRIBUTED = ("torchscript",)


def aot(distributed: bool, device: str = "cpu") -> list[str]:
    if distributed:
        return list(AOT_DISTRIBUTED)
    return list(AOT_CUDA + AOT) if device.startswith("cuda") else list(AOT)


def jit(distributed: bool) -> list[str]:
    return list(JIT_DISTRIBUTED if distributed else JIT)
