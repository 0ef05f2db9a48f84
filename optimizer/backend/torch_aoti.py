"""AOTInductor (`torch_aoti`, model.pt2): torch.export with the signature's dynamic axes, compiled to a .pt2 package.

Compiling is slow (C++ code generation and g++, most of a candidate's build on a small CPU), so the Inductor
cache lives in the run's work directory and is reused by the next run of the same model. The
cache directory is set only around the compile call, inside the candidate's own process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterator

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.precision import reduced_precision_module
from optimizer.backend.torch_export import args_dynamic_shapes, example_args, export_failure, flat_outputs_module
from optimizer.backend.torch_runner import TorchRunner
from optimizer.errors import BackendError, first_line
from optimizer.machine import cpu_cores
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel

log = logging.getLogger(__name__)

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
CACHE_DIRNAME = "inductor-cache"
"""Beside the artifact directory (candidates/<name>/inductor-cache): inside the run's work directory, outside the artifact."""

BATCH_DIM_FLOOR = 256
"""The batch Dim spans at least 1..256 (the default search cap): runs that differ only in --max-batch-size then
export the same graph and reuse the Inductor cache, and the correctness check's batch 3 is always inside it."""


def compiler() -> str:
    """The C++ compiler Inductor will call: $CXX, else g++ (clang++ on macOS), as torch._inductor.config.cpp.cxx."""
    return os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")


def inductor_cache_dir(workdir: Path) -> tuple[Path, str]:
    """Where this build caches: the user's $TORCHINDUCTOR_CACHE_DIR when set, else the run's work directory.

    Returns the directory and who chose it ("environment" or "run"). Inductor writes its own default
    into the variable the first time it looks (torch.export does), so that value does not count as set.
    """
    value, default = os.environ.get(CACHE_ENV), _torch_default_cache_dir()
    if value and not (default and os.path.abspath(value) == os.path.abspath(default)):
        return Path(value), "environment"
    return workdir.parent / CACHE_DIRNAME, "run"


def _torch_default_cache_dir() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return ""
    return default_cache_dir()


@contextlib.contextmanager
def inductor_cache(directory: Path) -> Iterator[None]:
    """Point Inductor at `directory` for the duration of one compile, then restore the environment."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir  # also clears in-memory caches
    except ImportError:  # older torch: set and restore the variable ourselves
        temporary_cache_dir = None
    if temporary_cache_dir is not None:
        with temporary_cache_dir(str(directory)):
            yield
        return
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(directory)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before


class TorchAOTIBackend(Backend):
    """torch.export (dynamic batch and axes) + torch._inductor.aoti_compile_and_package -> model.pt2."""

    build_format = 2
    """2: the package returns its outputs flattened (it once kept a ModelOutput type only transformers can load)."""

    name = "torch-aoti"
    typical_build_s = 30.0
    triton_platform = "torch_aoti"
    devices = frozenset({"cpu", "cuda"})
    consumes = frozenset({"torch"})
    slow_imports = ("torch",)
    # A DDP wrapper unwraps fine, but DTensor-sharded modules (FSDP2, tensor parallel) would need their
    # collectives compiled into the package; untested, so distributed modules stay with TorchScript.
    distributed_ok = False
    precisions = MappingProxyType({"cpu": frozenset({"fp32", "bf16"}), "cuda": frozenset({"fp32", "fp16", "bf16"})})
    """bf16/fp16 compile the module behind the reduced-precision wrapper: casts inside, the model's own dtypes at the
    package's boundary, so the config, the clients and Triton's pytorch backend see what an fp32 package has."""

    def availability(self, device: str, quick: bool = False) -> Availability:
        found = super().availability(device, quick)
        if not found:
            return found
        cxx = compiler()
        if shutil.which(cxx) is None:
            return Availability(False, f"AOTInductor compiles C++ with {cxx}, which is not on PATH; install g++ or set CXX.")
        return found

    def _availability(self, device: str) -> Availability:
        import torch

        if not hasattr(torch, "_inductor") or not hasattr(torch._inductor, "aoti_compile_and_package"):
            return Availability(False, f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package (needs torch >= 2.6).")
        if Device.of(device).kind == "cuda" and not torch.cuda.is_available():
            return Availability(False, "torch reports no CUDA device (torch.cuda.is_available() is False).")
        return Availability(True)

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        import torch

        module = model.inner_module
        if isinstance(module, torch.jit.ScriptModule):
            raise BackendError("torch.export cannot export a TorchScript module; give the Python module (package.module:callable) to build torch-aoti.")
        precision = self.settings["precision"]
        module = reduced_precision_module(module, precision, [t.dtype.torch_name for t in signature.outputs])
        workdir.mkdir(parents=True, exist_ok=True)
        if Device.of(device).kind == "cuda":
            module = module.to(str(device))
        args = example_args(signature, device)
        dynamic = args_dynamic_shapes(signature, max(batch_range[1], BATCH_DIM_FLOOR))
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                program = torch.export.export(flat_outputs_module(module), args, dynamic_shapes=dynamic)
        except Exception as err:
            raise BackendError(f"torch.export failed: {export_failure(err, signature)}") from err
        export_s = time.perf_counter() - t0
        cache, chosen_by = inductor_cache_dir(workdir)
        path = workdir / "model.pt2"
        t1 = time.perf_counter()
        try:
            with inductor_cache(cache):
                torch._inductor.aoti_compile_and_package(program, package_path=str(path))
        except Exception as err:
            raise BackendError(f"AOTInductor compile failed ({compiler()}): {first_line(err)}") from err
        compile_s = time.perf_counter() - t1
        log.info("%s | exported in %.1f s, compiled in %.1f s (Inductor cache %s)", self.name, export_s, compile_s, cache)
        return Artifact(
            backend=self.name,
            device=device,
            directory=str(workdir),
            files=[path.name],
            signature=signature.to_json(),
            triton_platform=self.triton_platform,
            metadata={
                "exporter": "torch.export.export + torch._inductor.aoti_compile_and_package",
                "export_s": round(export_s, 2),
                "compile_s": round(compile_s, 2),
                "inductor_cache": str(cache),
                "inductor_cache_from": chosen_by,
                "compiler": compiler(),
                **({"precision": precision} if precision != "fp32" else {}),  # fp32 reports stay as they were
                "dynamic_axes": {name: {str(axis): str(dim) for axis, dim in axes.items()} for name, axes in zip(signature.input_names, dynamic[0])},
                **self.versions(),
            },
            batch_range=batch_range,
        )

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        def _load() -> Any:
            import torch._inductor

            index = int(device.split(":")[1]) if ":" in device else -1
            return torch._inductor.aoti_load_package(str(artifact.path), device_index=index)

        return TorchRunner(Signature.from_json(artifact.signature), _load, device)

    def triton_settings(self, artifact: Artifact) -> dict[str, Any]:
        # The PyTorch backend's Inductor path reads the same parameters as libtorch; threads are process-global.
        params = {"INFERENCE_MODE": "true"}
        if Device.of(artifact.device).kind == "cpu":
            params |= {"INTRA_OP_THREAD_COUNT": str(cpu_cores()), "INTER_OP_THREAD_COUNT": "1"}
        return {"parameters": params}

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__}
