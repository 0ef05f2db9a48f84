"""--precision: which compute precisions exist, who may use them, which a run builds, and how a graph comes to carry one.

TensorRT 11 removed the builder flags (FP16, BF16) that let TensorRT 10 lower precision on its own:
every network is strongly typed, so the precision must already be in the graph. We therefore put it
there for every graph consumer alike: the PyTorch module is wrapped so that its weights and its
floating-point math run in the reduced dtype while its inputs and outputs stay float32 (what the
signature, the samples and Triton's config say). The same exported graph then means the same thing
to TensorRT 10, TensorRT 11 and ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any, Sequence

from optimizer.errors import BackendError, SettingsError
from optimizer.vocab import PRECISION_CHOICES, PRECISIONS, Device

TORCH_DTYPE_NAME = MappingProxyType({"fp16": "float16", "bf16": "bfloat16"})
"""The torch dtype a reduced precision computes in (fp32 needs no conversion)."""


CPU_PRECISIONS = ("fp32", "bf16", "int8")
"""What a CPU candidate may compute in: bf16 (OpenVINO's HINT_BF16, or torch graphs cast inside) and INT8
(post-training static quantization: NNCF for OpenVINO IR, onnxruntime.quantization QDQ for ONNX)."""

CUDA_PRECISIONS = ("fp32", "fp16", "bf16")
"""What a GPU candidate may compute in (INT8 on GPUs is not built: TensorRT's implicit INT8 calibration is gone in 11)."""


def check_precision(precision: str, device: str | Device, real_samples: bool = True) -> None:
    """Reject an unknown precision, one the device does not build, or INT8 with nothing real to calibrate on, before any work starts."""
    if precision not in PRECISION_CHOICES:
        raise SettingsError(f"--precision {precision!r} is not one of {', '.join(PRECISION_CHOICES)}.")
    cuda = Device.of(device).is_cuda
    if precision != "auto" and precision not in (CUDA_PRECISIONS if cuda else CPU_PRECISIONS):
        if cuda:
            raise SettingsError(f"--precision {precision} is built for the CPU only (NNCF / ONNX Runtime quantization); "
                                f"on --device cuda use one of {', '.join(CUDA_PRECISIONS)}, or --device cpu.")
        raise SettingsError(f"--precision {precision} needs --device cuda: CPU candidates compute in {', '.join(CPU_PRECISIONS)}; "
                            "use --precision bf16 (or auto) on the CPU.")
    if precision == "int8" and not real_samples:
        raise SettingsError("--precision int8 needs real inputs to calibrate on, and this run has only generated ones "
                            "(INT8 calibrated on random data gives accuracy figures that mean nothing); give --samples FILE.npz "
                            "or --calibration-samples FILE.npz.")


def run_precisions(precision: str, device: str, real_samples: bool, bf16_native: bool) -> tuple[tuple[str, ...], list[str]]:
    """The precisions a run builds candidates at, and one sentence per precision `auto` left out and why.

    A named precision is the only one; `auto` is fp32 on CUDA (until a GPU measurement says otherwise) and,
    on the CPU, fp32 plus bf16 where the CPU computes it natively plus INT8 when real samples calibrate it.
    """
    if precision != "auto":
        return (precision,), []
    if Device.of(device).is_cuda:
        return ("fp32",), []
    chosen, notes = ["fp32"], []
    if bf16_native:
        chosen.append("bf16")
    else:
        notes.append("bf16 was left out: this CPU has no AVX512-BF16 or AMX, so bf16 would be emulated "
                     "(--precision bf16 tries it anyway)")
    if real_samples:
        chosen.append("int8")
    else:
        notes.append("INT8 was left out: only generated inputs, and a calibration on random data says nothing about accuracy "
                     "(give --samples or --calibration-samples to include it)")
    return tuple(chosen), notes


def precision_pairs(backends: Sequence[Any], device: Any, precision: str, cache_root: Path | None, calibration: str | None,
                    bf16_native: bool) -> list[Any]:
    """Each backend paired with each precision the run builds, as a configured Backend (a candidate of its own).

    Under `auto` a backend is paired only with the precisions it builds, and one that computes bf16 by default on
    a bf16 CPU (OpenVINO) gets no fp32 candidate there: it would be its bf16 candidate in disguise. A named
    precision pairs every backend with it, and availability() refuses the ones that cannot build it.
    """
    kind = Device.of(device).kind
    precisions, _ = run_precisions(precision, str(device), calibration is not None, bf16_native)
    out = []
    for b in backends:
        builds = b.precisions.get(kind, frozenset({"fp32"}))
        for p in precisions:
            if precision == "auto" and p not in builds:
                continue
            if precision == "auto" and p == "fp32" and "bf16" in precisions and "bf16" in builds and b.computes_bf16_by_default:
                continue
            out.append(b.for_run(p, cache_root, calibration if p == "int8" else None))
    return out


def left_out(backends: Sequence[Any], device: Any, precision: str, real_samples: bool, bf16_native: bool) -> list[str]:
    """One sentence per precision `auto` left out, and per backend whose fp32 candidate it left out, with the reason."""
    _, notes = run_precisions(precision, str(device), real_samples, bf16_native)
    built = {(b.name, b.settings["precision"]) for b in backends}
    for name in sorted({b.name for b in backends if b.computes_bf16_by_default}):
        if precision == "auto" and (name, "bf16") in built and (name, "fp32") not in built:
            notes.append(f"{name} has no fp32 candidate: on this CPU it computes in bf16 by default and Triton's {name} "
                         "backend cannot ask for f32, so its bf16 candidate (judged by the accuracy gate) stands for it")
    return notes


def precision_record(precision: str, backends: Sequence[Any], notes: list[str], budget: dict[str, Any]) -> dict[str, Any] | None:
    """report.json's `precision` block: requested, the candidates' precisions, what auto left out and why, the gate's
    budget; None for --precision fp32 (its report keeps the keys it always had)."""
    if precision == "fp32":
        return None
    built = sorted({b.settings["precision"] for b in backends}, key=PRECISIONS.index)
    return {"requested": precision, "candidates": built, "left_out": notes, "accuracy_budget": budget}


def refusal(backend: str, device_kind: str, precision: str, supported: frozenset[str]) -> str:
    """One sentence saying why `backend` will not run at `precision` on `device_kind`, and what to do."""
    have = ", ".join(p for p in PRECISIONS if p in supported) or "nothing"
    return (f"{backend} on {device_kind} builds {have} only, not --precision {precision}; use one of those, or a backend "
            f"that builds it (aitune-export backends --device {device_kind} --precision {precision}).")


def reduced_precision_module(module: Any, precision: str, output_dtypes: Sequence[str] | None = None) -> Any:
    """A copy of `module` that computes in `precision` and still takes and returns the model's own dtypes.

    Floating-point inputs are cast to the reduced dtype on the way in and floating-point outputs back on the way
    out: to `output_dtypes` (torch names, one per flattened output: the signature's, so a float64 model still
    returns the TYPE_FP64 its config declares), else to float32. Integer inputs (token ids) pass untouched. The
    outputs come back flattened (one tensor, or a tuple in return order), which is how every exporter names them
    anyway. The original module is not modified. `precision` "fp32" returns `module` itself.
    """
    if precision == "fp32":
        return module
    if precision not in TORCH_DTYPE_NAME:
        raise BackendError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
    import copy

    import torch

    from optimizer.model.reference import flatten_outputs

    dtype = getattr(torch, TORCH_DTYPE_NAME[precision])
    back = [getattr(torch, name) for name in output_dtypes or ()]

    class ReducedPrecision(torch.nn.Module):
        """Runs the wrapped module in a reduced dtype behind the model's own input and output dtypes."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> Any:
            cast = [a.to(dtype) if a.is_floating_point() else a for a in args]
            outs = [o.to(back[i] if i < len(back) else torch.float32) if o.is_floating_point() else o
                    for i, o in enumerate(flatten_outputs(self.inner(*cast)))]
            return outs[0] if len(outs) == 1 else tuple(outs)

    return ReducedPrecision(copy.deepcopy(module).to(dtype)).eval()
