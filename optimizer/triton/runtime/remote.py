"""A user's running Triton (`export --url`): what it is, and whether the served search can load variants on it.

The served search loads each variant through the repository API with its config and files in the request, so the
server needs no shared disk, only --model-control-mode=explicit. Anything that would make the search fail later
(unreachable, no repository API, models polled from disk) is found here, before tuning, and said in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimizer.errors import ServerError

PROBE_NAME = "aitune_export__mode_probe"
"""A model name no repository holds: loading it answers 'not found' in explicit mode and 'not allowed' in none/poll mode."""
POLLING = "not allowed if polling is enabled"


@dataclass(frozen=True)
class ServerFacts:
    """What the server said about itself: where, over which protocol, its version and extensions."""

    url: str
    protocol: str
    version: str
    extensions: tuple[str, ...]

    @property
    def release(self) -> str | None:
        """The YY.MM release whose server version this is (records/triton_releases.py), None when the table has none."""
        from optimizer.records.triton_releases import RELEASES

        return next((r.release for r in RELEASES.values() if r.triton.value and str(r.triton.value).split(".")[:2] == self.version.split(".")[:2]), None)

    def describe(self) -> str:
        release = f" (release {self.release})" if self.release else ""
        return f"Triton {self.version}{release} at {self.url} ({self.protocol})"


def probe_server(url: str, protocol: str = "http", timeout_s: float = 10.0) -> ServerFacts:
    """Reach the server, read its metadata and check it loads models on request; ServerError (one line) otherwise."""
    from optimizer.triton.runtime.server import open_client, triton_message

    if protocol not in ("http", "grpc"):
        raise ServerError(f"--protocol {protocol!r} is not http or grpc.")
    if "://" in url:
        raise ServerError(f"--url {url!r} takes HOST:PORT without a scheme, e.g. --url 127.0.0.1:8000 (HTTP) or :8001 with --protocol grpc.")
    try:
        client = open_client(protocol, url, timeout_s)
    except Exception as err:  # a malformed address
        raise ServerError(f"--url {url!r} is not a HOST:PORT tritonclient can use ({err}).") from None
    try:
        try:
            live = client.is_server_live()
        except Exception as err:  # connection refused, timeout, a server speaking another protocol
            raise ServerError(f"cannot reach a Triton at {url} over {protocol} ({_short(err)}); start it (aitune-export serve, or "
                              f"tritonserver --model-control-mode=explicit) or fix --url/--protocol.") from None
        if not live:
            raise ServerError(f"the Triton at {url} answers but is not live; wait for it to start, then export again.")
        meta = _as_dict(client.get_server_metadata())
        extensions = tuple(meta.get("extensions") or ())
        if "model_repository" not in extensions:
            raise ServerError(f"the Triton at {url} has no model repository API (extensions: {', '.join(extensions) or 'none'}); "
                              "the served search loads variants through it.")
        try:
            client.load_model(PROBE_NAME)
        except Exception as err:
            if POLLING in triton_message(err):
                raise ServerError(f"the Triton at {url} was not started with --model-control-mode=explicit ({triton_message(err)}); "
                                  "restart it with --model-control-mode=explicit so the served search can load its variants.") from None
        else:  # a model of that name exists and was loaded: put it back as it was
            client.unload_model(PROBE_NAME)
        return ServerFacts(url, protocol, str(meta.get("version", "unknown")), extensions)
    finally:
        client.close()


def _as_dict(meta: Any) -> dict[str, Any]:
    """Server metadata as a dict (the HTTP client returns one, the gRPC client a protobuf message)."""
    if isinstance(meta, dict):
        return meta
    return {"version": getattr(meta, "version", ""), "extensions": list(getattr(meta, "extensions", []))}


def _short(err: BaseException) -> str:
    return " ".join(str(err).split())[:200] or type(err).__name__
