"""TensorRT optimization profiles from a Signature: min/opt/max for the batch axis and every dynamic axis.

Shared by the `tensorrt` backend (IOptimizationProfile.set_shape) and the ONNX Runtime TensorRT
execution provider (trt_profile_{min,opt,max}_shapes), so both serve exactly the shapes the
signature promises and Triton never meets a shape the engine was not built for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from optimizer.errors import BackendError
from optimizer.model.signature import Signature


@dataclass(frozen=True)
class ShapeRange:
    """One input's min/opt/max shapes in one profile (batch axis first when the model batches)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "min": list(self.min), "opt": list(self.opt), "max": list(self.max)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShapeRange:
        return cls(d["name"], tuple(d["min"]), tuple(d["opt"]), tuple(d["max"]))


def navigator_opt_batch(max_batch: int) -> int:
    """Model Navigator's rule for the profile's optimal batch when nothing was measured:
    2**ceil(floor(log2 max) * 0.8), never above max (max 256 -> 128, 64 -> 32, 16 -> 16, 1 -> 1)."""
    if max_batch < 1:
        raise BackendError(f"a TensorRT profile needs a max batch >= 1, got {max_batch}.")
    return min(max_batch, 2 ** math.ceil(math.floor(math.log2(max_batch)) * 0.8))


def opt_batch_for(max_batch: int, wanted: int | None, source: str | None = None) -> tuple[int, str]:
    """The profile's optimal batch and a sentence saying why: `wanted` (from `source`, e.g. a measured
    knee) when given, capped at the max batch; else Navigator's rule."""
    if wanted is not None and wanted >= 1:
        why = f"{min(wanted, max_batch)}: {source or 'the opt_batch setting'}" + (f" ({wanted}, capped at the max batch)" if wanted > max_batch else "")
        return min(wanted, max_batch), why
    opt = navigator_opt_batch(max_batch)
    return opt, f"{opt}: 2**ceil(floor(log2 {max_batch})*0.8), Model Navigator's rule (no knee was known at build time)"


def optimization_profile(signature: Signature, max_batch: int, opt_batch: int | None = None) -> list[ShapeRange]:
    """One profile covering batch 1..max_batch and every dynamic axis from its min to its max.

    The batch axis is optimal at `opt_batch` (default: Navigator's rule); every other dynamic axis
    is optimal at its max, the shape whose latency a budget is judged by. Inputs with no dynamic axis
    in a non-batching model need no profile entry and get none.
    """
    if signature.batching:
        if max_batch < 1:
            raise BackendError(f"a TensorRT profile needs a max batch >= 1, got {max_batch}.")
        opt = opt_batch if opt_batch is not None else navigator_opt_batch(max_batch)
        if not 1 <= opt <= max_batch:
            raise BackendError(f"the optimal batch {opt} is outside the profile's batch range 1..{max_batch}.")
    ranges = []
    for spec in signature.inputs:
        if not signature.batching and not spec.dynamic_axes:
            continue
        lo = tuple(a.min for a in spec.axes)
        hi = tuple(a.max for a in spec.axes)
        if signature.batching:
            ranges.append(ShapeRange(spec.name, (1, *lo), (opt, *hi), (max_batch, *hi)))
        else:
            ranges.append(ShapeRange(spec.name, lo, hi, hi))
    return ranges


def engine_max_batch(profiles: Sequence[Sequence[ShapeRange]], signature: Signature) -> int | None:
    """The largest batch every input accepts: min over inputs of the largest profile-max batch
    (None when the model does not batch). Triton refuses a max_batch_size above it."""
    if not signature.batching:
        return None
    best: dict[str, int] = {}
    for profile in profiles:
        for r in profile:
            best[r.name] = max(best.get(r.name, 0), r.max[0])
    missing = [n for n in signature.input_names if n not in best]
    if missing:
        raise BackendError(f"no optimization profile covers input(s) {', '.join(missing)}.")
    return min(best[n] for n in signature.input_names)


def ort_profile_shapes(profile: Sequence[ShapeRange]) -> dict[str, str]:
    """ONNX Runtime TensorRT EP provider options (and Triton parameters) for one profile:
    trt_profile_{min,opt,max}_shapes = "name:1x3x64x64,other:1x16"."""
    def spell(which: str) -> str:
        return ",".join(f"{r.name}:{'x'.join(map(str, getattr(r, which)))}" for r in profile)

    return {f"trt_profile_{w}_shapes": spell(w) for w in ("min", "opt", "max")} if profile else {}
