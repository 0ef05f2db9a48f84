"""The runner shared by every backend that executes a torch callable (eager, TorchScript, AOTInductor)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from optimizer.backend.base import Runner
from optimizer.machine import cpu_cores
from optimizer.model.reference import flatten_outputs
from optimizer.model.samples import Feed
from optimizer.model.signature import Signature
from optimizer.vocab import Device


class TorchRunner(Runner):
    """Calls a torch module with the feed's tensors in forward() order, under inference_mode."""

    def __init__(self, signature: Signature, load: Callable[[], Any], device: str) -> None:
        super().__init__(signature)
        self._load = load
        self._device = device
        self._module: Any = None

    def _activate(self) -> None:
        import torch

        if Device.of(self._device).kind == "cpu":
            torch.set_num_threads(cpu_cores())
        self._module = self._load()

    def _deactivate(self) -> None:
        self._module = None
        if Device.of(self._device).kind == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _run(self, feed: Feed) -> list[np.ndarray]:
        import torch

        names = self.signature.input_names
        on_cpu = Device.of(self._device).kind == "cpu"
        args = [torch.from_numpy(feed[n]) if on_cpu else torch.from_numpy(feed[n]).to(str(self._device), non_blocking=True) for n in names]
        with torch.inference_mode():
            result = self._module(*args)
        outs = flatten_outputs(result)
        return [(o if on_cpu else o.cpu()).numpy() if o.dtype != torch.bfloat16 else o.float().cpu().numpy() for o in outs]
