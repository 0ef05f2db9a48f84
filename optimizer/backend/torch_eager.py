"""The eager PyTorch baseline: the gate every candidate must beat. It is measured, never published."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.cuda import torch_cuda_availability
from optimizer.backend.torch_runner import TorchRunner
from optimizer.errors import BackendError
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel


class TorchEagerBackend(Backend):
    """Runs the source module as it is (fp32 unless the model itself is in another precision)."""

    name = "torch-eager"
    triton_platform = None
    devices = frozenset({"cpu", "cuda"})
    consumes = frozenset({"torch"})
    slow_imports = ("torch",)
    publishable = False
    needs_source_model = True
    workflow = frozenset({"aot", "jit"})

    def _availability(self, device: str) -> Availability:
        if Device.of(device).is_cuda:
            return torch_cuda_availability(device)
        return Availability(True)

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        workdir.mkdir(parents=True, exist_ok=True)
        return Artifact(self.name, device, str(workdir), [], signature.to_json(), None, batch_range=batch_range)

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        if model is None or model.module is None:
            raise BackendError("torch-eager needs the loaded PyTorch module to run.")
        module = model.module

        def _load():
            return module.to(str(device)) if Device.of(device).kind != "cpu" else module

        return TorchRunner(Signature.from_json(artifact.signature), _load, device)

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__}
