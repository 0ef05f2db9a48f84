"""MODEL string -> LoadedModel: which kind of source the string names, and loading it.

A callable (package.module:callable or path/to/file.py:callable) and a pickled in-memory module are
loaded here; a TorchScript archive, a torch.export program and an ONNX file in serialized.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from optimizer.errors import ModelLoadError, SettingsError
from optimizer.model.loaded_model import (
    LoadedModel,
    ModelSource,
    default_model_name,
    examples_to_numpy,
    forward_argument_names,
    forward_optional_names,
    is_distributed,
    unwrap_distributed,
)
from optimizer.model.serialized import load_exported_program, load_onnx, load_torchscript

DEFAULT_MODEL = "optimizer.examples.cnn:build"
"""The bundled example used when no MODEL is given."""

_TORCHSCRIPT_SUFFIXES = frozenset({".pt", ".pth", ".ts", ".torchscript", ".jit"})


def load_model(spec: str | None = None, module: Any = None, example_inputs: Any = None, pickle_dir: Path | None = None,
               name: str | None = None) -> LoadedModel:
    """Load MODEL, or wrap the Python API's `module` (pickled into `pickle_dir`); neither means the bundled example CNN."""
    if module is not None:
        if spec:
            raise SettingsError("give either a MODEL string or a module, not both.")
        return from_module(module, example_inputs, pickle_dir or Path("aitune-reports") / ".source", name)
    return load_source(classify(spec or DEFAULT_MODEL))


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
        "torchscript": load_torchscript,
        "exported_program": load_exported_program,
        "onnx": load_onnx,
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
    example_np = examples_to_numpy(examples, names + optional, source.spec) if examples is not None else None
    if example_np is not None and not names and not optional:
        names = list(example_np)
    return LoadedModel(source=source, name=name, module=module, forward_names=names, optional_forward_names=optional,
                       example_inputs=example_np)


def _load_pickled(source: ModelSource) -> LoadedModel:
    import torch

    payload = torch.load(source.spec, weights_only=False)
    return _from_result(source, payload["module"], payload["example_inputs"], type(payload["module"]).__name__.lower())
