"""torch.export inputs shared by every exporter: dynamic Dims from the signature and the example arguments.

The ONNX exporter (onnx_export.py), AOTInductor (torch_aoti.py) and anything else built on
torch.export take their dynamic axes from here, so one signature always means one set of Dims.
"""

from __future__ import annotations

import re
from typing import Any

from optimizer.model.samples import ShapePoint, generate_feed
from optimizer.model.signature import Signature
from optimizer.vocab import Device

EXAMPLE_BATCH = 2
"""Batch of the example arguments: 1 would let torch.export specialize the batch axis (0/1 specialization)."""


def dynamic_shapes_for(signature: Signature, batch_max: int) -> dict[str, dict[int, Any]]:
    """torch.export Dims for every dynamic axis; axes with the same position and range share one Dim
    (a sequence axis that input_ids and attention_mask must agree on)."""
    from torch.export import Dim

    shared: dict[tuple[int, int, int], Any] = {}
    batch = Dim("batch", min=1, max=max(batch_max, 2)) if signature.batching else None
    shapes: dict[str, dict[int, Any]] = {}
    offset = 1 if signature.batching else 0
    for spec in signature.inputs:
        axes: dict[int, Any] = {0: batch} if batch is not None else {}
        for i in spec.dynamic_axes:
            a = spec.axes[i]
            key = (i, a.min, a.max)
            if key not in shared:
                shared[key] = Dim(_dim_name(i + offset, a.min, a.max), min=a.min, max=a.max)
            axes[i + offset] = shared[key]
        shapes[spec.name] = axes
    return shapes


def _dim_name(axis: int, low: int, high: int) -> str:
    """The Dim of a dynamic axis (its position counts the batch axis) and range: torch.export's errors name it."""
    return f"axis{axis}_{low}_{high}"


_SPECIALIZED = re.compile(r"You marked (\S+) as dynamic but your code specialized it to be a constant \((\d+)\)")


def export_failure(err: BaseException, signature: Signature) -> str:
    """torch.export's error as one line a user can act on. Its first line names only a Dim ("Constraints violated
    (axis1_1_50)!"); when the model's code fixed a dynamic axis to a constant (an nn.LSTM/nn.GRU over a sequence axis
    does), say which input's axis, to what, and what to do."""
    from optimizer.errors import first_line

    fixed = _SPECIALIZED.findall(str(err))
    if not fixed:
        return first_line(err)
    offset = 1 if signature.batching else 0
    parts = []
    for dim, value in fixed:
        axes = [f"{spec.name} axis {i + offset} ({spec.axes[i].min}-{spec.axes[i].max})" for spec in signature.inputs
                for i in spec.dynamic_axes if _dim_name(i + offset, spec.axes[i].min, spec.axes[i].max) == dim]
        parts.append(f"{' and '.join(axes) if axes else ('the batch axis' if dim == 'batch' else dim)} to {value}")
    return (f"the model's code fixes {'; '.join(parts)} while tracing, so torch.export cannot keep it dynamic (a recurrent "
            "layer such as nn.LSTM or nn.GRU, or a size used as a Python number, does this): give that axis one size in "
            "--input to build this backend, or leave the axis dynamic for the other backends")


def example_args(signature: Signature, device: str = "cpu") -> tuple[Any, ...]:
    """Example tensors in forward() order: batch 2 (when batching) at the max of every dynamic axis, on `device`."""
    import torch

    feed = generate_feed(signature, ShapePoint(EXAMPLE_BATCH if signature.batching else 0, "max"), seed=1)
    args = tuple(torch.from_numpy(feed[n]) for n in signature.input_names)
    return args if Device.of(device).kind == "cpu" else tuple(a.to(str(device)) for a in args)


def flat_outputs_module(module: Any) -> Any:
    """`module` behind a forward(*args) that returns its outputs flattened (one tensor, or a tuple in return order).

    A program exported from the module itself keeps the output's Python type in its spec: a Hugging Face ModelOutput
    then cannot be loaded where transformers is not imported (the measuring process, Triton), with "Deserializing
    ...ModelOutput... in pytree is not registered". Flattened, the package needs nothing but torch, and its outputs
    are in the order every other backend names them. Export it with `args_dynamic_shapes`.
    """
    import torch

    from optimizer.model.reference import flatten_outputs

    class FlatOutputs(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> Any:
            outs = flatten_outputs(self.inner(*args))
            return outs[0] if len(outs) == 1 else tuple(outs)

    return FlatOutputs(module).eval()


def args_dynamic_shapes(signature: Signature, batch_max: int) -> tuple[tuple[dict[int, Any], ...]]:
    """dynamic_shapes for a forward(*args) wrapper: torch.export sees its inputs as one argument, a tuple in forward() order."""
    shapes = dynamic_shapes_for(signature, batch_max)
    return (tuple(shapes[n] for n in signature.input_names),)
