"""MultiBackendStrategy: keeps candidate lists and resolves them once the module is known.

Explicit lists always win, including an empty one (which is a clear error at tune time, never a
silent eager fallback). Defaults depend on the workflow and on whether the module is distributed,
and are rebuilt whenever that changes, so a reused strategy never keeps incompatible backends.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from optimizer.backend import Backend, backend_named
from optimizer.errors import SettingsError
from optimizer.model.source import is_distributed
from optimizer.tune_strategy.context import TuneContext
from optimizer.tune_strategy.tune_strategy import TuneStrategy

WORKFLOWS = ("aot", "jit")


class MultiBackendStrategy(TuneStrategy):
    """Tries several backends. `backends=None` means the defaults for the workflow and the module."""

    name: ClassVar[str] = "multi-backend"

    def __init__(self, backends: Sequence[str | Backend] | None = None, workflow: str = "aot", **kwargs: Any) -> None:
        if workflow not in WORKFLOWS:
            raise ValueError(f"workflow {workflow!r} is not one of 'aot' or 'jit'.")
        if workflow == "jit":
            kwargs.setdefault("find_max_batch_size", False)
        super().__init__(**kwargs)
        self.workflow = workflow
        self._explicit: list[Backend] | None = None if backends is None else [self._as_backend(b) for b in backends]
        self._distributed: bool | None = None
        self.device = "cpu"  # the device of the last tuning run; AOT defaults on a GPU add GPU engines
        self._defaults: list[Backend] | None = None

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

    # -- defaults each concrete strategy defines -----------------------------------------------
    def _default_aot_backends(self, distributed: bool) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must define _default_aot_backends")

    def _default_jit_backends(self, distributed: bool) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must define _default_jit_backends")

    # -- resolution --------------------------------------------------------------------------
    def _configure_for_module(self, module: Any) -> None:
        """Select defaults for this module; a change between distributed and ordinary rebuilds them."""
        distributed = is_distributed(module)
        if distributed != self._distributed:
            self._distributed = distributed
            self._defaults = None

    def _resolve_default_backends(self) -> list[Backend]:
        """Only the candidates of the selected workflow and module type."""
        distributed = bool(self._distributed)
        names = self._default_jit_backends(distributed) if self.workflow == "jit" else self._default_aot_backends(distributed)
        return [backend_named(n) for n in names]

    @property
    def _backends(self) -> list[Backend]:
        """The explicit candidates, or the defaults for the current module."""
        if self._explicit is not None:
            return list(self._explicit)
        if self._defaults is None:
            self._defaults = self._resolve_default_backends()
        return list(self._defaults)

    def _configure_for_device(self, device: str) -> None:
        """A change between CPU and GPU rebuilds the defaults (GPU-only engines join or leave)."""
        if device.split(":", 1)[0] != self.device.split(":", 1)[0]:
            self._defaults = None
        self.device = device

    def candidate_backends(self, module: Any, device: str = "cpu") -> list[Backend]:
        """The candidates this strategy tries for `module` on `device`: the explicit list, or the defaults."""
        self._configure_for_module(module)
        self._configure_for_device(device)
        return self._backends

    def _candidate_backends(self, ctx: TuneContext) -> list[Backend]:
        return self.candidate_backends(ctx.model.module, ctx.device)


def check_backend_names(names: Sequence[str]) -> None:
    """Reject unknown backend names before any work starts."""
    from optimizer.backend import BACKENDS

    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise SettingsError(f"unknown backend(s) {', '.join(unknown)}; choose from: {', '.join(BACKENDS)}.")
