"""Facts read from an ONNX file without loading its weights (used by backends and by the config rules)."""

from __future__ import annotations

from pathlib import Path


def onnx_io_names(path: Path) -> tuple[list[str], list[str]]:
    """Graph input (minus initializers) and output names."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in inits], [o.name for o in proto.graph.output]


def onnx_io_shapes(path: Path) -> tuple[dict[str, list[int] | None], dict[str, list[int] | None]]:
    """Graph inputs (minus initializers) and outputs by name, in graph order, with their shapes.

    An axis the graph leaves symbolic or unknown is -1; a tensor whose rank the graph does not record maps to None.
    """
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}

    def shape_of(value) -> list[int] | None:
        t = value.type.tensor_type
        if not t.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim]

    ins = {i.name: shape_of(i) for i in proto.graph.input if i.name not in inits}
    outs = {o.name: shape_of(o) for o in proto.graph.output}
    return ins, outs
