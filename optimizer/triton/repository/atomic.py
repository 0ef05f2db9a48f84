"""Atomic publishing into a Triton model repository.

A model is assembled in a staging directory beside the repository (same filesystem, never inside
it: Triton tries to load every directory of the repository, hidden ones included), then put in
place by one rename: renameat2(RENAME_NOREPLACE) for a new model, renameat2(RENAME_EXCHANGE) to
swap in a replacement (--overwrite) or the same model plus a new version (--version N; the other
versions are hard links to the files already served, so they are not copied and not touched).
Until that rename the repository is unchanged, so killing the publisher at any moment leaves it as
it was; after it, the new model is complete. Where the filesystem cannot exchange directories
atomically, replacing an existing model is refused before anything is written, never done in two
steps. A lock file in the staging folder serializes publishers into one repository, and each
publisher first removes what a killed one left in the staging folder.

Over 400 lines because the name, the target and the staging checks, the lock and the three kinds of rename are one
protocol whose steps must be read together to see that no moment leaves a half-written model.

Layout beside a repository /models/repo:
    /models/.repo.aitune-staging/lock         flock'ed by the publisher at work
    /models/.repo.aitune-staging/<pid>-<name>-XXXX/<name>/...   the model being assembled

Test seam: `checkpoint_hook`, when set, is called with each name in CHECKPOINTS as publishing passes
that point (tests/test_triton_publish.py stops a child publisher there and kills it with SIGKILL).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import platform as _platform
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from optimizer.errors import PublishError, SettingsError

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "ppc64le": 357, "s390x": 347}
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)

CHECKPOINTS = ("locked", "staged_existing", "files_written", "config_written", "before_swap", "swapped")
"""Points a publisher passes, in order; the repository changes only between before_swap and swapped."""

checkpoint_hook: Callable[[str], None] | None = None
"""Test seam (see the module docstring); None in normal runs."""


def _checkpoint(point: str) -> None:
    if checkpoint_hook is not None:
        checkpoint_hook(point)


# -- checks that need no lock --------------------------------------------------------------------


def check_model_name(name: str) -> str:
    """A model name must be one path component Triton can use as a directory."""
    if not name or name in (".", "..") or not _NAME_RE.match(name) or ".." in name:
        suggestion = re.sub(r"[^A-Za-z0-9_.\-]", "_", name.strip()).strip("._-").replace("..", "_") or "model"
        raise PublishError(
            f"model name {name!r} is not one path component; Triton needs one directory per model. "
            f"Use letters, digits, '-', '_' or '.', e.g. --name {suggestion!r}."
        )
    if "__aitune_" in name:
        raise PublishError(f"model name {name!r} contains '__aitune_', which the served search uses for its private variants; "
                           f"choose another --name, e.g. {name.replace('__aitune_', '_')!r}.")
    return name


def check_repository(repository: Path) -> Path:
    """The repository must be a directory (or not exist yet) under a writable parent, and not be a mount point."""
    if repository.exists() and not repository.is_dir():
        raise PublishError(f"--repository {str(repository)!r} is a file, not a directory; point it at a model repository folder.")
    resolved = repository.resolve()
    parent = resolved.parent
    probe = parent if parent.exists() else next((p for p in parent.parents if p.exists()), Path("/"))
    if not probe.is_dir():
        raise PublishError(f"--repository {str(repository)!r} is under {str(probe)!r}, which is not a directory.")
    try:  # os.access says yes to root even on read-only filesystems: create (and remove) a folder to be sure
        os.rmdir(tempfile.mkdtemp(prefix=".aitune-write-check-", dir=probe))
    except OSError as err:
        raise PublishError(
            f"--repository {str(repository)!r}: cannot write in {str(probe)!r} ({err.strerror}), and the model is staged there "
            "(beside the repository, on its filesystem) before it is renamed in; choose a writable --repository."
        ) from err
    if resolved.is_dir() and parent.exists() and os.stat(parent).st_dev != os.stat(resolved).st_dev:
        raise PublishError(
            f"--repository {str(repository)!r} is a mount point: no folder on its filesystem lies outside it to stage a model in, and "
            "Triton would try to load a staging folder inside it (hidden ones too); nothing was written. Mount the volume one level up "
            "and publish into a folder inside it (e.g. mount at /models, --repository /models/repo)."
        )
    return repository


def existing_versions(model_dir: Path) -> list[int]:
    """Numeric version directories Triton would load (it ignores names starting with 0 or non-numeric)."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0"))


def check_target_free(repository: Path, name: str, version: int | None, overwrite: bool) -> None:
    """Fail early (before tuning, and again under the lock) when publishing would be refused: the model exists and
    neither --version nor --overwrite says what to do, or the version is taken."""
    target = repository / name
    if target.exists() and not target.is_dir():
        raise PublishError(f"{str(target)!r} exists and is not a directory; remove it or choose another --name.")
    check_free(name, str(repository), target.exists(), existing_versions(target), version, overwrite)


def check_version(version: int | None) -> None:
    """A version Triton will load: version directories are positive integers (it ignores 0)."""
    if version is not None and version < 1:
        raise PublishError(f"--version {version} must be >= 1 (Triton ignores version directories starting with 0).")


def check_free(name: str, where: str, exists: bool, versions: list[int], version: int | None, overwrite: bool) -> None:
    """The no-clobber rule, wherever the repository is (a folder or object storage): an existing model changes only with
    --overwrite, or gains a --version it does not have yet."""
    check_version(version)
    if not exists or overwrite:
        return
    nxt = (max(versions) + 1) if versions else 1
    if version is None:
        raise PublishError(
            f"model {name!r} already exists in {where!r}; nothing was changed. "
            f"Add it as a new version with --version {nxt}, replace it with --overwrite, or choose another --name."
        )
    if version in versions:
        raise PublishError(f"version {version} of model {name!r} already exists; nothing was changed. "
                           f"Choose another --version (next free: {nxt}) or replace the model with --overwrite.")


# -- renames -------------------------------------------------------------------------------------


def _renameat2(src: Path, dst: Path, flags: int) -> int:
    """renameat2(2): 0 on success, else the errno (ENOSYS when neither libc nor the syscall table has it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    a, b = os.fsencode(str(src)), os.fsencode(str(dst))
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        rc = fn(_AT_FDCWD, a, _AT_FDCWD, b, flags)
    else:  # glibc < 2.28: call the syscall directly
        number = _SYS_RENAMEAT2.get(_platform.machine())
        if number is None:
            return errno.ENOSYS
        libc.syscall.restype = ctypes.c_long
        rc = libc.syscall(ctypes.c_long(number), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(a), ctypes.c_int(_AT_FDCWD),
                          ctypes.c_char_p(b), ctypes.c_uint(flags))
    return 0 if rc == 0 else ctypes.get_errno()


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE). False when the filesystem or kernel cannot."""
    err = _renameat2(a, b, RENAME_EXCHANGE)
    if err == 0:
        return True
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(b))


def rename_new(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, failing if `dst` appeared meanwhile (RENAME_NOREPLACE; plain rename where unsupported,
    which only a writer that ignores our lock could race)."""
    err = _renameat2(src, dst, RENAME_NOREPLACE)
    if err == 0:
        return
    if err == errno.EEXIST:
        raise PublishError(f"{str(dst)!r} appeared while publishing (someone wrote it without aitune-export's lock); nothing was replaced.")
    if err not in _UNSUPPORTED:
        raise OSError(err, os.strerror(err), str(dst))
    if dst.exists():
        raise PublishError(f"{str(dst)!r} appeared while publishing; nothing was replaced.")
    os.rename(src, dst)


def _can_exchange(root: Path) -> bool:
    a, b = Path(tempfile.mkdtemp(prefix="probe-a-", dir=root)), Path(tempfile.mkdtemp(prefix="probe-b-", dir=root))
    try:
        return exchange(a, b)
    finally:
        for p in (a, b):
            shutil.rmtree(p, ignore_errors=True)


# -- staging and locking -------------------------------------------------------------------------


def staging_root(repository: Path) -> Path:
    """Where models are assembled: beside the repository (same filesystem), never inside it. Created on first use."""
    repository = repository.resolve()
    root = repository.parent / f".{repository.name}.aitune-staging"
    if os.stat(repository.parent).st_dev != os.stat(repository).st_dev:
        check_repository(repository)  # raises the mount-point error
    root.mkdir(exist_ok=True)
    return root


@contextmanager
def repository_lock(repository: Path) -> Iterator[Path]:
    """Serialize publishers into one repository: an exclusive flock on the staging folder's lock file.

    The kernel drops the lock when its holder dies, so a killed publisher never blocks the next one.
    Yields the staging folder.
    """
    root = staging_root(repository)
    with open(root / "lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield root
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def clean_stale_staging(root: Path) -> None:
    """Remove what killed publishers left (call under the lock: every staging folder then belongs to a dead one)."""
    for entry in root.iterdir():
        if entry.name == "lock":
            continue
        log.info("removing %s, left by an interrupted publisher", entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


# -- files ---------------------------------------------------------------------------------------


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy_model_tree(src: Path, dst: Path) -> None:
    """A copy of a served model whose files are hard links (no extra space, originals untouched; symlinks kept)."""
    shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)


def _write_new(path: Path, data: bytes) -> None:
    """Write a file that may be a hard link into the served model: unlink first, so the served inode is never written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def _copy_new(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.unlink(missing_ok=True)
    shutil.copy2(src, dst)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir() and not p.is_symlink():
            _fsync_dir(p)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- publishing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepositoryState:
    """What is in the repository for this model when the lock is held (what the config may depend on)."""

    name: str
    exists: bool
    versions: tuple[int, ...]  # versions served before publishing
    version: int  # the version being published
    overwrite: bool
    config_text: str | None  # the current config.pbtxt, when the model exists

    @property
    def versions_after(self) -> tuple[int, ...]:
        """The version directories the model has once published."""
        kept = () if self.overwrite or not self.exists else self.versions
        return tuple(sorted(set(kept) | {self.version}))


@dataclass
class ModelFiles:
    """What goes into <repo>/<name>/: the config text, the version's files, extra files (warmup data)."""

    config_text: str
    version_files: dict[str, Path]  # name inside <version>/ -> source file (copied, never linked)
    extra_files: dict[str, bytes] = field(default_factory=dict)  # path inside <name>/ -> content


@dataclass
class Published:
    """Where a model landed, and the records that explain its config."""

    model_dir: Path | str  # the model folder, or its s3:// URL in object storage
    version: int
    replaced: bool
    versions: list[int] = field(default_factory=list)
    config: dict[str, Any] | None = None  # the ConfigSpec (with the dynamic batching derivation)
    model_analyzer_config: str | None = None
    perf_analyzer_input: str | None = None  # --input-data JSON of the run's real samples, in the config's tensor names
    served_search: dict[str, Any] | None = None  # records.served_search.ServedSearch: every variant measured in the server
    kserve_manifest: str | None = None  # fleet.manifests: the InferenceService beside the report
    composing: list[str] = field(default_factory=list)  # models behind this one (the positional model behind an ensemble)

    def to_json(self) -> dict[str, Any]:
        """The record report.json keeps under "published"."""
        return {"model_dir": str(self.model_dir), "version": self.version, "replaced": self.replaced, "versions": self.versions,
                "config": self.config, "model_analyzer_config": self.model_analyzer_config,
                "perf_analyzer_input": self.perf_analyzer_input, "served_search": self.served_search,
                "kserve_manifest": self.kserve_manifest, "composing": self.composing}


def publish_model(repository: Path, name: str, build: Callable[[RepositoryState], ModelFiles], version: int | None,
                  overwrite: bool) -> Published:
    """Place a model atomically. `build` runs under the lock with the repository's state and may raise (nothing is
    written then). Without --version or --overwrite an existing model is left alone. A failed write (a full disk)
    is a PublishError; the staging folder goes, the repository stays as it was. `name` is one path component: the caller
    checked it with check_model_name where it entered (app/), or where it was derived (publish.py's positional model)."""
    try:
        return _publish_model(repository, name, build, version, overwrite)
    except OSError as err:
        raise PublishError(
            f"could not write model {name!r} into {str(repository)!r}: {err.strerror or err} ({err.filename or ''}); "
            "the repository was left as it was. Free some space or choose another --repository."
        ) from err


def _publish_model(repository: Path, name: str, build: Callable[[RepositoryState], ModelFiles], version: int | None,
                   overwrite: bool) -> Published:
    check_repository(repository)
    repository.mkdir(parents=True, exist_ok=True)  # the only change before the swap: an empty repository folder
    repo = repository.resolve()
    with repository_lock(repo) as root:
        _checkpoint("locked")
        clean_stale_staging(root)
        target = repo / name
        check_target_free(repo, name, version, overwrite)
        exists = target.is_dir()
        config_path = target / "config.pbtxt"
        state = RepositoryState(name, exists, tuple(existing_versions(target)), version or 1, overwrite,
                                config_path.read_text() if exists and config_path.is_file() else None)
        if exists and not _can_exchange(root):
            raise PublishError(
                f"the filesystem of {str(repository)!r} cannot swap directories atomically (renameat2 RENAME_EXCHANGE is unsupported), "
                f"so model {name!r} cannot be replaced without a moment where it is missing; nothing was written. "
                "Publish under another --name, or into a repository on a local filesystem (ext4, xfs, btrfs, tmpfs)."
            )
        files = build(state)
        stage = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{name}-", dir=root))
        try:
            model = stage / name
            if exists and not overwrite:
                copy_model_tree(target, model)  # the other versions, as hard links
            model.mkdir(exist_ok=True)
            _checkpoint("staged_existing")
            vdir = model / str(state.version)
            if vdir.exists():
                shutil.rmtree(vdir)
            vdir.mkdir()
            for fname, src in files.version_files.items():
                _copy_new(Path(src), vdir / fname)
            for rel, data in files.extra_files.items():
                _write_new(model / rel, data)
            _checkpoint("files_written")
            _write_new(model / "config.pbtxt", files.config_text.encode())
            _checkpoint("config_written")
            _fsync_tree(model)
            _checkpoint("before_swap")
            if exists:
                if not exchange(model, target):
                    raise PublishError(f"the filesystem of {str(repository)!r} stopped supporting atomic exchange; nothing was replaced.")
                # `model` now holds the previous model; it goes with the staging folder
            else:
                rename_new(model, target)
            _fsync_dir(repo)
            _checkpoint("swapped")
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        replaced = exists and overwrite
        log.info("published %s version %d into %s%s", name, state.version, repository, " (replaced the previous model)" if replaced else "")
        return Published(target, state.version, replaced, list(state.versions_after))


def outside_repository(folder: Path, repository: Path, flag: str) -> Path:
    """`folder` (given by option `flag`) as a report folder: never inside the repository (Triton would load it as a model), never a file."""
    folder = Path(folder)
    resolved, repo = folder.resolve(), Path(repository).resolve()
    if resolved == repo or repo in resolved.parents:
        raise SettingsError(f"{flag} {str(folder)!r} is inside the repository {str(repository)!r}; Triton would see it as a model. Put it elsewhere.")
    if folder.exists() and not folder.is_dir():
        raise SettingsError(f"{flag} {str(folder)!r} is a file; give a folder.")
    return folder
