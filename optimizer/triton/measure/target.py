"""What is being validated: the model in the repository (a folder or s3://), whether the local server can serve it, and where the record goes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.errors import RepositoryError, SettingsError, TemplateError
from optimizer.triton.repository.object_store.location import store_url
from optimizer.triton.repository.atomic import outside_repository
from optimizer.triton.config.rules.base import backend_of, platform_of
from optimizer.triton.runtime.install import ServerHome


@dataclass
class ModelTarget:
    """One model in a repository: its folder (or the repository's s3:// URL) and the parsed config.pbtxt."""

    repository: Path | str
    name: str
    config: Any  # tritonclient.grpc.model_config_pb2.ModelConfig
    store: Any = None  # object_store.ObjectStore when the repository is in object storage
    completed: bool = False  # no config.pbtxt: Triton's auto-complete writes the config the server runs

    @property
    def remote(self) -> bool:
        """Whether the model lives in object storage (the local server reads it from there)."""
        return self.store is not None

    @property
    def platform(self) -> str:
        """The config's platform as Triton completes it, or its backend when it has none (what the record and messages show)."""
        return platform_of(self.config) or self.backend

    @property
    def backend(self) -> str:
        """The backend Triton resolves the config to (the backends/<name> folder it looks in): from its backend, platform or
        default_model_filename, as Triton's core completes it."""
        return backend_of(self.config) or self.config.platform.split("_")[0]


def resolve_target(repository: Path, model: str | None) -> ModelTarget:
    """REPO and --model -> the model to validate. REPO may also be a model folder (one holding config.pbtxt), or an s3:// URL."""
    from optimizer.triton.config.model_config import parse

    url = store_url(repository)
    if url is not None:
        return _resolve_store_target(url, model)
    repository = Path(repository)
    if not repository.is_dir():
        raise RepositoryError(f"REPO {str(repository)!r} is not a directory; give the Triton model repository the export published into.")
    if model is None and (repository / "config.pbtxt").is_file():
        repository, model = repository.resolve().parent, repository.resolve().name
    if model is None and _bare_backend(repository):  # a model folder without a config
        repository, model = repository.resolve().parent, repository.resolve().name
    models = sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file() or _bare_backend(p))
    if model is None:
        configs = {m: (repository / m / "config.pbtxt").read_bytes() if (repository / m / "config.pbtxt").is_file() else b"" for m in models}
        candidates = _public_models(configs) if len(models) > 1 else models
        if len(candidates) == 1:
            model = candidates[0]
        elif not models:
            raise RepositoryError(f"{str(repository)!r} holds no model (no folder with a config.pbtxt, nor one with a numbered version "
                                  f"folder holding {' or '.join(AUTO_COMPLETED)}); give the Triton model repository the export published into.")
        elif len(models) != 1:
            raise RepositoryError(f"{str(repository)!r} holds {len(models)} models ({', '.join(models)}); choose one with --model NAME.")
        else:
            model = models[0]
    if model not in models:
        raise RepositoryError(f"model {model!r} is not in {str(repository)!r} (no {model}/config.pbtxt); models there: {', '.join(models) or 'none'}.")
    path = repository / model / "config.pbtxt"
    if not path.is_file():  # Triton completes it from the model file: validated as the server completes it
        return ModelTarget(repository.resolve(), model, parse(f'name: "{model}"\nbackend: "{_bare_backend(repository / model)}"\n'),
                           completed=True)
    try:
        config = parse(path.read_text(), str(path))
    except TemplateError as err:
        raise RepositoryError(str(err)) from err
    return ModelTarget(repository.resolve(), model, config)


AUTO_COMPLETED = {"model.onnx": "onnxruntime", "model.py": "python", "model.plan": "tensorrt", "model.savedmodel": "tensorflow"}
"""Model files from which Triton's auto-complete (on by default) finds the backend of a model folder with no config.pbtxt."""


def _bare_backend(folder: Path) -> str:
    """The backend Triton would complete for a model folder without config.pbtxt ("" when it is not one): a numeric version
    folder holding a default model file."""
    if not folder.is_dir() or (folder / "config.pbtxt").exists():
        return ""
    for version in sorted(p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()):
        for filename, backend in AUTO_COMPLETED.items():
            if (version / filename).exists():
                return backend
    return ""


def _resolve_store_target(url: str, model: str | None) -> ModelTarget:
    """The model to validate in an s3:// repository: its models are the folders holding a config.pbtxt."""
    from optimizer.triton.config.model_config import parse
    from optimizer.triton.repository.object_store import ObjectStore, parse_location

    location = parse_location(url, "REPO")
    store = ObjectStore(location, RepositoryError)
    store.check()
    configs = {name: text for name in store.folders() if (text := store.read(f"{name}/config.pbtxt")) is not None}
    models = sorted(configs)
    if model is None and len(_public_models(configs)) == 1:
        model = _public_models(configs)[0]
    if model is None:
        if len(models) != 1:
            raise RepositoryError(f"{location.url!r} holds {len(models)} models ({', '.join(models) or 'none'}); choose one with --model NAME.")
        model = models[0]
    if model not in configs:
        raise RepositoryError(f"model {model!r} is not in {location.url!r} (no {model}/config.pbtxt); models there: {', '.join(models) or 'none'}.")
    where = f"{location.model_url(model)}/config.pbtxt"
    try:
        config = parse(configs[model].decode(errors="replace"), where)
    except TemplateError as err:
        raise RepositoryError(str(err)) from err
    return ModelTarget(location.url, model, config, store)


def _public_models(configs: dict[str, bytes]) -> list[str]:
    """The models no ensemble among `configs` is built on (an export behind the client contract is two models, one public)."""
    from optimizer.triton.config.model_config import parse

    composed: set[str] = set()
    for name, text in configs.items():
        try:
            config = parse(text.decode(errors="replace"), f"{name}/config.pbtxt")
        except TemplateError:
            continue
        composed.update(step.model_name for step in config.ensemble_scheduling.step)
    return sorted(set(configs) - composed)


def composing_targets(target: ModelTarget) -> list[ModelTarget]:
    """The models an ensemble target runs (its steps' models, from the same repository); [] for any other model."""
    from optimizer.triton.config.model_config import parse

    out = []
    for step in target.config.ensemble_scheduling.step:
        if target.remote:
            text = target.store.read(f"{step.model_name}/config.pbtxt")
        else:
            path = Path(target.repository) / step.model_name / "config.pbtxt"
            text = path.read_bytes() if path.is_file() else None
        if text is None:
            raise RepositoryError(f"ensemble {target.name!r} runs model {step.model_name!r}, which is not in {str(target.repository)!r}; "
                                  "publish the export again.")
        try:
            config = parse(text.decode(errors="replace"), f"{step.model_name}/config.pbtxt")
        except TemplateError as err:
            raise RepositoryError(str(err)) from err
        out.append(ModelTarget(target.repository, step.model_name, config, target.store))
    return out


def output_folder(target: ModelTarget, report_dir: Path | None, export_report: Path | None) -> Path:
    """--report, else the export's report folder, else <repository's parent>/aitune-reports/NAME (./aitune-reports/NAME for
    object storage); never inside the repository."""
    if report_dir is not None:
        folder = Path(report_dir)
    elif export_report is not None:
        folder = export_report.parent
    elif target.remote:
        folder = Path("aitune-reports") / target.name
    else:
        folder = Path(target.repository).parent / "aitune-reports" / target.name
    if target.remote:
        if folder.exists() and not folder.is_dir():
            raise SettingsError(f"--report {str(folder)!r} is a file; give a folder.")
        return folder
    return outside_repository(folder, Path(target.repository), "--report")


def local_servability(target: ModelTarget, home: ServerHome) -> str:
    """Why the local CPU server cannot serve this model at all ("" when it can try); an ensemble, when it can serve its steps."""
    if target.config.platform == "ensemble":
        return next((reason for reason in (local_servability(t, home) for t in composing_targets(target)) if reason), "")
    config = target.config
    if target.backend == "tensorrt":
        return "a TensorRT plan needs TensorRT and a GPU, which the local server has neither of; validate it on a GPU machine with --url HOST:PORT."
    kinds = {g.kind for g in config.instance_group}
    from tritonclient.grpc import model_config_pb2

    if model_config_pb2.ModelInstanceGroup.KIND_GPU in kinds:
        if not _has_gpu():
            return "its instance_group is KIND_GPU and this machine has no GPU; validate it on a GPU machine with --url HOST:PORT."
        if target.backend in home.stand_ins():
            return (f"its instance_group is KIND_GPU and the local {target.backend} stand-in backend runs on the CPU; "
                    "validate it against a Triton with the native backend (--url HOST:PORT).")
    if target.backend not in home.native_backends() | home.stand_ins():
        return (f"the local server has no {target.backend!r} backend (neither libtriton_{target.backend}.so nor a stand-in "
                f"in optimizer/triton/runtime/standin_backends/{target.backend}/); validate it against a Triton that has one (--url HOST:PORT).")
    return ""


def _has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/gpus").is_dir()
