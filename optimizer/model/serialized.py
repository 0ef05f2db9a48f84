"""Saved models a MODEL string may name: a TorchScript archive, a torch.export program (.pt2) and an ONNX file.

Each loader reads the file's inputs (and, for a torch.export program, its example inputs and the ranges
of its dynamic axes) with one clear error when the file is not what its suffix says.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from optimizer.errors import ModelLoadError
from optimizer.model.loaded_model import LoadedModel, ModelSource, default_model_name, examples_to_numpy


def load_torchscript(source: ModelSource) -> LoadedModel:
    import torch

    path = Path(source.spec)
    if not zipfile.is_zipfile(path):
        raise ModelLoadError(f"{source.spec!r} is not a TorchScript archive (not a zip file); save it with torch.jit.save.")
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as err:
        raise ModelLoadError(
            f"{source.spec!r} is not a TorchScript archive ({type(err).__name__}: {str(err).splitlines()[0]}); "
            "save it with torch.jit.save, or pass the Python callable that builds the model."
        ) from err
    module.eval()
    names = [a.name for a in module.forward.schema.arguments[1:]]
    return LoadedModel(source=source, name=default_model_name(source.spec), module=module, forward_names=names)


def load_exported_program(source: ModelSource) -> LoadedModel:
    import torch

    try:
        program = torch.export.load(source.spec)
    except Exception as err:
        raise ModelLoadError(
            f"{source.spec!r} is not a torch.export program ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "save one with torch.export.save (an AOTInductor package cannot be re-optimized)."
        ) from err
    from torch.export.graph_signature import InputKind

    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    args, kwargs = program.example_inputs or ((), {})
    examples = dict(zip(names, args)) | dict(kwargs or {})
    module = program.module()
    example_np = examples_to_numpy(examples, names, source.spec) if examples else None
    return LoadedModel(
        source=source,
        name=default_model_name(source.spec),
        module=module,
        forward_names=names,
        example_inputs=example_np,
        axis_ranges=_symbolic_ranges(program, names),
    )


def _finite_int(bound: Any, default: int) -> int:
    """A sympy/torch range bound as an int; `default` for infinity or anything unreadable."""
    try:
        value = int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return default
    return value if abs(value) < 2**31 else default


def _symbolic_ranges(program: Any, names: list[str]) -> dict[str, list[tuple[int, int] | None]]:
    """Per input, per axis: (min, max) of a symbolic (dynamic) dim, None for a static one."""
    import torch

    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_nodes = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    out: dict[str, list[tuple[int, int] | None]] = {}
    for name, node_name in zip(names, user_nodes):
        val = placeholders[node_name].meta.get("val")
        axes: list[tuple[int, int] | None] = []
        for d in getattr(val, "shape", ()):
            if isinstance(d, torch.SymInt):
                vr = program.range_constraints.get(d.node.expr)
                low = _finite_int(vr.lower if vr is not None else None, 1)
                high = _finite_int(vr.upper if vr is not None else None, 0)
                axes.append((max(low, 1), high))
            else:
                axes.append(None)
        out[name] = axes
    return out


def load_onnx(source: ModelSource) -> LoadedModel:
    try:
        import onnx
    except ImportError as err:
        raise ModelLoadError(f"reading {source.spec!r} needs the onnx package ({err}); pip install 'aitune-export[onnx]'.") from err
    path = Path(source.spec)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as err:
        raise ModelLoadError(f"{source.spec!r} is not a readable ONNX model ({type(err).__name__}: {err}).") from err
    initializers = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]
    outputs = [o.name for o in proto.graph.output]
    return LoadedModel(
        source=source, name=default_model_name(source.spec), onnx_path=path.resolve(), forward_names=names, output_names=outputs
    )
