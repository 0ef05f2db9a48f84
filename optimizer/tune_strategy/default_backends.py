"""The default candidate lists, written once, and the mixin that gives them to the strategies that use them."""

from __future__ import annotations

from optimizer.vocab import Device

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


def aot(distributed: bool, device: Device | str = "cpu") -> list[str]:
    """The AOT defaults for a module of this kind on `device` (GPU engines first on CUDA)."""
    if distributed:
        return list(AOT_DISTRIBUTED)
    return list(AOT_CUDA + AOT) if Device.of(device).is_cuda else list(AOT)


def jit(distributed: bool) -> list[str]:
    """The JIT defaults for a module of this kind."""
    return list(JIT_DISTRIBUTED if distributed else JIT)


class DefaultBackendsMixin:
    """The standard lists above as the two defaults MultiBackendStrategy asks for; list it before that base."""

    def _default_aot_backends(self, distributed: bool, device: Device) -> list[str]:
        return aot(distributed, device)

    def _default_jit_backends(self, distributed: bool) -> list[str]:
        return jit(distributed)
