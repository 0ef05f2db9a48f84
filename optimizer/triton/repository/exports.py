"""Reading a published export back: every model it consists of (composing models first), with its config text and
files, from a folder or object storage, so a loader can send each through Triton's repository API in dependency order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.triton.config.model_config import parse


@dataclass
class ExportModel:
    """One model of a published export: its repository name, config text and files (path inside the model folder -> bytes)."""

    name: str
    config_text: str
    files: dict[str, bytes] = field(default_factory=dict)

    def load_files(self) -> dict[str, bytes]:
        """The `file:<path>` overrides Triton's load API takes (tritonclient load_model(files=...))."""
        return {f"file:{path}": data for path, data in self.files.items()}


def export_models(repository: Path | str, name: str) -> list[ExportModel]:
    """Every model the published export `name` consists of, composing models first and the public model last.

    A plain export is one model; a positional backend behind the client contract is two (the positional
    model, then the ensemble). Files are every file under each model folder except config.pbtxt (and the publish
    manifest in object storage), read from a folder or from object storage (s3://). Raises RepositoryError when a model is missing.
    """
    read = _reader(repository)
    out: list[ExportModel] = []
    pending = [name]
    while pending:
        current = pending.pop()
        text, files = read(current)
        out.insert(0, ExportModel(current, text, files))
        config = parse(text, f"{current}/config.pbtxt")
        if config.platform == "ensemble":
            pending.extend(s.model_name for s in config.ensemble_scheduling.step if s.model_name not in {m.name for m in out})
    return out


def _reader(repository: Path | str) -> Any:
    """name -> (config text, files) for a folder or an s3:// repository."""
    from optimizer.errors import RepositoryError
    from optimizer.triton.repository.object_store.location import store_url

    url = store_url(repository)
    if url is None:
        root = Path(repository)

        def read_local(model: str) -> tuple[str, dict[str, bytes]]:
            folder = root / model
            if not (folder / "config.pbtxt").is_file():
                raise RepositoryError(f"model {model!r} is not in {str(root)!r} (no {model}/config.pbtxt); publish the export again.")
            files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
                     if p.is_file() and p.name != "config.pbtxt"}
            return (folder / "config.pbtxt").read_text(), files

        return read_local
    from optimizer.triton.repository.object_store import ObjectStore, parse_location

    store = ObjectStore(parse_location(url, "REPO"), RepositoryError)

    def read_store(model: str) -> tuple[str, dict[str, bytes]]:
        text = store.read(f"{model}/config.pbtxt")
        if text is None:
            raise RepositoryError(f"model {model!r} is not in {url!r} (no {model}/config.pbtxt); publish the export again.")
        from optimizer.triton.repository.object_store.upload import MANIFEST

        files = {rel: store.read(f"{model}/{rel}") or b"" for rel in store.list(model) if rel not in ("config.pbtxt", MANIFEST)}
        return text.decode(), files

    return read_store
