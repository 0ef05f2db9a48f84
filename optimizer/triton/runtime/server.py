"""LocalTritonServer: the real tritonserver 2.51 from a prepared home (install.py) around one repository,
and the client helpers every caller of a server shares (open_client, triton_message, error_lines).

The server runs on free loopback ports in explicit model-control mode (a model that fails to load
gives Triton's own error text) and is always stopped on exit: clients closed, SIGTERM, a wait, then
SIGKILL of its process group; its python-backend shared-memory regions carry a per-server prefix and
are removed if the server could not remove them. Two servers at once never share a port or a region.
A server that dies hard (or dies with the process that started it) leaves nothing either: reclaim.py's watcher
clears its stubs and regions, and the next start reclaims what an earlier run's record names.

Over 400 lines because a server's start, its stop and its death are one life cycle whose steps share their state
(ports, the shared-memory prefix, the record reclaim.py reads); the client helpers at the end are short.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from optimizer.errors import ValidationError
from optimizer.task.isolation import parent_death_signal
from optimizer.triton.runtime.install import ServerHome, find_triton, prepare_home, server_environment
from optimizer.triton.runtime.reclaim import RUNNING_DIR, SHM_DIR, ServerRecord, pid_scope, reclaim, start_time, start_watcher, write_record

log = logging.getLogger(__name__)

SHM_PREFIX = "triton_python_backend_shm_region_"
"""Triton's python backend names its regions <prefix><n>; ours start with this plus a per-server token."""


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerFailure:
    """Why a start attempt ended: the exit status and the error lines of the server log."""

    returncode: int | None
    errors: str
    port_clash: bool


class LocalTritonServer:
    """A real tritonserver on free loopback ports serving `repository`; a context manager that always stops it.

    Args:
        repository: the model repository (nothing is written into it): a folder, or an s3:// URL in the form Triton's core
            reads (s3://host:port/bucket/prefix for an endpoint of one's own).
        env: variables added to the server's environment (the AWS_* credentials and region for an s3:// repository).
        log_path: where the server log goes (default: a temporary file removed with the server).
        startup_timeout_s: how long the server may take to answer /v2/health/live.
        load_timeout_s: how long loading one model may take.
        http_port, grpc_port: fixed ports (`aitune-export serve`); None: free loopback ports chosen per start.
        model_control_mode: Triton's --model-control-mode (explicit, none or poll).
        load_models: models loaded at start (--load-model, "*" for all; explicit mode only).
        address: the address both endpoints listen on.
    """

    exit_timeout_s = 10
    start_attempts = 3

    def __init__(self, repository: Path | str, *, log_path: Path | None = None, startup_timeout_s: float = 120.0,
                 load_timeout_s: float = 300.0, home: ServerHome | None = None, env: dict[str, str] | None = None,
                 http_port: int | None = None, grpc_port: int | None = None,
                 model_control_mode: str = "explicit", load_models: tuple[str, ...] = (), address: str = "127.0.0.1") -> None:
        remote = isinstance(repository, str) and repository.startswith("s3://")
        self.repository: Path | str = repository if remote else Path(repository).resolve()
        self._env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.load_timeout_s = load_timeout_s
        self._home = home
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path else None
        self.shm_prefix = f"{SHM_PREFIX}aitune{os.getpid()}x{secrets.token_hex(4)}_"
        self.http_port = self.grpc_port = 0
        self._fixed_ports = (http_port, grpc_port) if http_port and grpc_port else None
        self.model_control_mode = model_control_mode
        self._load_models = tuple(load_models)
        self.address = address
        self._proc: subprocess.Popen | None = None
        self._clients: list[Any] = []
        self._loader: Any = None
        self._record: Path | None = None
        self.home: ServerHome | None = None

    # -- addresses and clients --------------------------------------------------------------------
    @property
    def _client_host(self) -> str:
        return "127.0.0.1" if self.address in ("0.0.0.0", "127.0.0.1") else self.address

    @property
    def http_url(self) -> str:
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def client(self, protocol: str) -> Any:
        """A tritonclient for `protocol` ("http" or "grpc"), closed when the server stops."""
        client = open_client(protocol, self.http_url if protocol == "http" else self.grpc_url, self.load_timeout_s)
        self._clients.append(client)
        return client

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> LocalTritonServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it is live (no model is loaded yet: see `load`)."""
        if isinstance(self.repository, Path) and not self.repository.is_dir():
            raise ValidationError(f"model repository {str(self.repository)!r} is not a directory.")
        install = find_triton()
        self.home = self._home or prepare_home(install)
        reclaim(self.running_dir)  # before choosing ports: an earlier run's orphans may still hold them
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        env = {**server_environment(install), **self._env}
        failure = None
        for _ in range(self.start_attempts):
            failure = self._start_once(env)
            if failure is None:
                return
            if not failure.port_clash or self._fixed_ports:
                break
            log.info("a port was taken between choosing and binding it; retrying with new ports")
        assert failure is not None
        raise ValidationError(f"tritonserver exited while starting (status {failure.returncode}): {failure.errors or 'no error in its log'}; log: {self.log_path}")

    def _start_once(self, env: dict[str, str]) -> ServerFailure | None:
        assert self.home is not None and self.log_path is not None
        if self._fixed_ports:
            self.http_port, self.grpc_port = self._fixed_ports
        else:
            self.http_port, self.grpc_port = free_port(), free_port()
            while self.grpc_port == self.http_port:
                self.grpc_port = free_port()
        args = [
            str(self.home.binary),
            f"--model-repository={self.repository}",
            f"--model-control-mode={self.model_control_mode}",
            *(f"--load-model={m}" for m in self._load_models),
            "--exit-on-error=false",
            f"--backend-directory={self.home.backends}",
            f"--cache-directory={self.home.caches}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--http-address={self.address}", f"--http-port={self.http_port}",
            f"--grpc-address={self.address}", f"--grpc-port={self.grpc_port}",
            "--allow-metrics=false",
            f"--exit-timeout-secs={self.exit_timeout_s}",
        ]
        # if our process dies without stopping the server (SIGKILL, a crash), the kernel sends it SIGTERM. Linux ties
        # this to the starting *thread*: start the server from a thread that outlives it (the main thread, as validate does)
        stop_with_us = parent_death_signal(signal.SIGTERM)
        with open(self.log_path, "ab") as log_file:
            self._proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                          start_new_session=True, preexec_fn=stop_with_us)
        log.info("tritonserver pid %d on http %s grpc %s, repository %s", self._proc.pid, self.http_url, self.grpc_url, self.repository)
        self._watch()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                text = self.log_text()
                failure = ServerFailure(self._proc.returncode, error_lines(text), "already in use" in text)
                self._reap()
                self._forget()
                return failure
            if _http_ok(f"http://{self.http_url}/v2/health/live"):
                return None
            time.sleep(0.1)
        self.stop()
        raise ValidationError(f"tritonserver did not answer on {self.http_url} within {self.startup_timeout_s:.0f} s; log: {self.log_path}")

    @property
    def running_dir(self) -> Path:
        """Where this server's record lies (beside the server homes, shared by every run that uses them)."""
        assert self.home is not None
        return self.home.root.parent / RUNNING_DIR

    def _watch(self) -> None:
        """Record the new server and start its watcher, so that even a hard death of it, or of us with it, leaves nothing."""
        assert self._proc is not None and self.home is not None and self.log_path is not None
        server_start, owner_start = start_time(self._proc.pid), start_time(os.getpid())
        if server_start is None or owner_start is None:  # it already ended (its start failed); the start loop reports why
            return
        record = ServerRecord(self._proc.pid, server_start, os.getpid(), owner_start, str(self.home.root.resolve()), self.shm_prefix,
                              os.path.abspath(self.log_path), time.time(), *pid_scope())
        try:
            self._record = write_record(self.running_dir, record)
            start_watcher(self._record)
        except (OSError, subprocess.SubprocessError) as err:  # the server still works; only a hard death would leave leftovers
            log.warning("could not record tritonserver pid %d for cleanup after a hard exit (%s)", self._proc.pid, err)

    def load(self, name: str) -> None:
        """Load one model and wait until it is ready; a failure raises ValidationError with Triton's own text."""
        from tritonclient.utils import InferenceServerException

        client = self._load_client()
        t0 = time.monotonic()
        try:
            client.load_model(name)
        except InferenceServerException as err:
            self.check_alive()
            raise ValidationError(f"Triton could not load model {name!r}: {triton_message(err)}{self._poll_reason(name)}") from err
        while not client.is_model_ready(name):
            self.check_alive()
            if time.monotonic() - t0 > self.load_timeout_s:
                raise ValidationError(f"model {name!r} was not ready {self.load_timeout_s:.0f} s after loading; log: {self.log_path}")
            time.sleep(0.1)
        log.info("loaded %s in %.1f s", name, time.monotonic() - t0)

    def _poll_reason(self, name: str) -> str:
        """Why the repository poll refused the model (its config), from the log: the client is told only "failed to poll"."""
        found = re.findall(rf"Poll failed for model directory '{re.escape(name)}': (.*?)\"?$", self.log_text(), re.M)
        return f" ({found[-1]})" if found else ""

    def reload(self, name: str) -> None:
        """Unload the model completely, then load it again (its config may have changed).

        Triton's own reload keeps the old instances until the new ones are ready; with the python backend,
        old and new stubs of one model then run side by side under the same instance names, and 2.51 was
        seen to abort (boost lock_exception) right after such an overlap. Unloading first avoids it.
        """
        client = self._load_client()
        t0 = time.monotonic()
        if client.is_model_ready(name):
            client.unload_model(name)
            while any(m.get("name") == name and m.get("state") in ("READY", "UNLOADING") for m in client.get_model_repository_index()):
                self.check_alive()
                if time.monotonic() - t0 > self.load_timeout_s:
                    raise ValidationError(f"model {name!r} was still unloading {self.load_timeout_s:.0f} s later; log: {self.log_path}")
                time.sleep(0.1)
        self.load(name)

    def _load_client(self) -> Any:
        if self._loader is None:  # one client for every load: a search reloads the model once per variant
            self._loader = self.client("http")
        return self._loader

    @property
    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self._proc is not None and self._proc.poll() is None

    def check_alive(self) -> None:
        """A server that died (a backend aborted it) is an error naming its log, not a wait until a timeout."""
        if self._proc is not None and self._proc.poll() is not None:
            raise ValidationError(f"tritonserver exited with status {self._proc.returncode} "
                                  f"({error_lines(self.log_text()) or 'see its log'}); log: {self.log_path}")

    def stop(self) -> int | None:
        """Unload the models, close clients, SIGTERM, wait, SIGKILL the process group as a fallback, remove our shm regions.
        Idempotent."""
        self._unload_all()
        for client in self._clients:
            try:
                client.close()
            except Exception as err:  # a broken connection must not keep the server alive
                log.debug("closing a client: %s", err)
        self._clients.clear()
        self._loader = None
        code = None
        if self._proc is not None:
            code = self._terminate()
            self._proc = None
        self._remove_regions()
        self._forget()
        if self._own_log and self.log_path is not None and code == 0:
            self.log_path.unlink(missing_ok=True)
        return code

    def _unload_all(self, timeout_s: float = 5.0) -> None:
        """Unload every model first (explicit mode): Triton's shutdown checks its live models once a second, so a server
        with none left exits at once instead of after a few of those checks. Best effort within `timeout_s` on a
        short-timeout client: SIGTERM follows regardless."""
        if self.model_control_mode != "explicit" or not self.alive:
            return
        deadline = time.monotonic() + timeout_s
        client = None
        try:
            client = open_client("http", self.http_url, timeout_s)
            for model in client.get_model_repository_index():
                if model.get("state") == "READY" and time.monotonic() < deadline:
                    client.unload_model(model["name"])
            while self.alive and time.monotonic() < deadline and any(
                    m.get("state") in ("READY", "UNLOADING") for m in client.get_model_repository_index()):
                time.sleep(0.02)
        except Exception as err:  # a dying or hung server: SIGTERM and the fallbacks take over
            log.debug("unloading before the stop: %s", err)
        finally:
            if client is not None:
                client.close()

    def _terminate(self) -> int | None:
        proc = self._proc
        assert proc is not None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_exited(proc.pid, self.exit_timeout_s + 10):
                log.warning("tritonserver pid %d ignored SIGTERM; killing its process group", proc.pid)
        # the group leader is not reaped yet, so its pid (= the group id) cannot have been reused
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # python stubs that outlived the server
        except (ProcessLookupError, PermissionError):
            pass
        return self._reap()

    def _reap(self) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def _forget(self) -> None:
        if self._record is not None:
            self._record.unlink(missing_ok=True)
            self._record = None

    def _remove_regions(self) -> None:
        for region in SHM_DIR.glob(f"{self.shm_prefix}*"):
            log.info("removing shared-memory region %s left by tritonserver", region.name)
            region.unlink(missing_ok=True)

    def regions(self) -> list[Path]:
        """This server's python-backend shared-memory regions (one per model instance while it runs)."""
        return sorted(SHM_DIR.glob(f"{self.shm_prefix}*"))


def _wait_exited(pid: int, timeout_s: float) -> bool:
    """Wait for a child to exit without reaping it (so its process group id stays reserved)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None:
            return True
        time.sleep(0.05)
    return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def open_client(protocol: str, url: str, timeout_s: float = 300.0) -> Any:
    """A tritonclient InferenceServerClient for HTTP or gRPC with generous timeouts (a busy CPU server is slow)."""
    if protocol == "http":
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(url)
    raise ValueError(f"unknown protocol {protocol!r}")


_PY_TRACE = re.compile(r"\s+At:\s+\S+\.py\(\d+\).*$", re.DOTALL)


def triton_message(err: Any) -> str:
    """Triton's own error text from an InferenceServerException, on one line (a python model's stack trace dropped)."""
    text = err.message() if hasattr(err, "message") and callable(err.message) else str(err)
    return _PY_TRACE.sub("", " ".join(str(text).split())).rstrip(" ;")


_ERROR_LINE = re.compile(r"^(E\d{4}|error:)")
_HARMLESS = ("CUDA driver", "CudaDriverHelper", "NVML", "DCGM", "pinned", "unable to create stream")


def error_lines(text: str, limit: int = 5) -> str:
    """The server log's error lines (without the harmless no-GPU noise), joined on one line."""
    lines = [l.strip() for l in text.splitlines() if _ERROR_LINE.match(l.strip()) and not any(h in l for h in _HARMLESS)]
    return " | ".join(lines[-limit:])
