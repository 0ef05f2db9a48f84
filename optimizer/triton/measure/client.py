"""The tritonclient side of validation: one place that knows how the HTTP and gRPC clients differ."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np

from optimizer.errors import ValidationError
from optimizer.model.dtypes import dtype_from_name
from optimizer.model.samples import Feed
from optimizer.triton.runtime.server import LocalTritonServer, triton_message

log = logging.getLogger(__name__)


def served_config(client: Any, name: str) -> dict[str, Any]:
    """The config Triton actually serves (after its auto-completion), as a dict."""
    config = client.get_model_config(name) if _is_http(client) else client.get_model_config(name, as_json=True)
    return config.get("config", config)


def config_summary(served: dict[str, Any]) -> dict[str, Any]:
    """The served config's keys that decide how the model runs, for the record (empty ones left out)."""
    keys = ("platform", "backend", "runtime", "max_batch_size", "dynamic_batching", "instance_group", "parameters")
    return {k: served.get(k) for k in keys if served.get(k) not in (None, "", {}, [])}


def max_batch(served: dict[str, Any]) -> int:
    """The served max_batch_size (0: the model does not batch)."""
    return int(served.get("max_batch_size") or 0)


def _is_http(client: Any) -> bool:
    return type(client).__module__.startswith("tritonclient.http")


_TRITON_ONLY = {"TYPE_STRING": (np.dtype(object), "BYTES"), "TYPE_UINT16": (np.dtype(np.uint16), "UINT16"),
                "TYPE_UINT32": (np.dtype(np.uint32), "UINT32"), "TYPE_UINT64": (np.dtype(np.uint64), "UINT64")}
"""Config types a served model may use that no model exported here has (so the project's dtype table leaves them out)."""


def wire_dtype(data_type: str) -> tuple[np.dtype, str]:
    """A config data_type's numpy dtype and its HTTP/gRPC datatype: TYPE_STRING travels as BYTES, numpy objects holding bytes."""
    if data_type in _TRITON_ONLY:
        return _TRITON_ONLY[data_type]
    dt = dtype_from_name(data_type)
    return dt.numpy, dt.triton_wire


def as_sent(arr: np.ndarray, spec: dict[str, Any], batching: bool) -> np.ndarray:
    """A sample in the shape the config declares: an input with `reshape` (a per-sample scalar is `dims: [1] reshape
    { shape: [] }`) is sent in the config's dims, and Triton reshapes it back for the model."""
    if "reshape" not in spec:
        return arr
    dims = [int(d) for d in spec.get("dims", [])]
    shape = ([arr.shape[0]] if batching and arr.ndim else []) + dims
    if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) != arr.size:
        return arr  # dynamic dims or another element count: sent as it is, and Triton says what it expected
    return arr.reshape(shape)


_sequence_ids = itertools.count(1)


def one_request_sequence(served: dict[str, Any]) -> dict[str, Any]:
    """For a model with a sequence batcher (Triton refuses a request without a correlation ID): the request is a whole
    sequence of its own, with a new ID (a string where the CORRID control says TYPE_STRING); else nothing."""
    batcher = served.get("sequence_batching")
    if batcher is None:
        return {}
    sequence_id: int | str = next(_sequence_ids)
    for control_input in batcher.get("control_input", []):
        for control in control_input.get("control", []):
            if control.get("kind") == "CONTROL_SEQUENCE_CORRID" and control.get("data_type") == "TYPE_STRING":
                sequence_id = f"aitune-{sequence_id}"
    return {"sequence_id": sequence_id, "sequence_start": True, "sequence_end": True}


def infer(client: Any, name: str, served: dict[str, Any], feed: Feed) -> list[np.ndarray]:
    """One request; outputs in the config's order. Raises tritonclient's InferenceServerException."""
    if _is_http(client):
        import tritonclient.http as tc
    else:
        import tritonclient.grpc as tc  # type: ignore[no-redef]
    inputs = []
    for spec in served.get("input", []):
        arr = np.ascontiguousarray(as_sent(feed[spec["name"]], spec, max_batch(served) > 0))
        item = tc.InferInput(spec["name"], list(arr.shape), wire_dtype(spec["data_type"])[1])
        item.set_data_from_numpy(arr)
        inputs.append(item)
    names = [o["name"] for o in served.get("output", [])]
    result = client.infer(name, inputs, outputs=[tc.InferRequestedOutput(n) for n in names], **one_request_sequence(served))
    return [result.as_numpy(n) for n in names]


def infer_batched(client: Any, name: str, served: dict[str, Any], feed: Feed) -> list[np.ndarray]:
    """A feed larger than max_batch_size is sent in allowed slices and the answers concatenated."""
    mbs = max_batch(served)
    rows = next(iter(feed.values())).shape[0] if mbs > 0 else 0
    if mbs <= 0 or rows <= mbs:
        return infer(client, name, served, feed)
    parts = [infer(client, name, served, {k: v[i:i + mbs] for k, v in feed.items()}) for i in range(0, rows, mbs)]
    return [np.concatenate(chunks) for chunks in zip(*parts)]


def _statistics(client: Any, name: str) -> dict[str, Any] | None:
    try:
        stats = client.get_inference_statistics(name) if _is_http(client) else client.get_inference_statistics(name, as_json=True)
        return stats["model_stats"][0]
    except Exception as err:  # statistics are extra information; their absence is not a failed check
        log.debug("statistics of %s: %s", name, err)
        return None


def request_ms(client: Any, name: str) -> float | None:
    """The server's mean request latency so far (the answer checks), from its statistics API."""
    success = ((_statistics(client, name) or {}).get("inference_stats") or {}).get("success") or {}
    count, ns = int(success.get("count", 0) or 0), int(success.get("ns", 0) or 0)
    return ns / count / 1e6 if count else None


def execution_counts(client: Any, name: str) -> tuple[int, int] | None:
    """(inference count, execution count) from the server's statistics API."""
    entry = _statistics(client, name)
    return (int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0))) if entry else None


def load_remote(client: Any, name: str) -> None:
    """A running server: use the model if it is ready, else ask the server to load it (explicit mode only)."""
    from tritonclient.utils import InferenceServerException

    try:
        if client.is_model_ready(name):
            return
        client.load_model(name)
    except InferenceServerException as err:
        raise ValidationError(f"Triton could not load model {name!r}: {triton_message(err)}") from err
    if not client.is_model_ready(name):
        raise ValidationError(f"model {name!r} is not ready on the server after loading.")


def server_version(server: LocalTritonServer) -> str:
    """The local server's version for the record ("2.51" when its metadata does not say)."""
    try:
        return str(server.client("http").get_server_metadata().get("version", "2.51"))
    except Exception as err:  # metadata is cosmetic: never fail a validation over it
        log.debug("server metadata: %s", err)
        return "2.51"


def ready_versions(client: Any, name: str) -> list[int]:
    """The versions of `name` the server holds READY (its version_policy decides how many), ascending; [] when unknown."""
    try:
        index = client.get_model_repository_index() if _is_http(client) else client.get_model_repository_index(as_json=True).get("models", [])
    except Exception as err:  # the index is extra information; its absence is not a failed check
        log.debug("repository index: %s", err)
        return []
    return sorted(int(m["version"]) for m in index if m.get("name") == name and m.get("state") == "READY" and str(m.get("version", "")).isdigit())


def response_cache_enabled(served: dict[str, Any]) -> bool:
    """Whether the served config asks for Triton's response cache (which needs the server's --cache-config to act)."""
    return bool((served.get("response_cache") or {}).get("enable"))
