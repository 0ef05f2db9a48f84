"""MultiBackendStrategy: keeps candidate lists and resolves them once the module and the device are known.

Explicit lists always win, including an empty one (which is a clear error at tune time, never a
silent eager fallback). Defaults depend on the workflow, on whether the module is distributed and
on the device; they are worked out afresh for every call from those arguments, so a reused
strategy never keeps backends that suit another module or device.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, Sequence

from optimizer.backend import BACKENDS, Backend, backend_named
from optimizer.errors import SettingsError
from optimizer.model.loaded_model import is_distributed
from optimizer.tune_strategy.tune_strategy import TuneStrategy
from optimizer.vocab import Device


class MultiBackendStrategy(TuneStrategy):
    """Tries several backends. `backends=None` means the defaults for the workflow, the module and the device."""

    name: ClassVar[str] = "multi-backend"

    def __init__(self, backends: Sequence[str | Backend] | None = None, workflow: str = "aot", **kwargs: Any) -> None:
        if workflow == "jit":
            kwargs.setdefault("find_max_batch_size", False)
        super().__init__(workflow=workflow, **kwargs)
        self._explicit: list[Backend] | None = None if backends is None else [self._as_backend(b) for b in backends]

    @classmethod
    def for_aot(cls, **kwargs: Any) -> MultiBackendStrategy:
        """AOT candidates with max-batch-size discovery, exactly like the regular constructor."""
        return cls(workflow="aot", **kwargs)

    @classmethod
    def for_jit(cls, **kwargs: Any) -> MultiBackendStrategy:
        """JIT candidates, no max-batch-size discovery: tunes only the batch sizes recorded in the samples."""
        kwargs.setdefault("find_max_batch_size", False)
        return cls(workflow="jit", **kwargs)

    @staticmethod
    def _as_backend(b: str | Backend) -> Backend:
        return backend_named(b) if isinstance(b, str) else b

    # -- defaults each concrete strategy defines (AITune's abstract pair) ------------------------
    @abstractmethod
    def _default_aot_backends(self, distributed: bool, device: Device) -> list[str]:
        """Backend names tried in the AOT workflow for an ordinary or a distributed module on `device`."""

    @abstractmethod
    def _default_jit_backends(self, distributed: bool) -> list[str]:
        """Backend names tried in the JIT workflow (cheap builds; only recorded batch sizes are measured)."""

    # -- resolution --------------------------------------------------------------------------
    def candidate_backends(self, module: Any, device: Device | str = "cpu") -> list[Backend]:
        """The explicit list, or the defaults for this module's kind (distributed or not) and this device."""
        if self._explicit is not None:
            return list(self._explicit)
        distributed = is_distributed(module)
        if self.workflow == "jit":
            names = self._default_jit_backends(distributed)
        else:
            names = self._default_aot_backends(distributed, Device.of(device))
        return [backend_named(n) for n in names]


def check_backend_names(names: Sequence[str]) -> None:
    """Reject unknown backend names before any work starts."""
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise SettingsError(f"unknown backend(s) {', '.join(unknown)}; choose from: {', '.join(BACKENDS)}.")
