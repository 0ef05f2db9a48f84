"""What validate checks besides the answers (measure/answers.py): the export's samples in the served names, an oversize batch refused, a perf_analyzer window long enough."""

from __future__ import annotations

from typing import Any

import numpy as np

from optimizer.model.samples import Feed, load_feeds, tile_feed
from optimizer.records.triton_platforms import PLATFORMS
from optimizer.triton.runtime.perf_analyzer import PerfSettings
from optimizer.triton.runtime.server import triton_message
from optimizer.triton.measure.client import infer, max_batch, wire_dtype
from optimizer.triton.measure.validation.expectation import ExportReference

WINDOW_REQUESTS = 20
"""perf_analyzer windows are sized to hold about this many requests at concurrency 1."""
MAX_WINDOW_MS = 6000


def served_names(reference: ExportReference, served: dict[str, Any]) -> dict[str, str]:
    """Exported tensor name -> the name the served config uses (they differ on positional platforms such as torch_aoti,
    also when the local server serves one through a translated config that names only the backend)."""
    platform = PLATFORMS.get(served.get("platform") or served.get("backend") or "")
    positional = [f"INPUT__{i}" for i in range(len(reference.input_names))]
    by_name = [i.get("name") for i in served.get("input", [])] == positional != reference.input_names
    if not by_name and (platform is None or not platform.positional_io):
        return {}
    return {**{n: f"INPUT__{i}" for i, n in enumerate(reference.input_names)},
            **{n: f"OUTPUT__{i}" for i, n in enumerate(reference.output_names)}}


def reference_feeds(reference: ExportReference | None, served: dict[str, Any]) -> tuple[list[Feed], list[Feed] | None, list[str]]:
    """The export's feeds and reference outputs, or (no report) one feed made from the config's dims."""
    if reference is not None:
        feeds, outputs = load_feeds(reference.feeds), load_feeds(reference.outputs)
        points = reference.points if len(reference.points) == len(feeds) else [f"sample[{i}]" for i in range(len(feeds))]
        rename = served_names(reference, served)
        feeds = [{rename.get(k, k): a for k, a in f.items()} for f in feeds]
        outputs = [{rename.get(k, k): a for k, a in o.items()} for o in outputs]
        return feeds, outputs, points
    batching = max_batch(served) > 0
    rng = np.random.default_rng(0)
    feed = {}
    for spec in served.get("input", []):
        dims = [1 if int(d) < 0 else int(d) for d in spec.get("dims", [])]
        shape = ([1] if batching else []) + dims
        dt, _ = wire_dtype(spec["data_type"])
        if dt == np.dtype(object):  # TYPE_STRING: short UTF-8 text, as a client would send
            feed[spec["name"]] = np.full(shape, b"aitune", dtype=object)
        else:
            feed[spec["name"]] = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt)
    return [feed], None, ["generated from config"]


def check_oversize(client: Any, name: str, served: dict[str, Any], feed: Feed) -> dict[str, Any] | None:
    """A request of max_batch_size + 1 must be refused (None for a model that does not batch)."""
    from tritonclient.utils import InferenceServerException

    mbs = max_batch(served)
    if mbs <= 0:
        return None
    batch = mbs + 1
    try:
        infer(client, name, served, tile_feed(feed, batch))
    except InferenceServerException as err:
        return {"batch": batch, "refused": True, "message": triton_message(err), "note": ""}
    return {"batch": batch, "refused": False, "message": "",
            "note": f"a batch of {batch} was accepted although max_batch_size is {mbs}; the config does not limit what clients may send."}


def window_for(settings: PerfSettings, request_ms: float | None) -> int:
    """A perf_analyzer window long enough for about WINDOW_REQUESTS requests at concurrency 1 (a slow model
    needs longer windows to settle), never shorter than the settings' own, at most MAX_WINDOW_MS."""
    if not request_ms:
        return settings.measurement_interval_ms
    wanted = int(round(WINDOW_REQUESTS * request_ms / 100.0)) * 100
    return max(settings.measurement_interval_ms, min(MAX_WINDOW_MS, wanted))


def padding_words(reference: ExportReference) -> str:
    """How the prediction treats a backend that pads: full executions between multiples of the max, unless the queue
    delay outlasts one (then every batch fills; prediction.py)."""
    from optimizer.triton.measure.prediction import delay_fills

    if not reference.served_pads or reference.served_point is None:
        return ""
    if delay_fills(reference.served_curve, reference.served_point, reference.single_request_ms):
        return "; the backend pads, and its queue delay outlasts one full execution, so batches fill between multiples of the max"
    return "; a load that is not a multiple of the max batch pays for full executions (the backend pads)"
