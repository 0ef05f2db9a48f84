"""perf_analyzer's --input-data JSON from real samples: exact bytes (base64) with explicit shapes, so the served model
is measured on the data it was tuned on, and dynamic axes need no --shape."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from optimizer.errors import ValidationError
from optimizer.model.samples import Feed, load_feeds
from optimizer.model.signature import Signature
from optimizer.model.traffic import Traffic, load_timestamps
from optimizer.records.tune_result import TuneResult

MAX_INPUT_ENTRIES = 64
"""perf_analyzer cycles through the entries round-robin: the traffic's subsample (model/traffic.SENT_REQUESTS) fits."""


def write_input_data(path: Path, feeds: Iterable[dict[str, np.ndarray]], batching: bool, max_entries: int = MAX_INPUT_ENTRIES) -> Path:
    """Write perf_analyzer's --input-data JSON from feeds (dicts of arrays keyed by input name).

    With `batching`, axis 0 of every array is the batch axis: each row becomes one entry (a batch-1
    request; `-b N` makes perf_analyzer send N of them per request). Without it, each feed is one
    entry with its full shape. Data are the arrays' exact little-endian bytes (base64) with an
    explicit "shape", so dynamic axes need no --shape. A trace's "timestamp" is never written: perf_analyzer 2.51 takes
    it for an input the model lacks and refuses the file; the schedule goes in --request-intervals. Returns `path`.
    """
    entries: list[dict[str, Any]] = []
    for feed in feeds:
        rows = next(iter(feed.values())).shape[0] if batching else 1
        for i in range(rows):
            if len(entries) >= max_entries:
                break
            entry = {}
            for name, arr in feed.items():
                if name == "timestamp" and not isinstance(arr, np.ndarray):  # an arrival time, not an input
                    continue
                one = arr[i] if batching else arr
                if batching and one.ndim == 0:  # a per-sample scalar: its config says dims [1] (reshape { shape: [] })
                    one = one.reshape(1)
                if one.dtype == np.dtype(object):  # BYTES (TYPE_STRING): perf_analyzer takes a list of strings
                    text = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in one.ravel()]
                    entry[name] = {"content": text, "shape": list(one.shape)}
                    continue
                one = np.ascontiguousarray(one, dtype=one.dtype.newbyteorder("<"))
                entry[name] = {"content": {"b64": base64.b64encode(one.tobytes()).decode("ascii")}, "shape": list(one.shape)}
            entries.append(entry)
    if not entries:
        raise ValidationError("no samples to write as perf_analyzer input data; the report's samples.npz is empty.")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        json.dump({"data": entries}, tmp)
    os.replace(tmp.name, path)  # two writers never interleave; a reader never sees half a file
    return path


def traffic_requests(result: TuneResult, padding: dict[str, Any] | None = None) -> tuple[list[Feed], str]:
    """The requests every served measurement sends, batch-1 each, in the exported names: the run's traffic (padded to the
    bucket edges of `padding`, the served search's client_padding, when clients are told to pad), subsampled so every
    shape keeps its share; and a line saying what they are. A report written before traffic was recorded: the profiled
    sample."""
    path = result.reference.traffic
    if not path or not Path(path).is_file():
        feeds = load_feeds(Path(result.reference.profile_feed))[:1]
        return feeds, "the profiled sample"
    signature = Signature.from_json(result.signature)
    summary = result.traffic or {}
    traffic = Traffic(tuple(load_feeds(Path(path))), summary.get("source", "file"), summary.get("origin", "the traffic"))
    if padding:
        traffic = traffic.padded(signature, list(padding["edges"]))
    sent = traffic.sent()
    shapes = len({tuple(a.shape for a in f.values()) for f in sent})
    return sent, f"{traffic.origin} ({len(sent)} of {len(traffic.requests)} requests sent round-robin, {shapes} shape{'s' if shapes != 1 else ''})"


def trace_of(result: TuneResult, padding: dict[str, Any] | None = None) -> tuple[list[Feed], list[float]] | None:
    """A trace's requests in the trace's order (every one: its schedule is theirs, so no subsample) with their timestamps
    in ms, in the exported names; None when the run's traffic has no timestamps. Write them with write_input_data(...,
    max_entries=len(feeds)) and their schedule with perf_analyzer_rate.trace_gaps_us."""
    path = result.reference.traffic
    stamps = load_timestamps(path) if path and Path(path).is_file() else None
    if stamps is None:
        return None
    feeds = load_feeds(Path(path))
    if padding:
        signature = Signature.from_json(result.signature)
        feeds = list(Traffic(tuple(feeds), "file", "").padded(signature, list(padding["edges"])).requests)
    return feeds, list(stamps)
