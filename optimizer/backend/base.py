"""The backend contract: build an artifact apart from running it.

`Backend.build` writes files and returns an `Artifact` (plain data that can cross a process
boundary); `Backend.load` returns a `Runner`, a context manager that allocates on enter and
frees on exit. The base runner checks a feed against the signature once, before any timing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import numpy as np

from optimizer.backend.precision import refusal
from optimizer.errors import BackendError
from optimizer.model.samples import Feed
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.records.triton_platforms import PLATFORMS
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on a device here; `reason` is one sentence when it cannot."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


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
    cache_subdir: ClassVar[str | None] = None  # a folder of its own under the run's cache root (then it takes a `cache_dir` setting)
    precisions: ClassVar[Mapping[str, frozenset[str]]] = MappingProxyType({"cpu": frozenset({"fp32"}), "cuda": frozenset({"fp32"})})
    """--precision values each device kind builds; anything else is refused in availability(), never run as fp32."""
    computes_bf16_by_default: ClassVar[bool] = False
    """Computes in bf16 on a bf16 CPU even when asked for nothing (OpenVINO): its fp32 candidate there is bf16 in disguise."""
    build_format: ClassVar[int] = 1
    """Bumped when a build changes what it writes for the same model and settings, so cached builds of the old kind are not reused."""

    def __init__(self, **settings: Any) -> None:
        known = {"precision": "fp32", **self.default_settings}  # every backend takes the run's precision
        # an INT8 candidate also takes the .npz of real feeds it is calibrated on (its content keys the cache)
        unknown = set(settings) - set(known) - ({"calibration"} if settings.get("precision") == "int8" else set())
        if unknown:
            raise BackendError(
                f"{self.name} has no setting(s) {', '.join(sorted(unknown))}; it takes: {', '.join(known)}."
            )
        self.settings = {**known, **settings}

    def for_run(self, precision: str, cache_root: Path | None = None, calibration: str | None = None) -> Backend:
        """This backend at `precision` (an INT8 one calibrated on the feeds in `calibration`) and, when it keeps a
        cache (a `cache_dir` setting the user left unset), that cache under the run's one cache root; itself when
        nothing changes."""
        wanted: dict[str, Any] = {"precision": precision}
        if precision == "int8":
            wanted["calibration"] = calibration
        if cache_root is not None and self.cache_subdir and not self.settings.get("cache_dir"):
            wanted["cache_dir"] = str(Path(cache_root) / self.cache_subdir)
        if all(self.settings.get(k) == v for k, v in wanted.items()):
            return self
        settings = {k: v for k, v in self.settings.items() if k != "calibration" or precision == "int8"}
        return type(self)(**{**settings, **wanted})

    def with_batch_hint(self, knee: int) -> Backend:
        """This backend told where throughput saturates (eager's measured knee); only engines that
        fix an optimal batch at build time (TensorRT profiles) use it, the others return themselves."""
        return self

    @property
    def model_filename(self) -> str | None:
        return PLATFORMS[self.triton_platform].model_filename if self.triton_platform else None

    def candidate_name(self, device: str) -> str:
        """Stable name used in logs, reports and work folders: "onnxruntime[cpu]" at fp32, "openvino[cpu,bf16]" at another precision."""
        precision = self.settings.get("precision", "fp32")
        return f"{self.name}[{device}]" if precision == "fp32" else f"{self.name}[{device},{precision}]"

    slow_imports: ClassVar[tuple[str, ...]] = ()  # modules that take seconds to import (torch)

    def availability(self, device: str, quick: bool = False) -> Availability:
        """Whether this backend can run on `device` here. Never raises.

        `quick` only finds the modules in `slow_imports` instead of importing them (for a fast
        `aitune-export backends` on CPU); every other check, and every tuning run, imports for real,
        because a wheel can be installed and still fail to load its libraries.
        """
        if Device.of(device).kind not in self.devices:
            return Availability(False, f"{self.name} runs on {', '.join(sorted(self.devices))}, not {device}.")
        precision = self.settings["precision"]
        supported = self.precisions.get(Device.of(device).kind, frozenset({"fp32"}))
        if precision not in supported:
            return Availability(False, refusal(self.name, Device.of(device).kind, precision, supported))
        if quick and Device.of(device).kind == "cpu" and self.slow_imports:
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
        built_with = {k: v for k, v in self.settings.items() if k != "cache_dir"}  # where caches go changes no artifact
        if built_with.get("calibration"):  # what INT8 is calibrated on changes the artifact; where the file lies does not
            built_with["calibration"] = hashlib.sha256(Path(built_with["calibration"]).read_bytes()).hexdigest()
        blob = json.dumps({"name": self.name, "settings": built_with, "versions": self.versions(),
                           **({"build_format": self.build_format} if self.build_format != 1 else {})}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
