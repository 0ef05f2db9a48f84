"""The backend contract (DESIGN §3): build an artifact apart from running it.

`Backend.build` writes files and returns an `Artifact` (plain data that can cross a process
boundary); `Backend.load` returns a `Runner`, a context manager that allocates on enter and
frees on exit. The base runner checks a feed against the signature once, before any timing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import numpy as np

from optimizer.backend.precision import refusal
from optimizer.backend.triton_platforms import PLATFORMS, TritonPlatform
from optimizer.errors import BackendError
from optimizer.model.samples import Feed
from optimizer.model.signature import Signature

if TYPE_CHECKING:
    from optimizer.model.source import LoadedModel


def cpu_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def device_kind(device: str) -> str:
    """"cuda" for "cuda:1", "cpu" for "cpu"."""
    return device.split(":", 1)[0]


def first_line(err: BaseException) -> str:
    """An exception as one line for a candidate's reason: its type and the first line of its message."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on a device here; `reason` is one sentence when it cannot."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class Artifact:
    """What a build produced: files in `directory` plus the facts needed to load, publish and report it."""

    backend: str
    device: str
    directory: str
    files: list[str]  # relative to directory; files[0] is the model file Triton loads
    signature: dict[str, Any]  # Signature.to_json() of the tensors as the artifact names them
    triton_platform: str | None  # key into PLATFORMS; None when it cannot be published
    triton_settings: dict[str, Any] = field(default_factory=dict)  # platform-specific config fragment
    metadata: dict[str, Any] = field(default_factory=dict)  # opset, precision, versions, build time...
    batch_range: tuple[int, int] = (1, 1)  # the batch sizes the artifact was built to accept

    @property
    def path(self) -> Path:
        return Path(self.directory) / self.files[0] if self.files else Path(self.directory)

    @property
    def platform(self) -> TritonPlatform | None:
        return PLATFORMS[self.triton_platform] if self.triton_platform else None

    @property
    def sig(self) -> Signature:
        return Signature.from_json(self.signature)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["batch_range"] = list(self.batch_range)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Artifact:
        d = dict(d)
        d["batch_range"] = tuple(d.get("batch_range", (1, 1)))
        return cls(**d)


def _found(modules: tuple[str, ...]) -> Availability:
    """Installed (found and versioned) without importing; the reason says the import was not tried."""
    import importlib.metadata
    import importlib.util
    import sys

    versions = []
    for m in modules:
        if m in sys.modules:
            versions.append(f"{m} {getattr(sys.modules[m], '__version__', '')}".strip())
            continue
        if importlib.util.find_spec(m) is None:
            return Availability(False, f"{m} is not installed (pip install {m}).")
        try:
            versions.append(f"{m} {importlib.metadata.version(m)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(m)
    return Availability(True, f"found {', '.join(versions)} (not imported; --check-imports imports it)")


class Runner:
    """Runs an artifact in-process. Use as a context manager; `infer` returns outputs in signature order.

    Outputs may share memory with the runtime's buffers: callers that keep them across calls copy them.
    """

    def __init__(self, signature: Signature) -> None:
        self.signature = signature
        self._active = False

    def __enter__(self) -> Runner:
        self._activate()
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._active = False
        self._deactivate()

    def check_feed(self, feed: Feed) -> None:
        """Names, dtypes and ranks must match the signature; raises BackendError naming the difference."""
        sig = self.signature
        if set(feed) != set(sig.input_names):
            raise BackendError(f"feed has inputs {sorted(feed)}, the artifact expects {sig.input_names}.")
        for spec in sig.inputs:
            arr = feed[spec.name]
            rank = len(spec.axes) + (1 if sig.batching else 0)
            want = np.float32 if spec.dtype.name == "bfloat16" else spec.dtype.numpy
            if arr.dtype != want or arr.ndim != rank:
                raise BackendError(
                    f"input {spec.name!r} is {arr.dtype}{list(arr.shape)}, the artifact expects {spec.dtype.name} of rank {rank}."
                )

    def infer(self, feed: Feed) -> list[np.ndarray]:
        """Run one feed (checked first); outputs come back in signature order."""
        if not self._active:
            raise BackendError(f"{type(self).__name__} is not active; use it inside a 'with' block.")
        self.check_feed(feed)
        return self._run(feed)

    def run_unchecked(self, feed: Feed) -> list[np.ndarray]:
        """The timed path: no checks (profiling checks the feed once with `infer` first)."""
        return self._run(feed)

    def _activate(self) -> None:
        raise NotImplementedError

    def _deactivate(self) -> None:
        raise NotImplementedError

    def _run(self, feed: Feed) -> list[np.ndarray]:
        raise NotImplementedError


class Backend:
    """One candidate inference backend. Subclasses set the class attributes and implement the hooks."""

    name: ClassVar[str]
    triton_platform: ClassVar[str | None]  # key into PLATFORMS, None for the eager baseline
    devices: ClassVar[frozenset[str]]
    consumes: ClassVar[frozenset[str]]  # LoadedModel.format values it can build from
    publishable: ClassVar[bool] = True
    distributed_ok: ClassVar[bool] = True  # can carry a distributed module's collectives
    workflow: ClassVar[frozenset[str]] = frozenset({"aot"})
    needs_source_model: ClassVar[bool] = False  # load() runs the source module itself (torch-eager)
    typical_build_s: ClassVar[float] = 5.0  # a small model's build on 2 CPU cores; the slowest builds start first
    default_settings: ClassVar[dict[str, Any]] = {}
    precisions: ClassVar[Mapping[str, frozenset[str]]] = MappingProxyType({"cpu": frozenset({"fp32"}), "cuda": frozenset({"fp32"})})
    """--precision values each device kind builds; anything else is refused in availability(), never run as fp32."""

    def __init__(self, **settings: Any) -> None:
        known = {"precision": "fp32", **self.default_settings}  # every backend takes the run's precision
        unknown = set(settings) - set(known)
        if unknown:
            raise BackendError(
                f"{self.name} has no setting(s) {', '.join(sorted(unknown))}; it takes: {', '.join(known)}."
            )
        self.settings = {**known, **settings}

    def at_precision(self, precision: str) -> Backend:
        """This backend with the run's --precision (itself when it already has it)."""
        if self.settings["precision"] == precision:
            return self
        return type(self)(**{**self.settings, "precision": precision})

    def with_batch_hint(self, knee: int) -> Backend:
        """This backend told where throughput saturates (eager's measured knee); only engines that
        fix an optimal batch at build time (TensorRT profiles) use it, the others return themselves."""
        return self

    @property
    def model_filename(self) -> str | None:
        return PLATFORMS[self.triton_platform].model_filename if self.triton_platform else None

    def candidate_name(self, device: str) -> str:
        """Stable name used in logs and reports, e.g. "onnxruntime[cpu]"."""
        return f"{self.name}[{device}]"

    slow_imports: ClassVar[tuple[str, ...]] = ()  # modules that take seconds to import (torch)

    def availability(self, device: str, quick: bool = False) -> Availability:
        """Whether this backend can run on `device` here. Never raises.

        `quick` only finds the modules in `slow_imports` instead of importing them (for a fast
        `aitune-export backends` on CPU); every other check, and every tuning run, imports for real,
        because a wheel can be installed and still fail to load its libraries.
        """
        if device_kind(device) not in self.devices:
            return Availability(False, f"{self.name} runs on {', '.join(sorted(self.devices))}, not {device}.")
        precision = self.settings["precision"]
        supported = self.precisions.get(device_kind(device), frozenset({"fp32"}))
        if precision not in supported:
            return Availability(False, refusal(self.name, device_kind(device), precision, supported))
        if quick and device_kind(device) == "cpu" and self.slow_imports:
            return _found(self.slow_imports)
        try:
            return self._availability(device)
        except Exception as err:  # availability must never raise: report it instead
            return Availability(False, f"{type(err).__name__}: {err}")

    def _availability(self, device: str) -> Availability:
        return Availability(True)

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        """Write the artifact into `workdir` (created if needed) for batch sizes in `batch_range`."""
        raise NotImplementedError

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        """A runner for the artifact. `model` is needed only by backends that run the source module (torch-eager)."""
        raise NotImplementedError

    def triton_settings(self, artifact: Artifact) -> dict[str, Any]:
        """The platform-specific part of config.pbtxt (parameters, optimization) for this artifact."""
        return {}

    def versions(self) -> dict[str, str]:
        """Versions of the libraries this backend builds with (they key the cache and go into the report)."""
        return {}

    def cache_key(self) -> str:
        """A hash of the backend's name, settings and library versions."""
        blob = json.dumps({"name": self.name, "settings": self.settings, "versions": self.versions()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
