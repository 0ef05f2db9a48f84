"""Facts read from an ONNX file without loading its weights (used by backends and by the config rules)."""

from __future__ import annotations

from pathlib import Path


def onnx_io_names(path: Path) -> tuple[list[str], list[str]]:
    """Graph input (minus initializers) and output names."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in inits], [o.name for o in proto.graph.output]
