"""TuneResult -> a model in a Triton repository: render and check the config first, then place it atomically.

The config depends on what is already in the repository (versions, the served platform), so it is
rendered under the repository lock; a template error or a broken rule stops the run there, before
anything is written. The Model Analyzer config goes next to the report, outside the repository.
A repository in object storage (s3://) gets the same rendering and checks; the model is assembled in a
local staging folder and uploaded in the order object_store/upload.py explains.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from optimizer.errors import PublishError, TemplateError
from optimizer.model.samples import load_feeds
from optimizer.records.served_search import OperatingPoint, ServedSearch
from optimizer.records.tune_result import TuneResult
from optimizer.triton.config import rules
from optimizer.triton.config.front import VERSION_MARKER, VERSION_MARKER_TEXT, front_config, inner_name, needs_front
from optimizer.triton.config.model_config import TEMPLATE_SUFFIX, canonical, parse, render
from optimizer.triton.config.spec import ConfigSpec, build_spec, config_signature, warmup_entries
from optimizer.triton.repository.object_store.location import check_scheme, parse_location, store_url
from optimizer.triton.repository.atomic import (
    ModelFiles,
    Published,
    RepositoryState,
    check_model_name,
    check_repository,
    check_target_free,
    publish_model,
)

log = logging.getLogger(__name__)


@dataclass
class PublishOptions:
    """Where and how to publish (--repository, --name, --version, --overwrite, --warmup, --template-dir).

    `report_dir`, when set, receives the Model Analyzer config (model_analyzer.yaml) and perf_analyzer's
    input data of the run's real samples (perf_analyzer_input.json). `operating_point` (the served search's
    choice) replaces the in-process rules' one; `served_search` is recorded with the published model.
    """

    repository: Path | str  # a folder, or an s3:// URL (object_store/location.py)
    name: str
    version: int | None = None
    overwrite: bool = False
    warmup: bool = False
    template_dir: Path | None = None
    report_dir: Path | None = None
    operating_point: OperatingPoint | None = None
    served_search: ServedSearch | None = None
    cache_dir: Path | None = None  # the run's cache root: the Model Analyzer config's server home is prepared there
    io_names: str = "names"  # front.IO_NAMES: "names" publishes a positional model behind an ensemble; "positional" bare


def check_options(options: PublishOptions) -> None:
    """Reject a bad repository before any tuning work starts (an s3:// bucket must answer with these credentials).

    The caller checked `options.name` where it entered (app/plan.py, app/republish.py).
    """
    url = store_url(options.repository)
    if url is None:
        check_repository(Path(options.repository))
        return
    from optimizer.triton.repository.object_store.client import ObjectStore

    ObjectStore(parse_location(url)).check()


def check_target(repository: Path | str, name: str, version: int | None, overwrite: bool, io_names: str = "names") -> None:
    """Before tuning: publishing `name` would not be refused (the no-clobber rule), in a folder or in object storage; with
    --io-names names, neither would the positional model a torch-aoti winner is published under (front.inner_name).

    The caller checked `name` (app/export.py). The positional model's name is derived here; object storage checks it now,
    a folder when that model is published (_publish_behind_front).
    """
    names = [name, inner_name(name)] if io_names == "names" else [name]
    url = store_url(repository)
    for each in names:
        if url is None:
            check_target_free(Path(repository), each, version, overwrite)
            continue
        from optimizer.triton.repository.object_store.upload import check_store_target

        if each != name:
            check_model_name(each)
        check_store_target(parse_location(url), each, version, overwrite)


def repository_argument(value: str | Path, what: str = "--repository") -> Path | str:
    """A --repository value as the publisher takes it: the s3:// URL as text (a Path would fold its '//'), else a Path;
    any other URL (ftp://, gs://, ...) is refused here, the one place a repository value is parsed."""
    check_scheme(value, what)
    return store_url(value) or Path(value)


def version_policy_for(state: RepositoryState) -> dict[str, Any] | None:
    """With several versions, serve the one this config was written for: `latest 1` when it is the newest,
    else exactly that version (the config is shared by all versions, so older ones may not match it)."""
    versions = state.versions_after
    if len(versions) <= 1:
        return None
    if state.version == max(versions):
        return {"latest": 1}
    log.warning("version %d is older than version %d: the config serves version %d only (version_policy specific)",
                state.version, max(versions), state.version)
    return {"specific": [state.version]}


def render_config(result: TuneResult, options: PublishOptions, state: RepositoryState) -> tuple[str, dict[str, bytes], ConfigSpec]:
    """The checked, canonical config text, the warmup files and the spec behind them; raises before anything is written."""
    artifact = result.selected_candidate.artifact
    assert artifact is not None and artifact.platform is not None
    point = options.operating_point
    if point is not None:  # warmup and engine profiles follow the served max batch
        result = replace(result, max_batch_size=point.max_batch_size)
    if state.exists and not state.overwrite and state.config_text:
        _check_same_platform(state.config_text, artifact.platform.platform or artifact.platform.backend, options.name)
    warmup, files = [], {}
    if artifact.metadata.get("warmup") == "max_shape":  # a runtime that must meet the longest shape first (see max_shape_feed)
        sig, renamed = config_signature(artifact)
        feed = max_shape_feed(artifact)
        warmup, files = warmup_entries(sig, {config_name: feed[name] for config_name, name in renamed.items() if name in feed},
                                       result.max_batch_size)
    elif options.warmup:
        feed_path = Path(result.reference.profile_feed)
        if not feed_path.is_file():
            raise PublishError(f"--warmup needs the run's sample {feed_path}, which is gone; re-run the export or publish with --no-warmup.")
        sig, renamed = config_signature(artifact)
        feed = load_feeds(feed_path)[0]
        warmup, files = warmup_entries(sig, {config_name: feed[name] for config_name, name in renamed.items() if name in feed},
                                       result.max_batch_size)
    search = options.served_search
    note = ""
    if point is not None and search is not None and search.beside_load and search.measured_on:
        note = (f" on every core while other processes kept {float(search.measured_on['others_busy']):.1f} of "
                f"{len(search.measured_on['available'])} busy (every variant beside the same load)")
    if point is not None and search is not None and search.padded:
        pad = search.client_padding
        note += (f"; clients pad {', '.join(pad['axes'])} with zeros to the next of {', '.join(map(str, pad['edges']))}, "
                 "as it was measured (answers cut back to each request's length agree)")
    spec = build_spec(result, options.name, warmup, version_policy_for(state), point, note)
    text = render(spec, options.template_dir)
    source = _template_source(spec.template, options.template_dir)
    config = parse(text, f"config.pbtxt rendered from {source}", options.template_dir)
    facts = rules.facts_for(artifact, options.name, state.versions_after,
                                   {name.split("/", 1)[1]: len(data) for name, data in files.items() if name.startswith("warmup/")})
    rules.check(config, facts, f"config.pbtxt of {options.name!r} (from {source})")
    header = f"# aitune-export: the served search measured this config{note}.\n" if note else ""
    return header + precision_comment(result.selected_candidate) + canonical(config), files, spec


def max_shape_feed(artifact: Any) -> dict[str, Any]:
    """One generated sample at the max of every dynamic axis: the model_warmup of an artifact whose runtime goes wrong
    when a short shape comes first (OpenVINO 2026.2 in bf16 returns NaN at length 128 after length 1; longest first is
    fine). The export's gate ran the same warmup before its short-long-short order, and validation checks it served."""
    from optimizer.model.samples import ShapePoint, generate_feed
    from optimizer.model.signature import Signature

    sig = Signature.from_json(artifact.signature)
    return generate_feed(sig, ShapePoint(1 if sig.batching else 0, "max"), seed=11)


def precision_comment(cand: Any) -> str:
    """A comment line naming a reduced precision and how it was judged, for whoever reads the config; fp32 gets
    none (its config stays what it always was). Triton's text-format parser skips `#` lines."""
    meta = cand.artifact.metadata if cand.artifact is not None else {}
    precision = meta.get("precision", "fp32")
    if precision == "fp32":
        return ""
    how = {"bf16": "bf16 compute, fp32 inputs and outputs", "int8": f"INT8, {meta.get('quantizer', 'post-training static quantization')}"}
    accuracy = cand.correctness.accuracy if cand.correctness is not None else None
    judged = f"; accuracy gate vs fp32 eager: {accuracy.summary()}" if accuracy is not None else ""
    return f"# precision: {precision} ({how.get(precision, precision)}){judged}; candidate {cand.name}\n"


def prepare_config(result: TuneResult, options: PublishOptions) -> tuple[str, dict[str, bytes], ConfigSpec]:
    """The config a first publish of `result` would write (a new model, version 1), without writing anything."""
    state = RepositoryState(options.name, False, (), options.version or 1, options.overwrite, None)
    return render_config(result, options, state)


def _template_source(stem: str, template_dir: Path | None) -> str:
    name = f"{stem}{TEMPLATE_SUFFIX}"
    if template_dir is not None and (template_dir / name).is_file():
        return str(template_dir / name)
    return name


def _check_same_platform(config_text: str, wanted: str, name: str) -> None:
    try:
        existing = parse(config_text, f"the existing config.pbtxt of {name!r}")
    except TemplateError as err:
        log.warning("%s; it is replaced by the new version's config", err)
        return
    have = existing.platform or existing.backend
    if have and have != wanted:
        raise PublishError(
            f"model {name!r} is served by {have}; the new version is {wanted}, and one model has one platform; nothing was changed. "
            "Publish it under another --name, replace the model with --overwrite, or restrict --backend to the same backend."
        )


def model_files(result: TuneResult) -> dict[str, Path]:
    """The version directory's files: the model file under the platform's name, companions (same stem) renamed alike."""
    cand = result.selected_candidate
    artifact = cand.artifact
    if artifact is None or artifact.platform is None or not artifact.files:
        raise PublishError(f"{cand.name} has no artifact files to publish; re-run the export.")
    directory = Path(artifact.directory)
    missing = [f for f in artifact.files if not (directory / f).is_file()]
    if missing:
        raise PublishError(f"the artifact files {', '.join(missing)} of {cand.name} are gone from {directory}; re-run the export.")
    main = Path(artifact.files[0])
    wanted = Path(artifact.platform.model_filename)
    files = {wanted.name: directory / main}
    for f in artifact.files[1:]:
        p = Path(f)
        renamed = wanted.stem + p.suffix if p.stem == main.stem and p.suffix != main.suffix else f
        files[renamed] = directory / f
    return files


def publish(result: TuneResult, options: PublishOptions) -> Published:
    """Publish the selected candidate of `result`; with `options.report_dir`, also write the Model Analyzer config there.

    A positional winner (torch-aoti) under `--io-names names` becomes two models (front.py): the positional model under
    front.inner_name(name) first, then the ensemble `name` in front of it, each placed atomically; the public name
    therefore never refers to a missing model.
    """
    if result.selected is None:
        raise PublishError("the run selected no candidate, so there is nothing to publish.")
    files = model_files(result)
    _, renamed = config_signature(result.selected_candidate.artifact)
    if needs_front(renamed, options.io_names):
        return _publish_behind_front(result, options, files, renamed)
    if any(k != v for k, v in renamed.items()):
        log.warning("%s | --io-names positional: %s addresses tensors by position: clients send %s", result.selected_candidate.name,
                    result.selected_candidate.artifact.platform.key, ", ".join(f"{k} (for {v})" for k, v in renamed.items()))
    return _publish_one(result, options, files)


def _publish_behind_front(result: TuneResult, options: PublishOptions, files: dict[str, Path], renamed: dict[str, str]) -> Published:
    """The positional model under its derived name, then the ensemble that serves it under the public names.

    The ensemble is rendered and checked once before anything is written, so a rule it breaks leaves the repository as it was.
    """
    inner = check_model_name(inner_name(options.name))  # derived from the checked public name, and longer: checked here
    artifact = result.selected_candidate.artifact

    def front_for(inner_text: str, state: RepositoryState) -> str:
        config = front_config(parse(inner_text, f"config.pbtxt of {inner!r}"), options.name, inner, renamed)
        config.ClearField("version_policy")
        policy = version_policy_for(state)
        if policy is not None and "latest" in policy:
            config.version_policy.latest.num_versions = int(policy["latest"])
        elif policy is not None:
            config.version_policy.specific.versions.extend(int(v) for v in policy["specific"])
        facts = rules.facts_for(artifact, options.name, state.versions_after, {})
        rules.check(config, facts, f"config.pbtxt of the ensemble {options.name!r} in front of {inner!r}")
        return precision_comment(result.selected_candidate) + canonical(config)  # the model clients call says it too

    first = RepositoryState(options.name, False, (), options.version or 1, options.overwrite, None)
    front_for(prepare_config(result, replace(options, name=inner))[0], first)
    placed = _place_one(result, replace(options, name=inner), files)

    def build(state: RepositoryState) -> ModelFiles:
        if state.exists and not state.overwrite and state.config_text:
            _check_same_platform(state.config_text, "ensemble", options.name)
        return ModelFiles(front_for(placed.config_text, state), {}, {f"{state.version}/{VERSION_MARKER}": VERSION_MARKER_TEXT})

    try:
        published, _ = _place(options, build)
    except PublishError as err:
        raise PublishError(f"{err} The positional model {inner!r} was published ({placed.published.model_dir}); no other model "
                           "refers to it until its ensemble is published.") from err
    published.composing = [inner]
    _record(result, options, placed, published, public_names=True)
    log.info("published %s as the ensemble %s in front of %s: clients send %s", result.selected_candidate.name, options.name, inner,
             ", ".join(v for k, v in renamed.items() if k.startswith("INPUT__")))
    return published


def _place(options: PublishOptions, build: Any) -> tuple[Published, Published]:
    """Place one model with the local or object-storage publisher; returns the record and its local copy (Model Analyzer's)."""
    url = store_url(options.repository)
    if url is None:
        published = publish_model(Path(options.repository), options.name, build, options.version, options.overwrite)
        return published, published
    from optimizer.triton.repository.object_store.upload import publish_to_store

    staging = options.report_dir / "work" / "object_store" if options.report_dir is not None else None
    published, staged = publish_to_store(parse_location(url), options.name, build, options.version, options.overwrite, staging)
    return published, replace(published, model_dir=staged)  # what was uploaded, on this machine (Model Analyzer's base repository)


@dataclass
class _Placed:
    """A model placed by _place_one: its record, its local copy, the spec and the config text it was written with."""

    published: Published
    local: Published
    spec: ConfigSpec
    config_text: str


def _place_one(result: TuneResult, options: PublishOptions, files: dict[str, Path]) -> _Placed:
    """Render the selected candidate's config under the repository's lock and place the model atomically."""
    rendered: list[tuple[str, ConfigSpec]] = []

    def build(state: RepositoryState) -> ModelFiles:
        text, extra, spec = render_config(result, options, state)
        rendered.append((text, spec))
        return ModelFiles(text, files, extra)

    published, local = _place(options, build)
    text, spec = rendered[-1]
    return _Placed(published, local, spec, text)


def _publish_one(result: TuneResult, options: PublishOptions, files: dict[str, Path]) -> Published:
    """One model that clients call directly."""
    placed = _place_one(result, options, files)
    _record(result, options, placed, placed.published)
    return placed.published


def _record(result: TuneResult, options: PublishOptions, placed: _Placed, published: Published, public_names: bool = False) -> None:
    """The spec and served search on the public model's record; beside the report, the Model Analyzer config (of the model
    that runs: the positional one behind an ensemble) and perf_analyzer's input data (in the names clients send)."""
    published.config = placed.spec.to_json()
    published.served_search = options.served_search.to_json() if options.served_search is not None else None
    if options.report_dir is None:
        return
    from optimizer.triton.repository.model_analyzer import write_model_analyzer_config

    path = write_model_analyzer_config(options.report_dir, placed.local, result, placed.spec, options.cache_dir)
    published.model_analyzer_config = str(path)
    search = options.served_search
    padding = search.client_padding if search is not None and search.padded else None
    published.perf_analyzer_input = _write_perf_analyzer_input(options.report_dir, result, public_names, padding)


def _write_perf_analyzer_input(report_dir: Path, result: TuneResult, public_names: bool = False, padding: dict | None = None) -> str | None:
    """perf_analyzer's --input-data beside the report: the run's traffic in its ratios (padded to the bucket edges when
    clients are told to pad), which the served search and validate send too. In the config's names, or (`public_names`:
    a model behind an ensemble) in the forward names clients send."""
    from optimizer.triton.runtime.perf_analyzer_input import traffic_requests, write_input_data

    if not Path(result.reference.profile_feed).is_file():
        return None
    sig, renamed = config_signature(result.selected_candidate.artifact)
    back = {} if public_names else {original: config_name for config_name, original in renamed.items()}
    feeds = [{back.get(k, k): v for k, v in feed.items()} for feed in traffic_requests(result, padding)[0]]
    return str(write_input_data(report_dir / "perf_analyzer_input.json", feeds, sig.batching))
