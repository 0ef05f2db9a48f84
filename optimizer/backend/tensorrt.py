"""TensorRT (`tensorrt_plan`, model.plan): an engine built from the exported ONNX with optimization
profiles that cover batch 1..max and every dynamic axis.

Written against TensorRT >= 10 (and its 11.x API, where every network is strongly typed and the
FP16/BF16 builder flags are gone): the precision is carried by the exported graph (see
backend/precision.py), the builder gets a workspace limit, one profile and a timing cache that is
persisted per TensorRT version and GPU and reused by the next build. `build_engine` takes the
`tensorrt` module as a parameter so its calls can be checked without a GPU.

The CPU test suite checks the builder calls against a stand-in `tensorrt` module; what needs a GPU and
TensorRT itself is scripts/gpu_check.sh, the check to run on one.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.onnx_export import DEFAULT_OPSET, export_onnx
from optimizer.backend.trt_profiles import ShapeRange, engine_max_batch, opt_batch_for, optimization_profile
from optimizer.errors import BackendError
from optimizer.model.samples import Feed
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel

log = logging.getLogger(__name__)

MIN_TENSORRT_MAJOR = 10
"""TensorRT 10 introduced the named-tensor API (set_input_shape, execute_async_v3) this backend uses."""


def tensorrt_status() -> Availability:
    """Whether TensorRT works here: `import tensorrt` succeeds, it is new enough and a builder can be created.

    Never raises and never installs anything. The reason quotes the real error, e.g.
    "tensorrt cannot be imported: ModuleNotFoundError: No module named 'tensorrt'", or the
    ImportError of a missing libnvinfer when only the Python bindings are installed.
    """
    try:
        import tensorrt as trt
    except Exception as err:  # ModuleNotFoundError, or ImportError(libnvonnxparser.so.N) with bindings only
        return Availability(False, f"tensorrt cannot be imported: {type(err).__name__}: {err}")
    version = str(getattr(trt, "__version__", "0"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    if major < MIN_TENSORRT_MAJOR:
        return Availability(False, f"TensorRT {version} is too old; this backend needs TensorRT >= {MIN_TENSORRT_MAJOR} (pip install 'tensorrt-cu12>=10').")
    try:
        builder = trt.Builder(_capturing_logger(trt))
    except Exception as err:  # no GPU or driver: TypeError "factory function returned nullptr"
        return Availability(False, f"a TensorRT {version} builder cannot be created (is there a GPU and a driver?): {type(err).__name__}: {err}")
    if builder is None:
        return Availability(False, f"a TensorRT {version} builder cannot be created (trt.Builder returned None).")
    return Availability(True, f"TensorRT {version}")


def _capturing_logger(trt: Any) -> Any:
    """A trt.ILogger that forwards to our log and keeps the last errors, so a failure can quote them."""

    class CapturingLogger(trt.ILogger):
        """TensorRT's messages go to this module's log; errors are also kept in `errors`."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: deque[str] = deque(maxlen=8)

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(str(msg))
                log.warning("TensorRT | %s", msg)
            elif int(severity) == int(trt.ILogger.Severity.WARNING):
                log.info("TensorRT | %s", msg)
            else:
                log.debug("TensorRT | %s", msg)

        def last_error(self) -> str:
            return self.errors[-1] if self.errors else "TensorRT logged no error"

    return CapturingLogger()


@dataclass
class EngineBuild:
    """A serialized engine and the timing cache after building it (bytes owned by the caller)."""

    plan: bytes
    timing_cache: bytes
    inputs: list[str]
    outputs: list[str]


def network_flags(trt: Any) -> int:
    """Strongly typed on every TensorRT >= 10: the graph's dtypes decide the precision (11.x accepts and
    ignores the flag, since it builds nothing else; 10.x needs it to do the same)."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def build_engine(
    trt: Any,
    onnx_path: Path,
    profiles: Sequence[Sequence[ShapeRange]],
    workspace_bytes: int,
    timing_cache: bytes = b"",
    optimization_level: int | None = None,
    expected_inputs: Sequence[str] | None = None,
) -> EngineBuild:
    """Parse `onnx_path` and build a serialized engine with TensorRT's Python API.

    Args:
        trt: the `tensorrt` module (a parameter so a test can hand in a stand-in that records the calls).
        profiles: one list of ShapeRange per optimization profile; every dynamic input needs a range.
        workspace_bytes: the builder's WORKSPACE memory pool limit.
        timing_cache: a serialized timing cache to start from (b"": a new one).
        optimization_level: builder_optimization_level 0-5 (None: TensorRT's default, 3).
        expected_inputs: input names the graph must have, in order (the signature's); None skips the check.

    Raises:
        BackendError: the parser rejects the graph, the inputs differ, or the builder returns no engine;
            the message quotes TensorRT's own error.
    """
    logger = _capturing_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)]
        raise BackendError(f"TensorRT's ONNX parser rejected {onnx_path.name}: {'; '.join(errors) or logger.last_error()}")
    inputs = [network.get_input(i).name for i in range(network.num_inputs)]
    outputs = [network.get_output(i).name for i in range(network.num_outputs)]
    if expected_inputs is not None and inputs != list(expected_inputs):
        raise BackendError(f"the TensorRT network has inputs {inputs}, the signature expects {list(expected_inputs)}.")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    if optimization_level is not None:
        config.builder_optimization_level = int(optimization_level)
    for ranges in profiles:
        if not ranges:
            continue
        profile = builder.create_optimization_profile()
        for r in ranges:
            profile.set_shape(r.name, r.min, r.opt, r.max)
        config.add_optimization_profile(profile)
    cache = config.create_timing_cache(timing_cache)
    config.set_timing_cache(cache, False)  # ignore_mismatch=False: a cache from another GPU or version is not used
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendError(f"TensorRT could not build an engine from {onnx_path.name}: {logger.last_error()}")
    new_cache = config.get_timing_cache().serialize()
    return EngineBuild(bytes(plan), bytes(new_cache), inputs, outputs)


def timing_cache_dir(explicit: str | None = None) -> Path:
    """Where timing caches live: the backend's `cache_dir` setting (the run sets it from --cache-dir), else
    <cache root>/tensorrt (machine.cache_root: $AITUNE_EXPORT_CACHE_DIR, $XDG_CACHE_HOME/aitune-export, ~/.cache/aitune-export)."""
    from optimizer.machine import cache_root

    return Path(explicit) if explicit else cache_root() / TensorRTBackend.cache_subdir


def timing_cache_file(cache_dir: Path, trt_version: str, compute_capability: str | None) -> Path:
    """One timing cache per TensorRT version and GPU architecture (TensorRT rejects a cache from another)."""
    sm = (compute_capability or "unknown").replace(".", "")
    return cache_dir / f"timing-trt{trt_version}-sm{sm}.cache"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialize builds that share a timing cache file (an flock on `path`.lock)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_atomically(path: Path, data: bytes) -> None:
    """Write through a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class TensorRTBackend(Backend):
    """Exports model.onnx (precision in the graph), builds model.plan with one profile over 1..max batch."""

    name = "tensorrt"
    typical_build_s = 60.0
    triton_platform = "tensorrt_plan"
    devices = frozenset({"cuda"})
    consumes = frozenset({"torch", "onnx"})
    distributed_ok = False
    precisions = MappingProxyType({"cuda": frozenset({"fp32", "fp16", "bf16"})})
    cache_subdir = "tensorrt"  # timing caches (ONNX Runtime's TensorRT EP keeps its own in <it>/ort)
    default_settings = {
        "opset": DEFAULT_OPSET,
        "workspace_mb": 8192,  # the builder's scratch limit; TensorRT uses less when less is free
        "optimization_level": None,  # None: TensorRT's default (3)
        "opt_batch": None,  # None: the measured knee when the strategy passes one, else Navigator's rule
        "opt_batch_from": None,  # where opt_batch came from, for the report
        "cache_dir": None,  # None: timing_cache_dir(); a run sets <cache root>/tensorrt
        "cuda_graphs": False,  # add optimization { cuda { graphs: true } } to the Triton config
    }

    def availability(self, device: str, quick: bool = False) -> Availability:
        """On a CPU device the reason also says whether tensorrt would import (found, not imported, when quick)."""
        if Device.of(device).kind != "cpu":
            return super().availability(device, quick)
        if quick:
            import importlib.util

            found = importlib.util.find_spec("tensorrt") is not None
            here = "tensorrt is installed (not imported)" if found else "ModuleNotFoundError: No module named 'tensorrt'"
        else:
            status = tensorrt_status()
            here = status.reason
        return Availability(False, f"tensorrt runs on cuda only, not {device}; here: {here}.")

    def _availability(self, device: str) -> Availability:
        return tensorrt_status()

    def with_batch_hint(self, knee: int) -> Backend:
        """The profile's optimal batch at eager's measured knee, unless opt_batch was set explicitly."""
        if self.settings["opt_batch"] is not None:
            return self
        return type(self)(**{**self.settings, "opt_batch": int(knee), "opt_batch_from": "eager PyTorch's measured knee"})

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        import tensorrt as trt

        from optimizer.backend.cuda import compute_capability

        precision = self.settings["precision"]
        workdir.mkdir(parents=True, exist_ok=True)
        onnx_path = workdir / "onnx" / "model.onnx"
        onnx_meta = export_onnx(model, signature, onnx_path, batch_range[1], self.settings["opset"], precision=precision)
        opt, rule = (opt_batch_for(batch_range[1], self.settings["opt_batch"], self.settings["opt_batch_from"])
                     if signature.batching else (0, "the model does not batch"))
        profile = optimization_profile(signature, batch_range[1], opt if signature.batching else None)
        index = Device.of(device).cuda_index
        select_gpu(index)
        cc = compute_capability(index)
        cache_dir = timing_cache_dir(self.settings["cache_dir"])
        cache_path = timing_cache_file(cache_dir, trt.__version__, cc)
        with locked(cache_path):
            previous = cache_path.read_bytes() if cache_path.exists() else b""
            built = build_engine(
                trt, onnx_path, [profile], int(self.settings["workspace_mb"]) * 2**20, previous,
                self.settings["optimization_level"], signature.input_names,
            )
            write_atomically(cache_path, built.timing_cache)
        (workdir / "model.plan").write_bytes(built.plan)
        log.info("tensorrt | built model.plan (timing cache %s, %s)", cache_path, "reused" if previous else "new")
        metadata = {
            "tensorrt": trt.__version__,
            "compute_capability": cc,
            "precision": precision,
            "workspace_mb": self.settings["workspace_mb"],
            "optimization_level": self.settings["optimization_level"],
            "profiles": [[r.to_json() for r in profile]],
            "engine_max_batch": engine_max_batch([profile], signature),
            "opt_batch": opt if signature.batching else None,
            "opt_batch_rule": rule,
            "timing_cache": str(cache_path),
            "timing_cache_reused": bool(previous),
            "onnx": {k: v for k, v in onnx_meta.items() if k != "files"},
        }
        return Artifact(
            backend=self.name,
            device=device,
            directory=str(workdir),
            files=["model.plan"],
            signature=signature.to_json(),
            triton_platform=self.triton_platform,
            metadata=metadata,
            batch_range=batch_range,
        )

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        return TensorRTRunner(artifact, device)

    def triton_settings(self, artifact: Artifact) -> dict[str, Any]:
        return {"cuda_graphs": True} if self.settings["cuda_graphs"] else {}

    def versions(self) -> dict[str, str]:
        try:
            import tensorrt as trt
        except Exception:
            return {}
        return {"tensorrt": str(trt.__version__)}


def select_gpu(index: int) -> None:
    """Make GPU `index` current in this process, so the builder and the runtime use it."""
    if index == 0:
        return  # CUDA's default device
    try:
        import torch

        torch.cuda.set_device(index)
        return
    except Exception:  # torch missing or without CUDA: ask the CUDA runtime directly
        pass
    from polygraphy import cuda

    cuda.wrapper().check(cuda.wrapper().handle.cudaSetDevice(index))


class TensorRTRunner(Runner):
    """Deserializes model.plan and runs it through Polygraphy's TrtRunner (named tensors, execute_async_v3).

    Outputs are Polygraphy's host buffers, reused by the next call: copy what you keep.
    """

    def __init__(self, artifact: Artifact, device: str) -> None:
        super().__init__(Signature.from_json(artifact.signature))
        self._path = artifact.path
        self._device = device
        self._runner: Any = None
        self._logger: Any = None
        self._trt_runtime: Any = None  # outlives the engine it deserialized

    def _activate(self) -> None:
        import tensorrt as trt
        from polygraphy.backend.trt import TrtRunner

        select_gpu(Device.of(self._device).cuda_index)
        self._logger = _capturing_logger(trt)
        self._trt_runtime = trt.Runtime(self._logger)
        engine = self._trt_runtime.deserialize_cuda_engine(self._path.read_bytes())
        if engine is None:
            raise BackendError(f"TensorRT could not load {self._path.name}: {self._logger.last_error()}")
        self._runner = TrtRunner(engine, name="tensorrt")
        try:
            self._runner.activate()
        except Exception as err:
            raise BackendError(f"TensorRT could not create an execution context: {err} ({self._logger.last_error()})") from err
        self._outputs = self.signature.output_names

    def _deactivate(self) -> None:
        if self._runner is not None:
            self._runner.deactivate()
        self._runner = None
        self._trt_runtime = None

    def _run(self, feed: Feed) -> list[np.ndarray]:
        try:
            out = self._runner.infer(feed, check_inputs=False)
        except Exception as err:
            # Polygraphy reports "execute_async_v3() failed" or "CUDA Error: 2"; TensorRT's log says why
            raise BackendError(f"TensorRT inference failed: {str(err).strip().splitlines()[0]} ({self._logger.last_error()})") from err
        return [out[n] for n in self._outputs]
