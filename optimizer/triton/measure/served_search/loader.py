"""Config variants loaded under private names through Triton's repository API, on the bundled server or a user's.

A variant is the model's config with another batcher or instance layout. It is loaded as its own model
(`<name>__aitune_<k>`) with the config in the load request (Triton's load with a `config` override), so
nothing is rewritten, the incumbent is never unloaded to try a neighbour, and two variants can be measured
back to back (A B A B) without a reload between them. Where the server reads our disk (the bundled one), each
private name is a folder of links to the artifact's files; where it does not (a user's server), the files
go in the request too (`file:` overrides). Every variant this loader loaded is unloaded when it closes,
whatever ended the search (Ctrl-C included).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Callable

from optimizer.errors import ValidationError

log = logging.getLogger(__name__)

PRIVATE_TAG = "__aitune_"
"""Private variant names are <model>__aitune_<k>: never a name a user publishes (the export refuses it as a model name)."""


def private_name(model: str, index: int) -> str:
    """The private name of a model's k-th variant."""
    return f"{model}{PRIVATE_TAG}{index}"


def config_json(text: str, name: str) -> str:
    """A config.pbtxt as the JSON a load request carries (model_config.proto field names), renamed to `name`."""
    from google.protobuf import json_format

    from optimizer.triton.config.model_config import parse

    config = parse(text)
    config.name = name
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


class VariantLoader:
    """Loads config variants under private names and unloads every one it loaded; a context manager.

    Args:
        url: the server's endpoint (host:port) for `protocol` ("http" or "grpc").
        place: called with a private name (and whether it takes the model's files) before it is loaded, where the server reads
            our disk (links the files there).
        files: the model's files as `file:` overrides ({"1/model.onnx": bytes}), where it does not.
        check_alive: raises when the server is gone (a local server's exit), so a load never waits for a dead server.
        parallel: how many variants load at once (Triton loads models on several threads).
    """

    def __init__(self, url: str, *, protocol: str = "http", place: Callable[[str, bool], None] | None = None,
                 files: dict[str, bytes] | None = None, check_alive: Callable[[], None] = lambda: None, timeout_s: float = 300.0,
                 parallel: int = 4) -> None:
        self.url = url
        self.protocol = protocol
        self._place = place
        self._files = {f"file:{k}": v for k, v in (files or {}).items()} or None
        self._check_alive = check_alive
        self.timeout_s = timeout_s
        self.parallel = max(1, parallel)
        self.loaded: set[str] = set()
        self.leaving: set[str] = set()  # unloaded without waiting: the next load waits for them (unload)
        self._client: Any = None
        self._sources: dict[str, tuple[Callable[[str, bool], None] | None, dict[str, bytes] | None]] = {}

    def add_source(self, candidate: str, place: Callable[[str, bool], None] | None = None, files: dict[str, bytes] | None = None) -> None:
        """Another candidate's artifact that variants may be loaded from (`load(..., candidate=...)`): its place, or its files."""
        self._sources[candidate] = (place, {f"file:{k}": v for k, v in (files or {}).items()} or None)

    def __enter__(self) -> VariantLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def client(self) -> Any:
        """One client for the repository calls (loads run on their own clients, one per thread)."""
        if self._client is None:
            from optimizer.triton.runtime.server import open_client

            self._client = open_client(self.protocol, self.url, self.timeout_s)
        return self._client

    def load(self, configs: dict[str, str], files: dict[str, bytes] | None = None, candidate: str = "") -> dict[str, str]:
        """Load each private name with its config text (config.pbtxt form); returns name -> Triton's error for those that failed.

        `files` replaces the model's files for these loads (an ensemble front's version folder marker); None: the model's
        (`candidate`'s, when one was added with add_source)."""
        from optimizer.triton.runtime.server import open_client, triton_message

        place, own = self._sources.get(candidate, (self._place, self._files)) if candidate else (self._place, self._files)
        overrides = own if files is None else ({f"file:{k}": v for k, v in files.items()} if own is not None else None)

        def one(item: tuple[str, str]) -> tuple[str, str]:
            name, text = item
            if place is not None:
                place(name, files is None)
            client = open_client(self.protocol, self.url, self.timeout_s)
            try:
                client.load_model(name, config=config_json(text, name), files=overrides)
                self.loaded.add(name)
                return name, ""
            except Exception as err:  # InferenceServerException, or a connection the server closed while it died
                self.loaded.add(name)  # a half-loaded model is unloaded at the end too
                return name, triton_message(err)
            finally:
                client.close()

        t0 = time.monotonic()
        with ThreadPoolExecutor(min(self.parallel, len(configs)) or 1) as pool:
            errors = {name: err for name, err in pool.map(one, configs.items()) if err}
        self._check_alive()
        self._wait_gone()  # what the last group left is gone before anything loaded here is measured
        log.info("loaded %d variant(s) in %.1f s", len(configs) - len(errors), time.monotonic() - t0)
        return errors

    def unload(self, names: list[str] | set[str], wait: bool = True) -> None:
        """Unload these private names and wait until the server has let them go (their instances stop using the CPU).

        `wait` False leaves the waiting to the next load, which waits once its own variants are loaded, so that the
        two overlap and nothing is measured while a model is still going. Why: the python backend takes a while to let
        stand-in variants go, almost all of it idle, so waiting for it in turn with the next group's load would about
        double each group's loading time."""
        names = [n for n in names if n in self.loaded]
        if not names:
            return
        client = self.client()
        for name in names:
            try:
                client.unload_model(name)
            except Exception as err:  # the server is gone or never had it: nothing left to unload
                log.debug("unloading %s: %s", name, err)
            self.loaded.discard(name)
        self.leaving.update(names)
        if wait:
            self._wait_gone()

    def _wait_gone(self) -> None:
        """Wait until every variant unloaded so far has left the server's index of live models."""
        if not self.leaving:
            return
        client = self.client()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                index = _index(client)
            except Exception:
                self.leaving.clear()
                return
            if not any(m.get("name") in self.leaving and m.get("state") in ("READY", "UNLOADING", "LOADING") for m in index):
                self.leaving.clear()
                return
            time.sleep(0.05)
        raise ValidationError(f"the server did not unload {', '.join(sorted(self.leaving))} within {self.timeout_s:.0f} s")

    def runtime(self, name: str) -> str:
        """The loaded variant's config `runtime` as the server filled it in ("model.py": a Python-based backend ran it)."""
        try:
            config = self.client().get_model_config(name)
        except Exception:
            return ""
        if not isinstance(config, dict):  # the gRPC client's ModelConfigResponse
            return str(getattr(getattr(config, "config", None), "runtime", ""))
        return str(config.get("runtime", ""))

    def close(self) -> None:
        """Unload every variant still loaded and close the client; never raises (it runs while an error propagates)."""
        try:
            self.unload(set(self.loaded))
            self._wait_gone()
        except Exception as err:
            log.warning("could not unload the served search's variants: %s", err)
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                pass
            self._client = None


def _index(client: Any) -> list[dict[str, Any]]:
    """The repository index as dicts (the HTTP client returns them, the gRPC client a message)."""
    index = client.get_model_repository_index()
    if isinstance(index, list):
        return index
    return [{"name": m.name, "state": m.state} for m in index.models]


def server_gone(error: str) -> bool:
    """Whether a load failed because the server is going away (its connection closed or refused, or it is stopping)."""
    return any(word in error.lower() for word in ("connection closed", "connection refused", "connection reset", "stopping", "shutting down"))
