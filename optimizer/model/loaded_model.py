"""What a loaded model is (LoadedModel, and the ModelSource that loads it again) and what is read off a torch
module: forward()'s argument names, example inputs by name, and a DistributedDataParallel / FSDP wrapper.

A `ModelSource` is plain data so that a child process can load the same model again
(candidates are built and measured in their own processes).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.errors import ModelLoadError

_GENERIC_CALLABLE_NAMES = frozenset({"build", "make", "make_model", "create", "create_model", "get_model", "model", "main", "load"})


@dataclass(frozen=True)
class ModelSource:
    """How to load the model again, in this process or a child: plain, JSON-serializable data."""

    kind: str  # "callable" | "torchscript" | "exported_program" | "onnx" | "pickled"
    spec: str  # what the user gave (or the pickled file)

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "spec": self.spec}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> ModelSource:
        return cls(d["kind"], d["spec"])


@dataclass
class LoadedModel:
    """A loaded model, ready for signature inference and for the backends that consume its format."""

    source: ModelSource
    name: str
    module: Any = None  # torch.nn.Module, ScriptModule or the GraphModule of an ExportedProgram
    onnx_path: Path | None = None
    forward_names: list[str] = field(default_factory=list)  # forward()'s required positional arguments
    optional_forward_names: list[str] = field(default_factory=list)  # its positional arguments with defaults, after those
    example_inputs: dict[str, np.ndarray] | None = None
    output_names: list[str] = field(default_factory=list)  # known only for ONNX sources (graph outputs)
    axis_ranges: dict[str, list[tuple[int, int] | None]] | None = None  # ExportedProgram: (min, max) of symbolic dims
    distributed: bool = False

    @property
    def format(self) -> str:
        """"onnx" when only ONNX-consuming backends can use it, "torch" otherwise."""
        return "onnx" if self.onnx_path is not None else "torch"

    @property
    def inner_module(self) -> Any:
        """The module without a DistributedDataParallel / FSDP wrapper."""
        return unwrap_distributed(self.module)

    def snapshot_weights(self, work: Path) -> str | None:
        """A callable source is rebuilt in each candidate's process; its weights saved here make it identical to ours."""
        if self.source.kind != "callable" or self.module is None:
            return None
        import torch

        work.mkdir(parents=True, exist_ok=True)
        path = work / "state_dict.pt"
        try:
            torch.save(self.inner_module.state_dict(), path)
        except RuntimeError as err:  # torch reports a failed write (a full disk) as RuntimeError
            raise OSError(28, f"writing the weights snapshot failed ({err})", str(path)) from err
        return str(path)


def default_model_name(spec: str) -> str:
    """A Triton model name from a MODEL string: the callable's name unless generic, else the file or module stem."""
    if ":" in spec:
        target, _, attr = spec.rpartition(":")
        leaf = attr.rsplit(".", 1)[-1]
        if leaf in _GENERIC_CALLABLE_NAMES:
            leaf = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    else:
        leaf = Path(spec).stem
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", leaf).strip("._-") or "model"
    return name


def examples_to_numpy(examples: Any, names: list[str], spec: str) -> dict[str, np.ndarray]:
    """Example inputs by name, in forward()'s order. `names`: forward()'s positional arguments, optional ones included
    ([] when forward takes *args): a tuple binds to them as a call would, a dict's keys must be among them."""
    import torch

    if isinstance(examples, torch.Tensor):
        examples = (examples,)
    if isinstance(examples, dict):
        items = list(examples.items())
        unknown = [k for k, _ in items if names and k not in names]
        if unknown:
            raise ModelLoadError(f"{spec!r} gave example input {unknown[0]!r}, which is not a positional argument of forward() "
                                 f"(it takes: {', '.join(names)}); name the examples after forward()'s arguments.")
        if names:
            items.sort(key=lambda item: names.index(item[0]))  # every backend passes inputs by position
    elif isinstance(examples, (tuple, list)):
        if names and len(examples) > len(names):
            raise ModelLoadError(f"{spec!r} gave {len(examples)} example inputs but forward() takes {len(names)}: {', '.join(names)}.")
        items = list(zip(names or [f"input__{i}" for i in range(len(examples))], examples))
    else:
        raise ModelLoadError(f"{spec!r} gave example inputs of type {type(examples).__name__}; use a tensor, a tuple or a dict of tensors.")
    out = {}
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise ModelLoadError(f"example input {name!r} of {spec!r} is a {type(value).__name__}, not a tensor.")
        out[name] = value.detach().cpu().numpy() if value.dtype != torch.bfloat16 else value.detach().float().cpu().numpy()
    return out


def _forward_parameters(module: Any) -> list[inspect.Parameter]:
    """forward()'s parameters as Python declares them; [] when it has no readable signature."""
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return []


def forward_optional_names(module: Any) -> list[str]:
    """forward()'s positional arguments that have defaults, in order, after the required ones (Hugging Face models take
    every input this way: `forward(self, input_ids=None, attention_mask=None, ...)`). An input the user gives among
    them is passed by position like the required ones; [] for TorchScript and when forward takes *args first."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        return []
    params = _forward_parameters(module)
    names = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        if p.default is not p.empty:
            names.append(p.name)
    return names


def forward_argument_names(module: Any) -> list[str]:
    """Names of forward()'s positional tensor arguments; [] when forward takes *args."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        return [a.name for a in module.forward.schema.arguments[1:]]
    params = _forward_parameters(module)
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return names if names else []
        if p.default is not p.empty:
            break  # optional arguments keep their defaults
        names.append(p.name)
    return names


def _wrapper_types() -> tuple[type, ...]:
    """DistributedDataParallel and FSDP, where this torch build has them."""
    types: list[type] = []
    try:
        from torch.nn.parallel import DistributedDataParallel

        types.append(DistributedDataParallel)
        from torch.distributed.fsdp import FullyShardedDataParallel

        types.append(FullyShardedDataParallel)
    except ImportError:  # torch built without distributed support
        pass
    return tuple(types)


def unwrap_distributed(module: Any) -> Any:
    """The user's module inside a DistributedDataParallel / FSDP wrapper (itself otherwise)."""
    if module is not None and isinstance(module, _wrapper_types()):
        return module.module
    return module


def is_distributed(module: Any) -> bool:
    """True for a DDP- or FSDP-wrapped module, or one that holds DTensor parameters."""
    if module is None:
        return False
    import torch

    if isinstance(module, _wrapper_types()):
        return True
    if not isinstance(module, torch.nn.Module):
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())
