"""Sample sets: the user's .npz, or data generated from the signature at the corners of every dynamic axis.

A feed is a dict of numpy arrays keyed by input name, batch axis first when the signature batches.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from optimizer.errors import SignatureError
from optimizer.model.signature import Signature, TensorSpec

Feed = dict[str, np.ndarray]

DEFAULT_INT_RANGE = (0.0, 1.0)
"""Integer inputs without --value-range or example values are sampled from {0, 1}, valid for any index input."""


@dataclass(frozen=True)
class ShapePoint:
    """Where to sample: a batch size and whether every dynamic axis sits at its "min" or "max"."""

    batch: int
    point: str  # "min" | "max"

    @property
    def label(self) -> str:
        return f"batch={self.batch},axes={self.point}"


def correctness_points(signature: Signature, max_batch: int = 3) -> list[ShapePoint]:
    """Two batch sizes (1 and an odd one that catches a baked batch) times the min and max of every dynamic axis."""
    batches = [1, max_batch] if signature.batching else [0]
    points = ["min", "max"] if signature.is_dynamic else ["max"]
    return [ShapePoint(b, p) for b in batches for p in points]


def generate_tensor(spec: TensorSpec, batch: int | None, point: str, rng: np.random.Generator) -> np.ndarray:
    """Random data for one input: normal floats, uniform integers in the value range, random booleans."""
    shape = spec.shape(batch, point)
    dt = spec.dtype
    if dt.name == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.is_float:
        if spec.value_range:
            low, high = spec.value_range
            data = rng.uniform(low, high, size=shape)
        else:
            data = rng.standard_normal(size=shape)
        return data.astype(np.float32 if dt.name == "bfloat16" else dt.numpy)
    low, high = spec.value_range or DEFAULT_INT_RANGE
    return rng.integers(int(low), int(high) + 1, size=shape).astype(dt.numpy)


def generate_feed(signature: Signature, point: ShapePoint, seed: int = 0) -> Feed:
    """One feed at a shape point; the same seed gives the same data."""
    rng = np.random.default_rng(seed)
    batch = point.batch if signature.batching else None
    return {t.name: generate_tensor(t, batch, point.point, rng) for t in signature.inputs}


def tile_feed(feed: Feed, batch: int) -> Feed:
    """Repeat (or cut) a feed along the batch axis to `batch` rows, for profiling at any batch size."""
    out = {}
    for name, arr in feed.items():
        reps = -(-batch // arr.shape[0])
        out[name] = np.ascontiguousarray(np.concatenate([arr] * reps, axis=0)[:batch]) if reps > 1 else np.ascontiguousarray(arr[:batch])
    return out


def load_npz(path: Path, signature: Signature) -> list[Feed]:
    """Feeds from a user .npz: keys are input names, or NAME.K for several recorded requests (K = 0, 1, ...)."""
    if not path.exists():
        raise SignatureError(f"--samples file {str(path)!r} does not exist; give an .npz with one array per input.")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise SignatureError(f"--samples {str(path)!r} is not a readable .npz ({err}); save it with numpy.savez.") from err
    groups: dict[str, Feed] = {}
    for key, arr in arrays.items():
        name, _, index = key.rpartition(".")
        if not name or not index.isdigit():
            name, index = key, "0"
        groups.setdefault(int(index), {})[name] = arr
    feeds = [groups[k] for k in sorted(groups)]
    for i, feed in enumerate(feeds):
        check_feed(signature, feed, f"--samples {path.name} request {i}")
    return feeds


def check_feed(signature: Signature, feed: Feed, where: str) -> None:
    """A feed must have every input with the right dtype, rank and sizes inside the signature's ranges."""
    missing = [n for n in signature.input_names if n not in feed]
    extra = [n for n in feed if n not in signature.input_names]
    if missing or extra:
        raise SignatureError(
            f"{where}: inputs {sorted(feed)} do not match the model's {signature.input_names}"
            f"{' (missing ' + ', '.join(missing) + ')' if missing else ''}{' (unknown ' + ', '.join(extra) + ')' if extra else ''}; "
            "name each array after the model's input (np.savez(path, NAME=array); NAME.K for several requests)."
        )
    batch_sizes = set()
    for spec in signature.inputs:
        arr = feed[spec.name]
        want = np.float32 if spec.dtype.name == "bfloat16" else spec.dtype.numpy
        if arr.dtype != want:
            raise SignatureError(f"{where}: input {spec.name!r} is {arr.dtype}, expected {spec.dtype.name}; convert the array.")
        dims = arr.shape[1:] if signature.batching else arr.shape
        if len(dims) != len(spec.axes):
            raise SignatureError(
                f"{where}: input {spec.name!r} has shape {list(arr.shape)}, expected "
                f"{'[batch, ' if signature.batching else '['}{', '.join(map(str, spec.axes))}]."
            )
        for i, (size, axis) in enumerate(zip(dims, spec.axes)):
            if not axis.min <= size <= axis.max:
                raise SignatureError(f"{where}: input {spec.name!r} axis {i + signature.batching} is {size}, outside {axis}.")
        if signature.batching:
            batch_sizes.add(arr.shape[0])
    if len(batch_sizes) > 1:
        raise SignatureError(f"{where}: inputs have different batch sizes {sorted(batch_sizes)}; axis 0 is the batch axis.")


def batch_sizes_of(feeds: Iterable[Feed]) -> list[int]:
    """Distinct batch sizes recorded in feeds (for the JIT workflow, which tunes only these)."""
    return sorted({next(iter(f.values())).shape[0] for f in feeds})


def save_feeds(path: Path, feeds: list[Feed]) -> None:
    """Store feeds as NAME.K keys, the format load_npz reads back."""
    np.savez(path, **{f"{name}.{k}": arr for k, feed in enumerate(feeds) for name, arr in feed.items()})


def load_feeds(path: Path) -> list[Feed]:
    """Read feeds written by save_feeds (no signature check: they were written by us)."""
    with np.load(path, allow_pickle=False) as data:
        groups: dict[int, Feed] = {}
        for key in data.files:
            name, _, index = key.rpartition(".")
            groups.setdefault(int(index), {})[name] = data[key]
    return [groups[k] for k in sorted(groups)]


def calibration_file(calibration_samples: str | None, signature: Signature, user_feeds: list[Feed], directory: Path) -> str | None:
    """The .npz INT8 candidates are calibrated on: --calibration-samples, else the user's --samples; None when the
    run has only generated inputs (then no INT8 candidate is built)."""
    feeds = load_npz(Path(calibration_samples), signature) if calibration_samples else user_feeds
    if not feeds:
        return None
    path = directory / "calibration.npz"
    save_feeds(path, feeds)
    return str(path)
