"""Atomic publishing into a Triton model repository.

A model is assembled in a staging directory on the same filesystem but outside the repository,
then renamed into place (new model) or swapped in with one atomic exchange (new version, or
--overwrite). Killing the process at any moment leaves the repository as it was. A lock file beside
the repository serializes concurrent publishers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from optimizer.errors import PublishError

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def check_model_name(name: str) -> str:
    """A model name must be one path component Triton can use as a directory."""
    if not name or name in (".", "..") or not _NAME_RE.match(name) or ".." in name:
        suggestion = re.sub(r"[^A-Za-z0-9_.\-]", "_", name.strip()).strip("._-").replace("..", "_") or "model"
        raise PublishError(
            f"model name {name!r} is not one path component; Triton needs one directory per model. "
            f"Use letters, digits, '-', '_' or '.', e.g. --name {suggestion!r}."
        )
    return name


def check_repository(repository: Path) -> Path:
    """The repository must be a directory (or not exist yet) and its parent must take a staging folder."""
    if repository.exists() and not repository.is_dir():
        raise PublishError(f"--repository {str(repository)!r} is a file, not a directory; point it at a model repository folder.")
    absolute = repository.resolve()
    probe = next((p for p in [absolute.parent, *absolute.parents] if p.exists()), Path("/"))
    if not probe.is_dir():
        raise PublishError(f"--repository {str(repository)!r} is under {str(probe)!r}, which is not a directory.")
    try:  # models are staged beside the repository: prove we can write there (and leave nothing)
        os.rmdir(tempfile.mkdtemp(prefix=".aitune-write-check-", dir=probe))
    except OSError as err:
        raise PublishError(
            f"--repository {str(repository)!r}: cannot write in {str(probe)!r} ({err.strerror}); choose a writable --repository."
        ) from err
    return repository


def check_target_free(repository: Path, name: str, version: int | None, overwrite: bool) -> None:
    """Fail early (before tuning) when publishing would be refused: the model exists and neither
    --version nor --overwrite says what to do, or the version is taken."""
    if version is not None and version < 1:
        raise PublishError(f"--version {version} must be >= 1 (Triton ignores version directories starting with 0).")
    target = repository / name
    if not target.exists() or overwrite:
        return
    versions = existing_versions(target)
    nxt = (max(versions) + 1) if versions else 1
    if version is None:
        raise PublishError(
            f"model {name!r} already exists in {str(repository)!r}; nothing was changed. "
            f"Add it as a new version with --version {nxt}, replace it with --overwrite, or choose another --name."
        )
    if version in versions:
        raise PublishError(f"version {version} of model {name!r} already exists; choose another --version (next free: {nxt}) or --overwrite.")


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE). False when the filesystem cannot."""
    try:
        fn = _libc().renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def staging_root(repository: Path) -> Path:
    """Where models are assembled: beside the repository (same filesystem), never inside it."""
    repository = repository.resolve()
    root = repository.parent / f".{repository.name}.aitune-staging"
    root.mkdir(exist_ok=True)
    if os.stat(root).st_dev != os.stat(repository).st_dev:
        raise PublishError(
            f"{str(repository)!r} is on another filesystem than its parent, so a model cannot be renamed into it atomically; "
            "publish into a folder inside the mount (e.g. --repository /models/repo) or copy the repository afterwards."
        )
    return root


@contextmanager
def repository_lock(repository: Path) -> Iterator[None]:
    """Serialize publishers into one repository (a flock on a file beside it, released on exit or death)."""
    repository = repository.resolve()
    lock_path = repository.parent / f".{repository.name}.aitune.lock"
    with open(lock_path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def clean_stale_staging(repository: Path) -> None:
    """Remove staging folders left by killed publishers (their owner pid is gone). Call under the lock."""
    root = repository.resolve().parent / f".{repository.resolve().name}.aitune-staging"
    if not root.is_dir():
        return
    for d in root.iterdir():
        m = re.match(r"^(\d+)-", d.name)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def copy_file(src: Path, dst: Path) -> None:
    """Hard-link when possible (same filesystem, no extra space), else copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy_tree(src: Path, dst: Path) -> None:
    """A copy of a model directory whose files are hard links (untouched originals stay shared)."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            copy_file(path, target)


def existing_versions(model_dir: Path) -> list[int]:
    """Numeric version directories Triton would load (it ignores names starting with 0 or non-numeric)."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0"))


@dataclass
class ModelFiles:
    """What goes into <repo>/<name>/: the config text, the version's files, extra files (warmup data)."""

    config_text: str
    version_files: dict[str, Path]  # name inside <version>/ -> source file
    extra_files: dict[str, bytes]  # path inside <name>/ -> content


@dataclass
class Published:
    """Where a model landed."""

    model_dir: Path
    version: int
    replaced: bool


def publish_model(repository: Path, name: str, files: ModelFiles, version: int | None, overwrite: bool) -> Published:
    """Place a model atomically. Without --version or --overwrite an existing model is left alone."""
    try:
        return _publish_model(repository, name, files, version, overwrite)
    except OSError as err:
        raise PublishError(
            f"could not write model {name!r} into {str(repository)!r}: {err.strerror or err} ({err.filename or ''}); "
            "the repository was left as it was. Free some space or choose another --repository."
        ) from err


def _publish_model(repository: Path, name: str, files: ModelFiles, version: int | None, overwrite: bool) -> Published:
    check_model_name(name)
    check_repository(repository)
    repository.mkdir(parents=True, exist_ok=True)
    with repository_lock(repository):
        clean_stale_staging(repository)
        target = repository.resolve() / name
        exists = target.exists()
        check_target_free(repository.resolve(), name, version, overwrite)
        ver = version or 1
        root = staging_root(repository)
        stage = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{name}-", dir=root))
        try:
            model = stage / name
            model.mkdir()
            if exists and not overwrite:
                copy_tree(target, model)  # keep every other version as it is
            vdir = model / str(ver)
            if vdir.exists():
                shutil.rmtree(vdir)
            vdir.mkdir()
            for fname, src in files.version_files.items():
                shutil.copy2(src, vdir / fname)
            for rel, data in files.extra_files.items():
                (model / rel).parent.mkdir(parents=True, exist_ok=True)
                (model / rel).write_bytes(data)
            tmp_config = model / "config.pbtxt.tmp"
            tmp_config.write_text(files.config_text)
            os.replace(tmp_config, model / "config.pbtxt")
            _fsync_tree(model)
            if exists:
                if not exchange(model, target):
                    raise PublishError(
                        f"the filesystem of {str(repository)!r} cannot swap directories atomically (renameat2); "
                        "remove the old model first or publish under another --name."
                    )
                # `model` now holds the previous model: it is removed with the staging folder
            else:
                os.rename(model, target)
            _fsync_dir(repository.resolve())
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        log.info("published %s version %d into %s", name, ver, repository)
        return Published(target, ver, exists)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
