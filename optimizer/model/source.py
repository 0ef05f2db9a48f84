"""MODEL string -> LoadedModel: a module, a TorchScript archive, an ExportedProgram or an ONNX file.

A `ModelSource` is plain data so that a child process can load the same model again
(candidates are built and measured in their own processes).

Over 400 lines because every MODEL form a user can give (callable, file.py:callable, TorchScript,
.pt2, .onnx, a pickled module) is recognised and loaded here, with one clear error each: splitting
the forms apart would scatter the one place that says what MODEL may be.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.errors import ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "optimizer.examples.cnn:build"
"""The bundled example used when no MODEL is given."""

_GENERIC_CALLABLE_NAMES = frozenset({"build", "make", "make_model", "create", "create_model", "get_model", "model", "main", "load"})
_TORCHSCRIPT_SUFFIXES = frozenset({".pt", ".pth", ".ts", ".torchscript", ".jit"})


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


def load_model(spec: str | None = None) -> LoadedModel:
    """Load MODEL; None means the bundled example CNN."""
    spec = spec or DEFAULT_MODEL
    return load_source(classify(spec))


def classify(spec: str) -> ModelSource:
    """Tell which kind of source a MODEL string names, checking only what can be checked without loading."""
    path = Path(spec)
    if path.suffix == ".onnx":
        _require_file(path, spec)
        return ModelSource("onnx", spec)
    if path.suffix == ".pt2":
        _require_file(path, spec)
        return ModelSource("exported_program", spec)
    if path.suffix in _TORCHSCRIPT_SUFFIXES:
        _require_file(path, spec)
        return ModelSource("torchscript", spec)
    if ":" in spec:
        target, _, attr = spec.rpartition(":")
        if not attr or not target:
            raise ModelLoadError(f"MODEL {spec!r} has an empty part; use package.module:callable or path/to/file.py:callable.")
        if target.endswith(".py"):
            _require_file(Path(target), spec)
        return ModelSource("callable", spec)
    if path.exists():
        raise ModelLoadError(
            f"MODEL {spec!r} is a file of unknown kind; give a .onnx, .pt2 or TorchScript (.pt) file, "
            f"or a callable as {spec}:FUNCTION if it is Python."
        )
    raise ModelLoadError(
        f"MODEL {spec!r} is neither a file nor 'module:callable'; use package.module:callable, "
        "path/to/file.py:callable, a TorchScript .pt, a torch.export .pt2 or an .onnx file."
    )


def load_source(source: ModelSource) -> LoadedModel:
    """Load a classified source (also used by child processes)."""
    loader = {
        "callable": _load_callable,
        "torchscript": _load_torchscript,
        "exported_program": _load_exported_program,
        "onnx": _load_onnx,
        "pickled": _load_pickled,
    }[source.kind]
    model = loader(source)
    model.distributed = is_distributed(model.module)
    return model


def from_module(module: Any, example_inputs: Any, pickle_dir: Path, name: str | None = None) -> LoadedModel:
    """Wrap an in-memory module (Python API); it is pickled so that child processes can load it."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"model is a {type(module).__name__}, not a torch.nn.Module; pass a module or a MODEL string.")
    pickle_dir.mkdir(parents=True, exist_ok=True)
    path = pickle_dir / "source_module.pt"
    import cloudpickle

    try:
        # cloudpickle: a class defined in a notebook or the caller's script (__main__) travels by value, since the
        # measuring processes cannot import it; one from an importable module stays a reference, as with pickle
        torch.save({"module": module, "example_inputs": example_inputs}, path, pickle_module=cloudpickle)
    except Exception as err:  # e.g. a module holding a lock, a file handle or a generator
        raise ModelLoadError(
            f"the module cannot be pickled for the measuring processes ({type(err).__name__}: {err}); "
            "define it in an importable file and pass 'path/to/file.py:callable' instead."
        ) from err
    source = ModelSource("pickled", str(path))
    loaded = _from_result(source, module, example_inputs, name or type(module).__name__.lower())
    loaded.distributed = is_distributed(module)
    return loaded


def _require_file(path: Path, spec: str) -> None:
    if not path.exists():
        raise ModelLoadError(f"model file {str(path)!r} does not exist (MODEL {spec!r}); check the path.")
    if path.is_dir():
        raise ModelLoadError(f"model path {str(path)!r} is a directory; give the file itself.")


def import_target(target: str, spec: str) -> Any:
    """The module `target` names (dotted, or path/to/file.py), imported as MODEL is; --accuracy-check uses it too."""
    return _import_target(target, spec)


def _import_target(target: str, spec: str) -> Any:
    if target.endswith(".py"):
        path = Path(target).resolve()
        mod_name = f"aitune_user_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ModelLoadError(f"cannot import {target!r} as Python (MODEL {spec!r}); check that it is a .py file.")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.parent))
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[mod_name]
            raise ModelLoadError(f"importing {target!r} failed: {type(err).__name__}: {err}") from err
        finally:
            sys.path.remove(str(path.parent))
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        raise ModelLoadError(
            f"cannot import module {target!r} (MODEL {spec!r}): {err}; check PYTHONPATH or use path/to/file.py:callable."
        ) from err
    except Exception as err:
        raise ModelLoadError(f"importing {target!r} failed: {type(err).__name__}: {err}") from err


def _load_callable(source: ModelSource) -> LoadedModel:
    target, _, attr = source.spec.rpartition(":")
    module = _import_target(target, source.spec)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            available = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise ModelLoadError(
                f"{target!r} has no attribute {attr!r}; callables there: {', '.join(available) or 'none'}."
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelLoadError(f"{source.spec!r} names a {type(obj).__name__}, not a callable; point MODEL at a function or class.")
    import torch

    if isinstance(obj, torch.nn.Module):
        result: Any = obj
    else:
        try:
            result = obj()
        except Exception as err:
            raise ModelLoadError(f"calling {source.spec!r} raised {type(err).__name__}: {err}; fix the factory or its defaults.") from err
    examples = None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module):
        result, examples = result
    if not isinstance(result, torch.nn.Module):
        raise ModelLoadError(
            f"{source.spec!r} returned {type(result).__name__}, not a torch.nn.Module; "
            "return a module, or (module, example_inputs)."
        )
    return _from_result(source, result, examples, default_model_name(source.spec))


def _from_result(source: ModelSource, module: Any, examples: Any, name: str) -> LoadedModel:
    module.eval()
    names = forward_argument_names(unwrap_distributed(module))
    optional = forward_optional_names(unwrap_distributed(module))
    example_np = _examples_to_numpy(examples, names + optional, source.spec) if examples is not None else None
    if example_np is not None and not names and not optional:
        names = list(example_np)
    return LoadedModel(source=source, name=name, module=module, forward_names=names, optional_forward_names=optional,
                       example_inputs=example_np)


def _examples_to_numpy(examples: Any, names: list[str], spec: str) -> dict[str, np.ndarray]:
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


def _load_torchscript(source: ModelSource) -> LoadedModel:
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


def _load_exported_program(source: ModelSource) -> LoadedModel:
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
    example_np = _examples_to_numpy(examples, names, source.spec) if examples else None
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


def _load_onnx(source: ModelSource) -> LoadedModel:
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


def _load_pickled(source: ModelSource) -> LoadedModel:
    import torch

    payload = torch.load(source.spec, weights_only=False)
    return _from_result(source, payload["module"], payload["example_inputs"], type(payload["module"]).__name__.lower())


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
