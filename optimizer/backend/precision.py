"""--precision: which compute precisions exist, who may use them, and how a graph comes to carry one.

TensorRT 11 removed the builder flags (FP16, BF16) that let TensorRT 10 lower precision on its own:
every network is strongly typed, so the precision must already be in the graph. We therefore put it
there for every graph consumer alike: the PyTorch module is wrapped so that its weights and its
floating-point math run in the reduced dtype while its inputs and outputs stay float32 (what the
signature, the samples and Triton's config say). The same exported graph then means the same thing
to TensorRT 10, TensorRT 11 and ONNX Runtime.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from optimizer.errors import BackendError, SettingsError
from optimizer.vocab import PRECISIONS, Device  # PRECISIONS: fp32 is the default and the only one a CPU candidate runs

TORCH_DTYPE_NAME = MappingProxyType({"fp16": "float16", "bf16": "bfloat16"})
"""The torch dtype a reduced precision computes in (fp32 needs no conversion)."""


def check_precision(precision: str, device: str) -> None:
    """Reject an unknown precision, or a reduced one on the CPU, before any work starts."""
    if precision not in PRECISIONS:
        raise SettingsError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
    if precision != "fp32" and not Device.of(device).is_cuda:
        raise SettingsError(
            f"--precision {precision} needs --device cuda: CPU candidates run fp32 only, and running them "
            "in fp32 under a reduced-precision label would misreport them. Use --precision fp32 on the CPU."
        )


def refusal(backend: str, device_kind: str, precision: str, supported: frozenset[str]) -> str:
    """One sentence saying why `backend` will not run at `precision` on `device_kind`, and what to do."""
    if device_kind == "cpu":
        return f"{backend} on cpu does not run --precision {precision} (CPU candidates run fp32 only); use --precision fp32 or --device cuda."
    have = ", ".join(p for p in PRECISIONS if p in supported) or "nothing"
    return (f"{backend} on {device_kind} builds {have} only, not --precision {precision}; use one of those, or a backend "
            f"that builds it (aitune-export backends --device {device_kind} --precision {precision}).")


def reduced_precision_module(module: Any, precision: str) -> Any:
    """A copy of `module` that computes in `precision` and still takes and returns float32 tensors.

    Floating-point inputs are cast to the reduced dtype on the way in and floating-point outputs back
    to float32 on the way out; integer inputs (token ids) pass untouched. The outputs come back
    flattened (one tensor, or a tuple in return order), which is how every exporter names them anyway.
    The original module is not modified. `precision` "fp32" returns `module` itself.
    """
    if precision == "fp32":
        return module
    if precision not in TORCH_DTYPE_NAME:
        raise BackendError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
    import copy

    import torch

    from optimizer.model.reference import flatten_outputs

    dtype = getattr(torch, TORCH_DTYPE_NAME[precision])

    class ReducedPrecision(torch.nn.Module):
        """Runs the wrapped module in a reduced dtype behind a float32 interface."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> Any:
            cast = [a.to(dtype) if a.is_floating_point() else a for a in args]
            outs = [o.float() if o.is_floating_point() else o for o in flatten_outputs(self.inner(*cast))]
            return outs[0] if len(outs) == 1 else tuple(outs)

    return ReducedPrecision(copy.deepcopy(module).to(dtype)).eval()
