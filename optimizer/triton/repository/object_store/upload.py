"""Publishing a model into an s3:// repository in an order that never lets Triton load a half-written model.

S3 has no rename, so the local publisher's one atomic swap does not exist there: objects appear one PUT at a
time, and Triton (polling, or an explicit load request that arrives mid-publish) may look at any moment. What
Triton loads is decided by config.pbtxt: without one it auto-completes a config from the files it finds, and
with one it loads exactly the version folders its version_policy selects. So config.pbtxt is the gate,
written first and last:

  1. gate   config.pbtxt := a config that selects only versions this publish does not touch (the existing
            model's config with `version_policy { specific { versions: [...] } }` of what it serves now), or none
            at all for a new model or an --overwrite (`specific {}`: Triton refuses to load it, and keeps
            serving what it had loaded). Never absent while other files exist: that is when auto-complete strikes.
  2. delete (--overwrite) the old model's objects the new one does not have: old versions, old warmup files.
  3. upload warmup files, then the version's files, the model file itself last (a backend that sees the folder
            early finds no model file and fails; the version is complete the moment its model file appears).
  4. manifest aitune-manifest.json: size and sha256 of every file of the model, the final config.pbtxt included
            (the model is complete when config.pbtxt's sha256 is the manifest's).
  5. commit config.pbtxt := the rendered config, with a Last-Modified later than every other object of the
            model (S3 keeps whole seconds; Triton's poller reloads only when the newest time under a model grows).

What tritonserver (2.51, polling or explicit mode) does with an S3 repository, and tests/test_object_store.py checks
against moto's S3: a folder holding only 1/model.onnx is auto-completed, loaded and answered (max_batch_size 0, no
dynamic batching) before its config.pbtxt arrives; under the gate a new model is never loaded (an explicit load
request is refused with "at least one version must be available under the version policy") and a served model keeps
answering with its loaded version while its files are replaced or a version is added, switching only at the commit; a
version folder without its model file fails to load (NO_SUCHFILE), it does not load half.

A failure before the commit takes back what it can (a new model's objects, an added version) and says what is
left: the gate config never lets Triton load the partial model. Publishers are not serialized (S3 has no lock);
publish one model from one place at a time.

Test seam: `checkpoint_hook`, when set, is called with each step name in STEPS and the object path as the
protocol passes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from optimizer._version import __version__
from optimizer.errors import PublishError, TemplateError
from optimizer.triton.repository.object_store.client import ObjectStore
from optimizer.triton.repository.object_store.location import StoreLocation
from optimizer.triton.repository.atomic import ModelFiles, Published, RepositoryState, check_free, publish_model

log = logging.getLogger(__name__)

MANIFEST = "aitune-manifest.json"
MANIFEST_FORMAT = "aitune-export model manifest 1"
STEPS = ("gate", "delete", "upload", "manifest", "commit")

checkpoint_hook: Callable[[str, str], None] | None = None
"""Test seam (see the module docstring); None in normal runs."""


def _checkpoint(step: str, path: str) -> None:
    if checkpoint_hook is not None:
        checkpoint_hook(step, path)


@dataclass(frozen=True)
class StoredModel:
    """What the store holds for one model: its objects, version folders, config text and manifest."""

    objects: dict[str, Any]  # path inside the model folder -> StoredObject
    versions: tuple[int, ...]
    config_text: str | None
    manifest: dict[str, Any] | None

    @property
    def exists(self) -> bool:
        return bool(self.objects)


def stored_versions(paths: Any) -> tuple[int, ...]:
    """Version folders Triton would see among the model's object paths (numeric, not starting with 0)."""
    tops = {p.split("/", 1)[0] for p in paths if "/" in p}
    return tuple(sorted(int(t) for t in tops if t.isdigit() and not t.startswith("0")))


def read_model(store: ObjectStore, name: str) -> StoredModel:
    """The model's objects, versions, config.pbtxt and manifest as stored now."""
    objects = store.list(name)
    config = store.read(f"{name}/config.pbtxt") if "config.pbtxt" in objects else None
    manifest = None
    if MANIFEST in objects:
        try:
            manifest = json.loads(store.read(f"{name}/{MANIFEST}") or b"null")
        except ValueError:
            log.warning("%s/%s is not JSON; it is rewritten", store.location.model_url(name), MANIFEST)
    return StoredModel(objects, stored_versions(objects), config.decode(errors="replace") if config is not None else None,
                       manifest if isinstance(manifest, dict) else None)


def check_store_target(location: StoreLocation, name: str, version: int | None, overwrite: bool) -> None:
    """Before tuning: the bucket is reachable with these credentials, and publishing `name` (checked by the caller,
    publish.check_target) would not be refused."""
    store = ObjectStore(location)
    store.check()
    stored = read_model(store, name)
    check_free(name, location.url, stored.exists, list(stored.versions), version, overwrite)


def manifest_mismatch(store: ObjectStore, name: str) -> str:
    """Why the stored model is not the one its manifest describes ("" when it is, or when it has no manifest: not ours).

    Sizes of every listed file and the sha256 of config.pbtxt are compared: a publish that stopped before its commit
    leaves the gate config, whose hash is not the manifest's.
    """
    stored = read_model(store, name)
    if stored.manifest is None:
        return ""
    listed = stored.manifest.get("files") or {}
    missing = sorted(p for p, e in listed.items() if p not in stored.objects)
    if missing:
        return f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} listed in {MANIFEST} but not stored"
    resized = sorted(p for p, e in listed.items() if p != "config.pbtxt" and isinstance(e, dict) and e.get("size") != stored.objects[p].size)
    if resized:
        return f"the size of {', '.join(resized[:3])} is not the one {MANIFEST} lists"
    config = (stored.config_text or "").encode()
    if (listed.get("config.pbtxt") or {}).get("sha256") != hashlib.sha256(config).hexdigest():
        return f"config.pbtxt is not the one {MANIFEST} lists (a publish did not reach its last step)"
    return ""


def served_versions(config_text: str | None, versions: tuple[int, ...]) -> tuple[int, ...]:
    """The versions Triton loads for this config and these folders (its VersionsToLoad: latest 1 when no policy is given)."""
    if config_text is None:
        return ()
    config = _parse(config_text)
    if config is None:
        return ()
    policy = config.version_policy
    if policy.HasField("specific"):
        return tuple(sorted(v for v in policy.specific.versions if v in versions))
    if policy.HasField("all"):
        return versions
    latest = policy.latest.num_versions if policy.HasField("latest") else 1
    return tuple(sorted(versions)[-latest:]) if latest > 0 else ()


def gate_config(config_text: str, keep: tuple[int, ...]) -> str:
    """`config_text` with `version_policy { specific { versions: keep } }`: Triton loads those versions only (none when empty)."""
    from optimizer.triton.config.model_config import canonical

    config = _parse(config_text)
    assert config is not None
    config.ClearField("version_policy")
    config.version_policy.specific.SetInParent()
    config.version_policy.specific.versions.extend(sorted(keep))
    return canonical(config)


def _parse(text: str) -> Any:
    from optimizer.triton.config.model_config import parse

    try:
        return parse(text, "config.pbtxt")
    except TemplateError:
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _upload_order(model_dir: Path, version: int, main_file: str) -> list[str]:
    """The staged model's files, config.pbtxt left out: warmup and other files, then the version's companions, its model file last."""
    files = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file())
    files = [f for f in files if f != "config.pbtxt"]
    vdir = f"{version}/"
    main = f"{vdir}{main_file}"
    others = [f for f in files if not f.startswith(vdir)]
    companions = [f for f in files if f.startswith(vdir) and f != main]
    return others + companions + ([main] if main in files else [])


def publish_to_store(location: StoreLocation, name: str, build: Callable[[RepositoryState], ModelFiles], version: int | None,
                     overwrite: bool, staging: Path | None = None) -> tuple[Published, Path | None]:
    """Publish into object storage in the gate order (module docstring); returns the record and the local staged model folder.

    `build` renders the model for the stored state, exactly as for a local repository; the model is assembled with the local
    publisher into the folder `staging`, which stays (Model Analyzer reads it); None: a temporary folder, removed afterwards
    (and None is returned for it). `name` was checked by the caller (publish.py), as for a local repository.
    """
    store = ObjectStore(location)
    store.check()
    stored = read_model(store, name)
    check_free(name, location.url, stored.exists, list(stored.versions), version, overwrite)
    state = RepositoryState(name, stored.exists, stored.versions, version or 1, overwrite, stored.config_text)
    files = build(state)
    if staging is None:
        with tempfile.TemporaryDirectory(prefix="aitune-s3-staging-") as tmp:
            published, _ = _publish(store, name, stored, state, files, Path(tmp) / "repository")
        return published, None
    return _publish(store, name, stored, state, files, staging)


def _publish(store: ObjectStore, name: str, stored: StoredModel, state: RepositoryState, files: ModelFiles,
             staging: Path) -> tuple[Published, Path]:
    location, overwrite = store.location, state.overwrite
    staged = Path(publish_model(staging, name, lambda _: files, state.version, True).model_dir)
    main_file = next(iter(files.version_files), "")  # an ensemble's version folder holds no model file
    order = _upload_order(staged, state.version, main_file)
    new_paths = set(order) | {"config.pbtxt", MANIFEST}
    replaced = set(stored.objects) - new_paths if overwrite else set()
    served = served_versions(stored.config_text, stored.versions)
    keep = () if overwrite else tuple(v for v in served if v != state.version)
    gate = gate_config(files.config_text if stored.config_text is None or _parse(stored.config_text) is None else stored.config_text, keep)
    manifest = _manifest(store, name, stored, staged, order, files.config_text, state, overwrite)
    url = location.model_url(name)
    previous = {} if overwrite else {p: store.read(f"{name}/{p}") for p in order if p in stored.objects}  # to put back on failure
    written: list[str] = []
    try:
        _checkpoint("gate", "config.pbtxt")
        store.put_bytes(f"{name}/config.pbtxt", gate.encode())  # unnoticed by a poll, it still governs the next reload
        for path in sorted(replaced):  # the gate selects none of them: the order does not matter to Triton
            _checkpoint("delete", path)
            store.delete([f"{name}/{path}"])
        for path in order:
            _checkpoint("upload", path)
            store.put_file(f"{name}/{path}", staged / path)
            written.append(path)
        _checkpoint("manifest", MANIFEST)
        store.put_bytes(f"{name}/{MANIFEST}", json.dumps(manifest, indent=2).encode())
        written.append(MANIFEST)
        newest = max(o.last_modified for o in store.list(name).values())
        _checkpoint("commit", "config.pbtxt")
        store.put_newest(f"{name}/config.pbtxt", files.config_text.encode(), newest)
    except BaseException as err:
        left = _take_back(store, name, stored, written, previous, overwrite)
        if isinstance(err, PublishError):
            raise PublishError(f"{err} {left}") from err
        if isinstance(err, Exception):
            raise PublishError(f"publishing {url} stopped: {type(err).__name__}: {err}. {left}") from err
        raise
    log.info("published %s version %d into %s", name, state.version, location.url)
    return Published(url, state.version, stored.exists and overwrite, list(state.versions_after)), staged


def _manifest(store: ObjectStore, name: str, stored: StoredModel, staged: Path, order: list[str], config_text: str,
              state: RepositoryState, overwrite: bool) -> dict[str, Any]:
    """Size and sha256 of every file the model has once published: the new ones, the kept versions' (from the previous
    manifest, else read back from the store) and the final config.pbtxt."""
    files: dict[str, dict[str, Any]] = {}
    if not overwrite:
        previous = (stored.manifest or {}).get("files", {}) if stored.manifest else {}
        for path, obj in stored.objects.items():
            if path in ("config.pbtxt", MANIFEST) or path in order:
                continue
            entry = previous.get(path)
            if not (isinstance(entry, dict) and entry.get("size") == obj.size and entry.get("sha256")):
                entry = {"size": obj.size, "sha256": store.sha256(f"{name}/{path}")}
            files[path] = {"size": entry["size"], "sha256": entry["sha256"]}
    for path in order:
        files[path] = {"size": (staged / path).stat().st_size, "sha256": _sha256(staged / path)}
    data = config_text.encode()
    files["config.pbtxt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {"format": MANIFEST_FORMAT, "model": name, "version": state.version, "versions": list(state.versions_after),
            "written_by": f"aitune-export {__version__}", "files": dict(sorted(files.items()))}


def _take_back(store: ObjectStore, name: str, stored: StoredModel, written: list[str], previous: dict[str, bytes | None],
               overwrite: bool) -> str:
    """After a failure before the commit: remove what this publish added where that restores the previous state; say what is left."""
    url = store.location.model_url(name)
    try:
        if not stored.exists:  # a new model: its objects, then the gate config last (never version files without a config)
            store.delete([f"{name}/{p}" for p in reversed(written)] + [f"{name}/config.pbtxt"])
            return "Nothing of it was left in the store."
        if not overwrite:  # an added version: its objects, then the previous manifest and config back
            for p in reversed(written):
                if p == MANIFEST:
                    continue
                if previous.get(p) is not None:  # a file the model had (a warmup sample): its previous content
                    store.put_bytes(f"{name}/{p}", previous[p])
                else:
                    store.delete([f"{name}/{p}"])
            if stored.manifest is not None:
                store.put_bytes(f"{name}/{MANIFEST}", json.dumps(stored.manifest, indent=2).encode())
            elif MANIFEST in written:
                store.delete([f"{name}/{MANIFEST}"])
            if stored.config_text is not None:
                store.put_newest(f"{name}/config.pbtxt", stored.config_text.encode(), None)
            return f"The model at {url} is as it was."
    except Exception as err:  # the store failed again: say what the gate leaves
        log.debug("taking back the partial publish failed: %s", err)
    return (f"The model at {url} is partly written; its config.pbtxt selects only versions this publish did not touch"
            f"{' (none)' if overwrite else ''}, so Triton does not load the partial files. Publish again (with --overwrite) to finish.")
