"""Re-running a plan: a model whose inputs are unchanged and whose published model is still there is not exported again.

"Unchanged" is decided from what can be checked without loading the model (no torch import, no worker):
the model's resolved settings, the bytes of the files they name (the .onnx/.pt/.pt2, the Python file that
defines a `module:callable` or `file.py:callable`, --samples, --template-dir's templates), the previous
fleet record saying it was published with the same key, and that version's folder with its config.pbtxt
still in a local repository. What a callable reads from elsewhere (other modules, downloaded weights) is not
seen: `export-many --force` exports everything again, and the artifact cache then makes an identical export
cheap. A repository in object storage is not listed here, so those models are exported again (cache hits).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from optimizer.fleet.job import ModelOutcome
from optimizer.settings import ExportSettings

DEFAULT_MODEL_FILE = Path(__file__).resolve().parents[1] / "examples" / "cnn.py"


def settings_key(settings: ExportSettings, cwd: Path) -> str:
    """A hash of the settings and of every file they name, as the export in `cwd` would read them."""
    h = hashlib.sha256(settings.to_toml().encode())
    for path in _input_files(settings, cwd):
        h.update(str(path).encode())
        if path.is_file():
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        else:
            h.update(b"\0missing")
    return h.hexdigest()


def _input_files(settings: ExportSettings, cwd: Path) -> list[Path]:
    files = _model_files(settings.model, cwd)
    if settings.samples:
        files.append(cwd / settings.samples)
    if settings.template_dir:
        files += sorted((cwd / settings.template_dir).glob("**/*.j2"))
    return files


def _model_files(model: str | None, cwd: Path) -> list[Path]:
    """The files a MODEL string is read from; a module is found on [cwd, *sys.path] without importing it."""
    if not model:
        return [DEFAULT_MODEL_FILE]
    path = cwd / model
    if path.suffix in (".onnx", ".pt", ".pt2", ".ts", ".jit"):
        return [path, path.with_name(path.name + ".data")] if path.suffix == ".onnx" else [path]
    target = model.rpartition(":")[0] or model
    if target.endswith(".py"):
        return [cwd / target]
    parts = target.split(".")
    for root in [cwd, *map(Path, filter(None, sys.path))]:
        for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return [candidate]
    return []  # not found as a plain file (an extension module, a zip): the settings alone form the key


def unchanged(previous: ModelOutcome | None, key: str, settings: ExportSettings, cwd: Path) -> bool:
    """True when the previous run published this model with the same key and that version is still in the repository."""
    if previous is None or previous.status not in ("published", "unchanged") or previous.key != key:
        return False
    if "://" in settings.repository or previous.version is None:
        return False
    model_dir = cwd / settings.repository / (settings.name or previous.name)
    return (model_dir / "config.pbtxt").is_file() and (model_dir / str(previous.version)).is_dir()
