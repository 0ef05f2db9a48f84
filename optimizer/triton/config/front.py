"""One client contract whatever backend wins: a named ensemble in front of a positional model.

Clients send the `forward()` argument names and read `output__<i>` (or the user's --output-names),
whichever backend the export chose. TorchScript (`pytorch_libtorch`) accepts forward-argument input
names and `<name>__<i>` output names natively. `torch_aoti` does not: from Triton 26.05 its PyTorch
backend names tensors from the PT2 call spec (`INPUT__<i>`/`OUTPUT__<i>`, or `ARGS[i]`, `KWARGS[name]`,
`RESULT`), never the bare argument name (reference/triton_releases.md §2). Such a model is published
under a derived name (`<name>__positional`) with its positional config, and the public name is an
ensemble (platform "ensemble", built into Triton's core, no backend) with one step that maps the public
names onto the positional ones. `--io-names positional` publishes the bare model instead.

The ensemble's version folders hold a small marker file: object storage has no empty folders, and
Triton needs a version folder to serve an ensemble.

`export_models` lists what a published export consists of (composing models first), so a loader can
send every model of it through the repository API (config and files) in dependency order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IO_NAMES = ("names", "positional")
"""--io-names: names (the contract: forward-argument names and output__<i>, an ensemble where needed); positional: the bare model."""

INNER_SUFFIX = "__positional"
VERSION_MARKER = "ensemble.txt"
VERSION_MARKER_TEXT = b"This version folder belongs to an ensemble (platform \"ensemble\"): it has no model file of its own.\n"


def inner_name(name: str) -> str:
    """The repository name of the positional model behind the public ensemble `name`."""
    return f"{name}{INNER_SUFFIX}"


def needs_front(renamed: dict[str, str], io_names: str) -> bool:
    """Whether a model whose config renames tensors (config name -> forward name) is published behind an ensemble."""
    return io_names == "names" and any(k != v for k, v in renamed.items())


def front_config(inner: Any, name: str, inner_model: str, renamed: dict[str, str]) -> Any:
    """The ensemble `name` that serves `inner` (a parsed ModelConfig) under the forward names.

    Args:
        inner: the positional model's config (its tensors, dims, dtypes and max_batch_size are copied).
        inner_model: the positional model's repository name (the step's model_name).
        renamed: the inner config's tensor name -> the public (forward/output) name; names not in it are kept.
    """
    config = type(inner)()
    config.name = name
    config.platform = "ensemble"
    config.max_batch_size = inner.max_batch_size
    if inner.HasField("version_policy"):
        config.version_policy.CopyFrom(inner.version_policy)
    step = config.ensemble_scheduling.step.add(model_name=inner_model, model_version=-1)
    for src, dst, mapping in ((inner.input, config.input, step.input_map), (inner.output, config.output, step.output_map)):
        for tensor in src:
            public = renamed.get(tensor.name, tensor.name)
            copy = dst.add()
            copy.CopyFrom(tensor)
            copy.name = public
            mapping[tensor.name] = public
    return config


def front_step(config: Any) -> str | None:
    """The model an ensemble of ours serves (its one step), or None when `config` is not a one-step ensemble."""
    if config.platform != "ensemble" or len(config.ensemble_scheduling.step) != 1:
        return None
    return config.ensemble_scheduling.step[0].model_name


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
    from optimizer.triton.model_config import parse

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
    from optimizer.triton.object_store.location import store_url

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
    from optimizer.triton.object_store import ObjectStore, parse_location

    store = ObjectStore(parse_location(url, "REPO"), RepositoryError)

    def read_store(model: str) -> tuple[str, dict[str, bytes]]:
        text = store.read(f"{model}/config.pbtxt")
        if text is None:
            raise RepositoryError(f"model {model!r} is not in {url!r} (no {model}/config.pbtxt); publish the export again.")
        from optimizer.triton.object_store.upload import MANIFEST

        files = {rel: store.read(f"{model}/{rel}") or b"" for rel in store.list(model) if rel not in ("config.pbtxt", MANIFEST)}
        return text.decode(), files

    return read_store
