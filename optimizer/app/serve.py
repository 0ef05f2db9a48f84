"""The serve use case: `aitune-export serve [REPO]` runs the bundled tritonserver 2.51 in the foreground.

For users without Docker (and for tests that need a server of their own to export or validate against by
URL): the stand-in backends are wired in as for `validate`, the ports are the user's, and Ctrl-C or SIGTERM
stops the server and every backend process it started. REPO is a folder or an s3:// repository (Triton's
own S3 client reads it with the credentials boto3 resolves). A local repository holding a model whose
platform the 2.51 core does not know (torch_aoti) is served from a private view: every model folder linked,
that model's config translated as `validate` does (local_serving.py).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from optimizer.errors import RepositoryError, SettingsError, TemplateError, ValidationError

log = logging.getLogger(__name__)

CONTROL_MODES = ("explicit", "none", "poll")
"""Triton's --model-control-mode values; explicit is what `export --url` needs (variants loaded through the API)."""


@dataclass(frozen=True)
class ServeRequest:
    """What `aitune-export serve` was asked for."""

    repository: str = "model_repository"
    http_port: int = 8000
    grpc_port: int = 8001
    model_control_mode: str = "explicit"
    address: str = "127.0.0.1"
    cache_dir: str | None = None


@dataclass
class Serving:
    """A started server, for the caller to print: its URLs, what it serves and where its log is."""

    http_url: str
    grpc_url: str
    repository: str
    model_control_mode: str
    log_path: Path
    notes: list[str]


def check_request(request: ServeRequest) -> None:
    """Bad input before anything starts: mode, ports (distinct and free), repository scheme and existence."""
    if request.model_control_mode not in CONTROL_MODES:
        raise SettingsError(f"--model-control-mode {request.model_control_mode!r} is not one of {', '.join(CONTROL_MODES)}.")
    if request.http_port == request.grpc_port:
        raise SettingsError(f"--http-port and --grpc-port are both {request.http_port}; give two different ports.")
    for flag, port in (("--http-port", request.http_port), ("--grpc-port", request.grpc_port)):
        if not 1 <= port <= 65535:
            raise SettingsError(f"{flag} {port} is not a TCP port (1-65535).")
        _check_port_free(flag, request.address, port)
    repo = request.repository
    if "://" in repo and not repo.startswith("s3://"):
        raise SettingsError(f"REPO {repo!r}: only a folder or an s3:// repository can be served here (scheme {repo.split('://')[0]!r} "
                            "is not supported); copy the repository to a folder or to S3-compatible storage.")
    if not repo.startswith("s3://") and not Path(repo).is_dir():
        raise RepositoryError(f"REPO {repo!r} is not a directory; give the Triton model repository to serve (export publishes into "
                              "./model_repository by default).")


def _check_port_free(flag: str, address: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as err:
            raise SettingsError(f"{flag} {port}: cannot listen on {address}:{port} ({err.strerror}); another process uses it. "
                                f"Choose another {flag}.") from err


def serve(request: ServeRequest, on_started: Callable[[Serving], None], log_sink: Callable[[bytes], None] | None = None,
          poll_s: float = 0.5) -> int:
    """Start the server, call `on_started`, stream its log to `log_sink` and wait until Ctrl-C/SIGTERM (returns 0) or until
    the server exits by itself (ValidationError with its error lines). The server is always stopped on the way out."""
    from optimizer.triton.runtime.install import find_triton, homes_root, prepare_home
    from optimizer.triton.runtime.server import LocalTritonServer, error_lines

    check_request(request)
    home = prepare_home(find_triton(), homes_root(request.cache_dir))
    with tempfile.TemporaryDirectory(prefix="aitune-serve-") as tmp:
        where, env, notes = _repository_for_server(request.repository, Path(tmp))
        log_path = Path(tmp) / "tritonserver.log"
        server = LocalTritonServer(where, log_path=log_path, home=home, env=env, startup_timeout_s=600.0,
                                   http_port=request.http_port, grpc_port=request.grpc_port,
                                   model_control_mode=request.model_control_mode,
                                   load_models=("*",) if request.model_control_mode == "explicit" else (),
                                   address=request.address)
        offset = 0
        try:
            server.start()
            on_started(Serving(server.http_url, server.grpc_url, str(where), request.model_control_mode, log_path, notes))
            while server.alive:
                offset = _tail(log_path, offset, log_sink)
                time.sleep(poll_s)
            _tail(log_path, offset, log_sink)
            raise ValidationError(f"tritonserver exited by itself: {error_lines(server.log_text()) or 'no error in its log'}")
        except KeyboardInterrupt:
            log.info("stopping tritonserver pid %s", server.pid)
            return 0
        finally:
            code = server.stop()
            _tail(log_path, offset, log_sink)
            log.info("tritonserver stopped (status %s)", code)


def _tail(path: Path, offset: int, sink: Callable[[bytes], None] | None) -> int:
    """Pass the log's new bytes to `sink`; returns the new offset."""
    if sink is None:
        return offset
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    if data:
        sink(data)
    return offset + len(data)


def _repository_for_server(repo: str, work: Path) -> tuple[str, dict[str, str] | None, list[str]]:
    """What --model-repository gets, the server's extra environment, and notes on what was changed for the local core."""
    if repo.startswith("s3://"):
        from optimizer.triton.repository.object_store import ObjectStore, parse_location

        store = ObjectStore(parse_location(repo, "REPO"), RepositoryError)
        store.check()
        return store.triton_url(), store.triton_environment(), []
    return _local_view(Path(repo).resolve(), work / "repository")


def _local_view(repository: Path, view: Path) -> tuple[str, None, list[str]]:
    """The repository itself, or (a model the 2.51 core cannot load as published) a private view of it."""
    from optimizer.triton.runtime.local_serving import local_config, needs_translation, private_model, translation_note
    from optimizer.triton.config.model_config import canonical, parse

    translate = {}
    for config_path in sorted(repository.glob("*/config.pbtxt")):
        try:
            config = parse(config_path.read_text(), str(config_path))
        except (TemplateError, OSError):
            continue  # Triton reports it when the model is loaded
        if needs_translation(config):
            translate[config_path.parent.name] = config
    if not translate:
        return str(repository), None, []
    view.mkdir(parents=True)
    for entry in sorted(repository.iterdir()):
        if entry.is_dir() and entry.name not in translate:
            os.symlink(entry, view / entry.name)
    notes = []
    for name, config in translate.items():
        private_model(repository / name, view, name, canonical(local_config(config)))
        notes.append(f"{name}: {translation_note(config)}")
    notes.append(f"serving a private view of {repository} ({view}); models added to the repository after the start are not in it")
    return str(view), None, notes


def stderr_sink(data: bytes) -> None:
    """Write server log bytes to stderr as they come (the foreground server's log, as tritonserver prints it)."""
    sys.stderr.buffer.write(data)
    sys.stderr.buffer.flush()
