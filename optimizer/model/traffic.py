"""The traffic a model is tuned for: requests as clients send them, each with its own shape.

One description feeds in-process profiling (at its representative shapes), the served search, `validate` and the
benchmarks. It comes from, in order: `--traffic FILE` (perf_analyzer's --input-data JSON, one entry per request), the
requests in `--samples` (each recorded row one request), or a generated spread of every dynamic axis over its range.
Triton's dynamic batcher batches only requests of equal shape, so the mix of shapes decides what a config serves.
An entry may carry "timestamp" (milliseconds, perf_analyzer's input-data field): the traffic is then a trace, replayed
on its own schedule or scaled to a rate keeping its bursts; the timestamps travel beside the requests, never in them.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.errors import TrafficError
from optimizer.model.samples import Feed, generate_tensor
from optimizer.model.signature import Signature, TensorSpec
from optimizer.records.traffic import TrafficSummary

GENERATED_REQUESTS = 64
"""Requests in a generated traffic: enough for its quantiles and a histogram, few enough to send round-robin."""
MAX_REQUESTS = 4096
"""A traffic file may hold at most this many requests (the measurements send a subsample that keeps the ratios)."""
SENT_REQUESTS = 64
"""What perf_analyzer and the warm-ups cycle through: a subsample of the traffic that keeps its shapes' ratios."""
GENERATED_HOW = "one draw per request, log-uniform over each dynamic axis's range (every dynamic axis moves together)"


@dataclass(frozen=True)
class Traffic:
    """Batch-1 requests (axis 0 of size 1 when the signature batches) and where they came from."""

    requests: tuple[Feed, ...]
    source: str  # "file", "samples" or "generated"
    origin: str  # in words: "--traffic t.json", "--samples s.npz", "generated: ..."
    timestamps_ms: tuple[float, ...] | None = None  # when each request arrived (a trace), in the order of `requests`

    # -- shapes ----------------------------------------------------------------------------------------------------
    @staticmethod
    def axes_of(signature: Signature) -> list[tuple[str, int]]:
        """(input, per-sample axis) of every dynamic axis, in input order."""
        return [(t.name, i) for t in signature.inputs for i in t.dynamic_axes]

    def sizes(self, signature: Signature) -> list[tuple[int, ...]]:
        """Each request's size on every dynamic axis (empty tuples when nothing is dynamic)."""
        skip = 1 if signature.batching else 0
        return [tuple(int(req[name].shape[skip + i]) for name, i in self.axes_of(signature)) for req in self.requests]

    def shape_label(self, signature: Signature, request: Feed) -> str:
        """A request's shape without the batch axis: "input_ids 36, attention_mask 36" (dynamic inputs only)."""
        skip = 1 if signature.batching else 0
        dynamic = [t for t in signature.inputs if t.dynamic_axes] or list(signature.inputs)
        return ", ".join(f"{t.name} {'x'.join(map(str, request[t.name].shape[skip:])) or 'scalar'}" for t in dynamic)

    def histogram(self, signature: Signature) -> list[tuple[str, int]]:
        """(shape label, requests) from the most common shape down."""
        counts = Counter(self.shape_label(signature, r) for r in self.requests)
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def representative(self, signature: Signature, quantile: float) -> Feed:
        """The request nearest the traffic's `quantile` on every dynamic axis (the median: 0.5): a real request, so its
        values are the traffic's own."""
        sizes = self.sizes(signature)
        if not sizes or not sizes[0]:
            return self.requests[0]
        target = [float(np.quantile([s[k] for s in sizes], quantile, method="nearest")) for k in range(len(sizes[0]))]
        best = min(range(len(sizes)), key=lambda j: (sum(abs(math.log(s) - math.log(t)) for s, t in zip(sizes[j], target)), j))
        return self.requests[best]

    def largest(self, signature: Signature) -> Feed:
        """The request with the most elements on its dynamic axes."""
        sizes = self.sizes(signature)
        return self.requests[max(range(len(sizes)), key=lambda j: (math.prod(sizes[j]) if sizes[j] else 0, -j))]

    def sent(self, limit: int = SENT_REQUESTS) -> list[Feed]:
        """At most `limit` requests, evenly spaced over the traffic sorted by shape, so every shape keeps its share."""
        reqs = list(self.requests)
        if len(reqs) <= limit:
            return reqs
        order = sorted(range(len(reqs)), key=lambda j: tuple(a.shape for a in reqs[j].values()))
        picked = sorted(order[int(k * len(order) / limit)] for k in range(limit))
        return [reqs[j] for j in picked]

    def summary(self, signature: Signature) -> TrafficSummary:
        """Plain data for report.json and report.md: where it came from, its histogram, its representative shapes."""
        axes = self.axes_of(signature)
        sizes = self.sizes(signature)
        quantiles: dict[str, dict[str, int]] = {}
        for label, q in (("median", 0.5), ("p90", 0.9)):
            request = self.representative(signature, q)
            quantiles[label] = {f"{name}[{i + (1 if signature.batching else 0)}]": int(request[name].shape[i + (1 if signature.batching else 0)])
                                for name, i in axes}
        quantiles["max"] = {f"{name}[{i + (1 if signature.batching else 0)}]": max(s[k] for s in sizes) for k, (name, i) in enumerate(axes)}
        return TrafficSummary(source=self.source, origin=self.origin, requests=len(self.requests),
                              dynamic_axes=[f"{name}[{i + (1 if signature.batching else 0)}]" for name, i in axes],
                              histogram=[[label, count] for label, count in self.histogram(signature)], shapes=quantiles,
                              **(trace_figures(self.timestamps_ms) if self.timestamps_ms else {}))

    # -- padding to buckets ----------------------------------------------------------------------------------------
    def bucket_edges(self, signature: Signature) -> list[int]:
        """Powers of two from the smallest dynamic size up, with each dynamic axis's maximum as the last edge."""
        sizes = [v for s in self.sizes(signature) for v in s]
        if not sizes:
            return []
        top = max(a.max for t in signature.inputs for a in t.axes if a.dynamic)
        edges, e = [], 1 << max(0, (min(sizes) - 1).bit_length())
        while e < top:
            edges.append(e)
            e *= 2
        return [*edges, top]

    def padded(self, signature: Signature, edges: list[int]) -> Traffic:
        """Every request padded with zeros on each dynamic axis up to the next bucket edge (within that axis's range)."""
        skip = 1 if signature.batching else 0
        out = []
        for req in self.requests:
            feed = {}
            for spec in signature.inputs:
                arr = req[spec.name]
                widths = [(0, 0)] * arr.ndim
                for i in spec.dynamic_axes:
                    size = arr.shape[skip + i]
                    to = min(next((e for e in edges if e >= size), size), spec.axes[i].max)
                    widths[skip + i] = (0, max(0, to - size))
                feed[spec.name] = np.pad(arr, widths) if any(w != (0, 0) for w in widths) else arr
            out.append(feed)
        return Traffic(tuple(out), self.source, f"{self.origin}, padded to {', '.join(map(str, edges))}", self.timestamps_ms)


# -- a trace: when each request arrived -----------------------------------------------------------------------------------
PEAK_WINDOW_S = 1.0
"""The peak rate is the most requests in any window this long (a tenth of the trace when it is shorter than ten of them)."""
TIMESTAMPS_SUFFIX = "_timestamps.json"
"""Saved traffic keeps its timestamps in this file beside its .npz (the .npz holds tensors only: every reader of it stays
as it was)."""


def trace_figures(timestamps_ms: tuple[float, ...] | list[float]) -> dict[str, float]:
    """A trace's mean rate (requests/s over its span), duration, burstiness (the gaps' coefficient of variation: 1 for
    Poisson arrivals, 0 for evenly spaced ones) and peak rate over a short window, for TrafficSummary."""
    stamps = np.asarray(timestamps_ms, dtype=float)
    span_s = float(stamps[-1] - stamps[0]) / 1000.0
    gaps = np.diff(stamps)
    window = PEAK_WINDOW_S if span_s >= 10 * PEAK_WINDOW_S else span_s / 10
    ends = np.searchsorted(stamps, stamps + window * 1000.0, side="left")
    peak = int((ends - np.arange(len(stamps))).max())
    return {"rate_per_s": round((len(stamps) - 1) / span_s, 3), "duration_s": round(span_s, 3),
            "burstiness": round(float(gaps.std() / gaps.mean()), 3), "peak_rate_per_s": round(peak / window, 3),
            "peak_window_s": round(window, 3)}


def timestamps_path(traffic_path: Path | str) -> Path:
    """Where a saved traffic's timestamps lie: beside its .npz."""
    path = Path(traffic_path)
    return path.with_name(path.stem + TIMESTAMPS_SUFFIX)


def save_traffic(path: Path, traffic: Traffic) -> None:
    """The requests as an .npz (save_feeds) and, for a trace, its timestamps beside it; a stale timestamps file is removed."""
    from optimizer.model.samples import save_feeds

    save_feeds(path, list(traffic.requests))
    stamps = timestamps_path(path)
    if traffic.timestamps_ms is None:
        stamps.unlink(missing_ok=True)
    else:
        stamps.write_text(json.dumps({"timestamp_ms": list(traffic.timestamps_ms)}))


def load_timestamps(traffic_path: Path | str | None) -> tuple[float, ...] | None:
    """The timestamps saved beside a traffic .npz (None: not a trace, or a report written before traces)."""
    if not traffic_path:
        return None
    path = timestamps_path(traffic_path)
    if not path.is_file():
        return None
    return tuple(float(t) for t in json.loads(path.read_text())["timestamp_ms"])


# -- where a traffic comes from -----------------------------------------------------------------------------------------
def traffic_for(signature: Signature, traffic_file: str | None, sample_feeds: list[Feed], samples_name: str | None, seed: int = 11) -> Traffic:
    """--traffic, else the requests in --samples, else a generated spread of every dynamic axis."""
    if traffic_file:
        return load_traffic(Path(traffic_file), signature)
    if sample_feeds:
        return Traffic(tuple(split_rows(sample_feeds, signature)), "samples", f"--samples {samples_name or 'the given samples'}")
    return generate_traffic(signature, seed=seed)


def split_rows(feeds: list[Feed], signature: Signature) -> list[Feed]:
    """Recorded feeds as batch-1 requests: each row of a batched feed is one request."""
    if not signature.batching:
        return list(feeds)
    return [{k: np.ascontiguousarray(v[i:i + 1]) for k, v in feed.items()} for feed in feeds for i in range(next(iter(feed.values())).shape[0])]


def generate_traffic(signature: Signature, requests: int = GENERATED_REQUESTS, seed: int = 11) -> Traffic:
    """`requests` generated requests, each dynamic axis log-uniform over its range (one draw per request moves every
    dynamic axis together, so inputs that share a length, such as token ids and their mask, stay equal); a model with no
    dynamic axis gets one shape."""
    rng = np.random.default_rng(seed)
    batch = 1 if signature.batching else None
    out = []
    dynamic = signature.is_dynamic
    for _ in range(requests if dynamic else min(requests, 8)):
        u = rng.uniform()
        feed = {}
        for spec in signature.inputs:
            dims = tuple(_log_uniform(a.min, a.max, u) if a.dynamic else a.min for a in spec.axes)
            feed[spec.name] = _tensor(spec, dims, batch, rng)
        out.append(feed)
    how = GENERATED_HOW if dynamic else "no dynamic axis: every request has the model's one shape"
    return Traffic(tuple(out), "generated", f"generated traffic ({how})")


def _log_uniform(low: int, high: int, u: float) -> int:
    return int(min(high, max(low, round(math.exp(math.log(low) + u * (math.log(high) - math.log(low)))))))


def _tensor(spec: TensorSpec, dims: tuple[int, ...], batch: int | None, rng: np.random.Generator) -> np.ndarray:
    """generate_tensor at explicit dims (a spec whose axes are pinned there)."""
    from dataclasses import replace

    from optimizer.model.signature import Axis

    pinned = replace(spec, axes=tuple(Axis(d, d) for d in dims))
    return generate_tensor(pinned, batch, "max", rng)


# -- perf_analyzer's --input-data JSON ------------------------------------------------------------------------------------
FORMAT_HINT = ('use perf_analyzer\'s --input-data format: {"data": [{"NAME": {"content": [...], "shape": [...]}}, ...]}, '
               'one entry per request, "content" a flat list or {"b64": "..."}, "shape" without the batch axis')


def load_traffic(path: Path, signature: Signature, option: str = "--traffic") -> Traffic:
    """Requests from a perf_analyzer --input-data JSON file, each checked against the signature (one TrafficError line
    naming the entry and the fix otherwise); `option` names the file in those lines as the user gave it."""
    where = f"{option} {str(path)!r}".strip()
    entries = read_entries(path, where)
    stamps = _timestamps(entries, where)
    requests = tuple(_request({k: v for k, v in entry.items() if k != "timestamp"} if isinstance(entry, dict) else entry, k, where, signature)
                     for k, entry in enumerate(entries))
    return Traffic(requests, "file", f"{option} {path.name}".strip(), stamps)


def read_entries(path: Path, where: str) -> list[Any]:
    """The "data" list of a perf_analyzer --input-data JSON file (TrafficError when there is none)."""
    if not path.is_file():
        raise TrafficError(f"{where} does not exist; give the path of a perf_analyzer --input-data JSON file.")
    try:
        doc = json.loads(path.read_text())
    except UnicodeDecodeError as err:
        raise TrafficError(f"{where} is not text ({err.reason}); {FORMAT_HINT}.") from err
    except json.JSONDecodeError as err:
        raise TrafficError(f"{where} is not JSON (line {err.lineno}, column {err.colno}: {err.msg}); {FORMAT_HINT}.") from err
    except OSError as err:
        raise TrafficError(f"{where} cannot be read: {err.strerror or err}.") from err
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise TrafficError(f"{where} has no requests (no non-empty \"data\" list); {FORMAT_HINT}.")
    if len(entries) > MAX_REQUESTS:
        raise TrafficError(f"{where} has {len(entries)} requests, more than {MAX_REQUESTS}; keep a sample of at most {MAX_REQUESTS} that has the same mix of shapes.")
    return entries


def _timestamps(entries: list[Any], where: str) -> tuple[float, ...] | None:
    """Every entry's "timestamp" (ms) when the file is a trace: numbers, not negative, never going backwards, on every
    entry or none, spanning some time (None: no entry has one)."""
    has = [isinstance(e, dict) and "timestamp" in e for e in entries]
    if not any(has):
        return None
    if not all(has):
        k = has.index(False)
        some = sum(has)
        raise TrafficError(f"{where} entry {k} has no \"timestamp\" while {some} of the {len(entries)} entries have one; "
                           "give every entry its arrival time in milliseconds, or remove them all.")
    stamps: list[float] = []
    for k, entry in enumerate(entries):
        t = entry["timestamp"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise TrafficError(f"{where} entry {k}: \"timestamp\" {t!r} is not a number; give the request's arrival time in milliseconds, e.g. 12.5.")
        if t < 0:
            raise TrafficError(f"{where} entry {k}: \"timestamp\" {t:g} is negative; give arrival times in milliseconds from 0 (the trace's start).")
        if stamps and t < stamps[-1]:
            raise TrafficError(f"{where} entry {k}: \"timestamp\" {t:g} is before entry {k - 1}'s {stamps[-1]:g}; list the requests in the order "
                               "they arrived (sort the entries by timestamp).")
        stamps.append(float(t))
    if stamps[-1] <= stamps[0]:
        raise TrafficError(f"{where}: every \"timestamp\" is {stamps[0]:g}, so the trace spans no time and has no rate; give each request "
                           "the time it arrived (at least two different times), or remove the timestamps.")
    return tuple(stamps)


def _request(entry: Any, k: int, where: str, signature: Signature) -> Feed:
    at = f"{where} entry {k}"
    if isinstance(entry, list):
        raise TrafficError(f"{at} is a list (a sequence stream); give one object per request: {{\"NAME\": {{\"content\": ..., \"shape\": ...}}}}.")
    if not isinstance(entry, dict):
        raise TrafficError(f"{at} is not an object; {FORMAT_HINT}.")
    names = signature.input_names
    unknown = [n for n in entry if n not in names]
    missing = [n for n in names if n not in entry]
    if unknown:
        raise TrafficError(f"{at} names input {unknown[0]!r}, which the model does not have (its inputs: {', '.join(names)}); rename or drop it.")
    if missing:
        raise TrafficError(f"{at} misses input {missing[0]!r} (the model's inputs: {', '.join(names)}); give every input in every entry.")
    feed = {}
    for spec in signature.inputs:
        arr = _array(entry[spec.name], spec, f"{at} input {spec.name!r}")
        _check_shape(arr.shape, spec, f"{at} input {spec.name!r}")
        feed[spec.name] = arr[None, ...] if signature.batching else arr
    return feed


def _array(value: Any, spec: TensorSpec, at: str) -> np.ndarray:
    """One input of one entry as an array of the input's dtype, in its own shape (the batch axis not included)."""
    shape = None
    content = value
    if isinstance(value, dict):
        if "shape" in value:
            shape = value["shape"]
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise TrafficError(f"{at}: \"shape\" {shape!r} is not a list of sizes; give the dims without the batch axis, e.g. [36].")
        if "content" in value:
            content = value["content"]
        elif "b64" in value:
            content = {"b64": value["b64"]}
        else:
            raise TrafficError(f"{at} has no \"content\"; {FORMAT_HINT}.")
    if shape is None:
        if any(a.dynamic for a in spec.axes):
            raise TrafficError(f"{at} has no \"shape\", and its dims {'x'.join(map(str, spec.axes))} have a dynamic axis; "
                               "give each entry's \"shape\" (without the batch axis).")
        shape = [a.min for a in spec.axes]
    dtype = np.dtype(np.float32 if spec.dtype.name == "bfloat16" else spec.dtype.numpy)
    size = math.prod(shape)
    if isinstance(content, dict) and "b64" in content:
        try:
            raw = base64.b64decode(content["b64"], validate=True)
        except (binascii.Error, TypeError, ValueError) as err:
            raise TrafficError(f"{at}: \"b64\" is not base64 ({err}); encode the array's little-endian bytes.") from err
        if len(raw) != size * dtype.itemsize:
            raise TrafficError(f"{at}: {len(raw)} bytes of b64 content do not make shape {shape} of {spec.dtype.name} "
                               f"({size * dtype.itemsize} bytes); make the content and the shape agree.")
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    if not isinstance(content, list):
        raise TrafficError(f"{at}: \"content\" is neither a list nor {{\"b64\": ...}}; {FORMAT_HINT}.")
    flat = _flatten(content)
    if len(flat) != size:
        raise TrafficError(f"{at}: {len(flat)} values do not fill shape {shape} ({size} values); make the content and the shape agree.")
    return np.asarray(_typed(flat, spec, dtype, at), dtype=dtype).reshape(shape)


def _flatten(content: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [content]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _typed(values: list[Any], spec: TensorSpec, dtype: np.dtype, at: str) -> list[Any]:
    """The values, checked to be what the input's dtype holds (no strings for numbers, no fractions for integers)."""
    if dtype == np.dtype(object):
        return [str(v) for v in values]
    for v in values:
        ok = (isinstance(v, bool) if dtype == np.bool_ else
              isinstance(v, (int, float)) and not isinstance(v, bool) and (dtype.kind == "f" or float(v).is_integer()))
        if not ok:
            raise TrafficError(f"{at}: value {v!r} is not of dtype {spec.dtype.name}; the model's input {spec.name!r} takes {spec.dtype.name} values.")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        bad = next((v for v in values if not info.min <= v <= info.max), None)
        if bad is not None:
            raise TrafficError(f"{at}: value {bad!r} does not fit dtype {spec.dtype.name}; the model's input {spec.name!r} takes {spec.dtype.name} values.")
    return values


def _check_shape(shape: tuple[int, ...], spec: TensorSpec, at: str) -> None:
    if len(shape) != len(spec.axes):
        raise TrafficError(f"{at}: shape {list(shape)} has {len(shape)} dims, the model's input has {len(spec.axes)} "
                           f"({'x'.join(map(str, spec.axes)) or 'scalar'}, without the batch axis); fix the entry's \"shape\".")
    for i, (size, axis) in enumerate(zip(shape, spec.axes)):
        if not axis.min <= size <= axis.max:
            raise TrafficError(f"{at}: dim {i} is {size}, outside the model's {axis} (dims {'x'.join(map(str, spec.axes))}, without the batch axis); "
                               "keep every request within the declared ranges, or widen them with --input.")

