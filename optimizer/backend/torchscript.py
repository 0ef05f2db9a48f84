"""TorchScript (`pytorch_libtorch`, model.pt): traced from the module and frozen."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.cuda import torch_cuda_availability
from optimizer.backend.precision import reduced_precision_module
from optimizer.backend.torch_export import flat_outputs_module
from optimizer.backend.torch_runner import TorchRunner
from optimizer.errors import BackendError
from optimizer.machine import cpu_cores
from optimizer.model.samples import ShapePoint, generate_feed
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel

_LIBTORCH_OUTPUT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*__\d+$")


class TorchScriptBackend(Backend):
    """Traces forward() at a mid-size shape (so no axis is specialized to 1), freezes it and saves model.pt."""

    name = "torchscript"
    typical_build_s = 1.0
    triton_platform = "pytorch_libtorch"
    devices = frozenset({"cpu", "cuda"})
    consumes = frozenset({"torch"})
    slow_imports = ("torch",)
    workflow = frozenset({"aot", "jit"})
    default_settings = {"freeze": True}
    precisions = MappingProxyType({"cpu": frozenset({"fp32", "bf16"}), "cuda": frozenset({"fp32", "fp16", "bf16"})})
    build_format = 2  # nested and dict outputs are traced flat (format 1 saved them as returned: Triton could not serve them)

    def _availability(self, device: str) -> Availability:
        if Device.of(device).is_cuda:
            return torch_cuda_availability(device)
        return Availability(True)

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        import torch

        bad = [n for n in signature.output_names if not _LIBTORCH_OUTPUT.match(n)]
        if bad:
            raise BackendError(
                f"pytorch_libtorch needs outputs named <name>__<index>, got {', '.join(bad)}; "
                f"use --output-names {','.join(f'{n}__{i}' for i, n in enumerate(signature.output_names))}."
            )
        workdir.mkdir(parents=True, exist_ok=True)
        precision = self.settings["precision"]
        module = reduced_precision_module(model.inner_module, precision, [t.dtype.torch_name for t in signature.outputs])
        if isinstance(module, torch.jit.ScriptModule):
            scripted = module
        else:
            batch = min(2, batch_range[1]) if signature.batching else 0
            feed = generate_feed(signature, ShapePoint(batch, "max"), seed=1)
            args = tuple(torch.from_numpy(feed[n]) for n in signature.input_names)
            module = module.to(str(device)) if Device.of(device).kind != "cpu" else module
            args = tuple(a.to(str(device)) for a in args)
            with torch.no_grad():
                if not _flat(module(*args)):  # libtorch serves a tensor or a flat tuple of tensors, never nesting or a dict
                    module = flat_outputs_module(module)
                scripted = torch.jit.trace(module, args, check_trace=False, strict=False)
        if self.settings["freeze"]:
            scripted = torch.jit.freeze(scripted.eval())
        path = workdir / "model.pt"
        torch.jit.save(scripted, str(path))
        return Artifact(
            backend=self.name,
            device=device,
            directory=str(workdir),
            files=["model.pt"],
            signature=signature.to_json(),
            triton_platform=self.triton_platform,
            metadata={"method": "script" if isinstance(module, torch.jit.ScriptModule) else "trace", "frozen": self.settings["freeze"],
                      "precision": precision, **self.versions()},
            batch_range=batch_range,
        )

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        def _load() -> Any:
            import torch

            return torch.jit.load(str(artifact.path), map_location=str(device)).eval()

        return TorchRunner(Signature.from_json(artifact.signature), _load, device)

    def triton_settings(self, artifact: Artifact) -> dict[str, Any]:
        # INFERENCE_MODE matches how it was measured; thread counts are process-global in the libtorch backend.
        params = {"INFERENCE_MODE": "true", "DISABLE_OPTIMIZED_EXECUTION": "false"}
        if Device.of(artifact.device).kind == "cpu":
            params |= {"INTRA_OP_THREAD_COUNT": str(cpu_cores()), "INTER_OP_THREAD_COUNT": "1"}
        return {"parameters": params}

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__}


def _flat(outputs: Any) -> bool:
    """Whether a forward() result is what Triton's libtorch backend serves: one tensor, or a tuple or list of tensors."""
    import torch

    if isinstance(outputs, torch.Tensor):
        return True
    return isinstance(outputs, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in outputs)
