"""TuneResult -> a model in a Triton repository: render and check the config first, then place it atomically."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from optimizer.errors import PublishError
from optimizer.model.samples import load_feeds
from optimizer.triton import config_rules
from optimizer.triton.model_config import build_spec, canonical, parse, render, warmup_entries
from optimizer.triton.repository import ModelFiles, Published, check_model_name, check_repository, existing_versions, publish_model
from optimizer.tune_strategy.result import TuneResult

log = logging.getLogger(__name__)


@dataclass
class PublishOptions:
    """Where and how to publish (the --repository, --name, --version, --overwrite, --warmup, --template-dir options)."""

    repository: Path
    name: str
    version: int | None = None
    overwrite: bool = False
    warmup: bool = False
    template_dir: Path | None = None


def check_options(options: PublishOptions) -> None:
    """Reject a bad name or repository before any tuning work starts."""
    check_model_name(options.name)
    check_repository(options.repository)


def prepare_config(result: TuneResult, options: PublishOptions) -> tuple[str, dict[str, bytes]]:
    """The checked, canonical config text and the warmup files, or an error before anything is written."""
    cand = result.selected_candidate
    artifact = cand.artifact
    assert artifact is not None
    target = options.repository / options.name
    versions = set(existing_versions(target))
    if target.exists() and not options.overwrite and options.version is not None:
        _check_same_platform(target, artifact.platform.platform or artifact.platform.backend, options.name)
        versions.add(options.version)
    version_policy = {"latest": 1} if len(versions) > 1 else None
    warmup, extra = [], {}
    if options.warmup:
        import tempfile

        feed = load_feeds(Path(result.reference.profile_feed))[0]
        with tempfile.TemporaryDirectory() as tmp:
            warmup = warmup_entries(artifact.sig, feed, result.max_batch_size, Path(tmp))
            extra = {f"warmup/{p.name}": p.read_bytes() for p in Path(tmp).iterdir()}
    spec = build_spec(result, options.name, warmup, version_policy)
    text = render(spec, options.template_dir)
    config = parse(text, f"config.pbtxt rendered from {spec.template}.pbtxt.j2")
    config_rules.check(config, config_rules.facts_for(artifact, options.name), f"config.pbtxt of {options.name!r}")
    return canonical(config), extra


def _check_same_platform(model_dir: Path, wanted: str, name: str) -> None:
    config_path = model_dir / "config.pbtxt"
    if not config_path.exists():
        return
    existing = parse(config_path.read_text(), str(config_path))
    have = existing.platform or existing.backend
    if have and have != wanted:
        raise PublishError(
            f"model {name!r} is served by {have}; the new version is {wanted}, and one model has one platform. "
            f"Publish it under another --name, use --overwrite, or restrict --backend to the same backend."
        )


def publish(result: TuneResult, options: PublishOptions) -> Published:
    """Publish the selected candidate of `result`."""
    if result.selected is None:
        raise PublishError("the run selected no candidate, so there is nothing to publish.")
    cand = result.selected_candidate
    artifact = cand.artifact
    if artifact is None or not artifact.files:
        raise PublishError(f"{cand.name} has no artifact files to publish.")
    missing = [f for f in artifact.files if not (Path(artifact.directory) / f).exists()]
    if missing:
        raise PublishError(
            f"the artifact files {', '.join(missing)} of {cand.name} are gone from {artifact.directory}; re-run the export."
        )
    text, extra = prepare_config(result, options)
    platform = artifact.platform
    files = {platform.model_filename if i == 0 else f: Path(artifact.directory) / f for i, f in enumerate(artifact.files)}
    return publish_model(options.repository, options.name, ModelFiles(text, files, extra), options.version, options.overwrite)
