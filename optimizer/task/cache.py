"""A cache of built artifacts and of measurements, so re-running the same export redoes nothing it can trust.

Builds are keyed by the model's content, the signature, the reference samples, the backend's
settings and library versions, the device and the batch range. Measurements add the batch policy,
the profiling settings and the machine; they are reused only when the machine was quiet while they
were taken. Entries are written to a temporary folder and renamed into place, so a killed run
never leaves half an entry.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.backend.base import Backend
from optimizer.machine import machine_fingerprint
from optimizer.records.candidate import Candidate
from optimizer.records.correctness import tolerances_to_json
from optimizer.records.measurements import BatchPolicy

if TYPE_CHECKING:
    from optimizer.task.context import TuneContext

log = logging.getLogger(__name__)

CACHE_FORMAT = 4
"""2: a decision carries the throughput peak and the largest batch that fit (older ones published past the peak); 3: past
a saturation stop, the batches run once to check they fit (older ones leave the served search fewer maxima); 4: profiled at
the traffic's median request, fit checked at its largest, with the p90 request alone."""
TRUSTED_CONTENTION = 0.25
"""A measurement taken while other processes used more than this share of the CPU is not reused."""


def _hash_file(h: Any, path: Path) -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def model_fingerprint(ctx: TuneContext) -> str:
    """The model's content: its files, or its weights plus its code for Python sources."""
    from optimizer._version import __version__

    h = hashlib.sha256()
    h.update(f"aitune-export {__version__} cache {CACHE_FORMAT}".encode())
    model = ctx.model
    h.update(json.dumps(model.source.to_json(), sort_keys=True).encode())
    if model.source.kind in ("onnx", "torchscript", "exported_program", "pickled"):
        path = Path(model.onnx_path or model.source.spec)
        _hash_file(h, path)
        data = path.parent / (path.name + ".data")
        if data.exists():
            _hash_file(h, data)
    else:
        if ctx.state_dict:
            _hash_file(h, Path(ctx.state_dict))
        module = model.inner_module
        h.update(repr(module).encode())
        for cls in type(module).__mro__:
            if cls.__module__.startswith("torch."):
                break
            try:
                h.update(inspect.getsource(cls).encode())
            except (OSError, TypeError):
                h.update(cls.__qualname__.encode())
    h.update(json.dumps(ctx.signature.to_json(), sort_keys=True).encode())
    for path in (ctx.reference.feeds, ctx.reference.outputs, ctx.reference.profile_feed):
        _hash_file(h, Path(path))
    h.update(json.dumps(tolerances_to_json(ctx.tolerances), sort_keys=True).encode())
    accuracy = getattr(ctx, "accuracy", None)  # judges the reduced-precision candidates: another budget, another verdict
    if accuracy is not None and accuracy.to_json() != type(accuracy)().to_json():
        h.update(json.dumps(accuracy.to_json(), sort_keys=True).encode())
    return h.hexdigest()


class ArtifactCache:
    """Builds and measurements on disk under `root`; lookups return None when nothing trustworthy is there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._model_key: str | None = None

    def _model(self, ctx: TuneContext) -> str:
        if self._model_key is None:
            self._model_key = model_fingerprint(ctx)
        return self._model_key

    def build_key(self, backend: Backend, ctx: TuneContext, batch_max: int) -> str:
        blob = json.dumps({"model": self._model(ctx), "backend": backend.name, "backend_key": backend.cache_key(),
                           "device": str(ctx.device), "batch_max": batch_max}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def measure_key(self, backend: Backend, ctx: TuneContext, policy: BatchPolicy, memory_budget_mb: float | None) -> str:
        # the budget in whole GiB: "auto" is a share of the memory available right now, which drifts between runs
        blob = json.dumps({"build": self.build_key(backend, ctx, policy.cap), "policy": policy.to_json(),
                           "profile": asdict(ctx.profile), "machine": machine_fingerprint(),
                           "memory_budget_gib": round((memory_budget_mb or 0) / 1024)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    # -- builds -------------------------------------------------------------------------------
    def lookup_build(self, backend: Backend, ctx: TuneContext, batch_max: int) -> Candidate | None:
        entry = self.root / "builds" / self.build_key(backend, ctx, batch_max)
        cand = self._read(entry / "candidate.json")
        if cand is None or cand.artifact is None:
            return None
        if cand.status == "failed":  # a correctness rejection on this machine: the same build would fail the same way
            if cand.versions.get("machine") != machine_fingerprint():
                return None
            cand.cached = "build"
            cand.artifact.directory = str(entry / "artifact")
            log.info("%s | reusing the cached correctness rejection %s", cand.name, entry.name)
            return cand
        cand.artifact.directory = str(entry / "artifact")
        if not all((entry / "artifact" / f).exists() for f in cand.artifact.files):
            return None
        cand.cached = "build"
        log.info("%s | reusing the cached build %s", cand.name, entry.name)
        return cand

    def store_build(self, backend: Backend, ctx: TuneContext, batch_max: int, cand: Candidate) -> None:
        """Keep a built, correct candidate, or a correctness rejection (deterministic on this machine: the
        numerics of a runtime can depend on the CPU). Crashes, timeouts and build errors are retried next time."""
        if cand.artifact is None:
            return
        rejected = cand.status == "failed" and cand.stage == "correctness"
        if cand.status != "built" and not rejected:
            return
        entry = self.root / "builds" / self.build_key(backend, ctx, batch_max)

        def fill(tmp: Path) -> None:
            (tmp / "artifact").mkdir()
            if not rejected:
                for f in cand.artifact.files:
                    shutil.copy2(Path(cand.artifact.directory) / f, tmp / "artifact" / f)
            stored = Candidate.from_json(cand.to_json())
            stored.artifact.directory = str(entry / "artifact")
            if rejected:
                stored.versions = {**stored.versions, "machine": machine_fingerprint()}
            (tmp / "candidate.json").write_text(json.dumps(stored.to_json()))

        self._write(entry, fill)

    # -- measurements -------------------------------------------------------------------------
    def lookup_measurement(self, backend: Backend, ctx: TuneContext, policy: BatchPolicy, memory_budget_mb: float | None,
                           built: Candidate) -> Candidate | None:
        entry = self.root / "measurements" / self.measure_key(backend, ctx, policy, memory_budget_mb)
        cand = self._read(entry / "candidate.json")
        if cand is None or cand.decision is None or not cand.decision.profiles:
            return None
        busiest = max(p.others_cpu_share for p in cand.decision.profiles)
        if busiest > TRUSTED_CONTENTION:
            log.info("%s | not reusing a measurement taken while other processes used %.0f%% of the CPU", cand.name, 100 * busiest)
            return None
        cand.artifact = built.artifact
        cand.correctness = built.correctness or cand.correctness
        cand.build_s = built.build_s
        cand.cached = "build+measure" if built.cached else "measure"
        return cand

    def store_measurement(self, backend: Backend, ctx: TuneContext, policy: BatchPolicy, memory_budget_mb: float | None,
                          cand: Candidate) -> None:
        entry = self.root / "measurements" / self.measure_key(backend, ctx, policy, memory_budget_mb)
        self._write(entry, lambda tmp: (tmp / "candidate.json").write_text(json.dumps(cand.to_json())))

    # -- storage ------------------------------------------------------------------------------
    @staticmethod
    def _read(path: Path) -> Candidate | None:
        try:
            return Candidate.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write(self, entry: Path, fill: Any) -> None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
            fill(tmp)
            if entry.exists():
                shutil.rmtree(entry, ignore_errors=True)
            os.rename(tmp, entry)
        except OSError as err:  # a full or read-only cache costs speed, never the run
            log.warning("could not write the cache entry %s: %s", entry, err)
            shutil.rmtree(tmp, ignore_errors=True) if "tmp" in locals() else None
