"""Screening: whether a candidate can even start here, decided the same way by `export` and `inspect`.

A candidate is screened out when it cannot build from the model's format, is a baseline, or is
unavailable on the device (its library is missing, the device or precision is not one it runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.backend import Backend
from optimizer.vocab import Device


@dataclass(frozen=True)
class Screening:
    """One backend as a run meets it: will it start, and if not, its status and the one-sentence reason."""

    backend: Backend
    name: str  # the candidate name, e.g. "onnxruntime[cpu]"
    runnable: bool
    status: str = ""  # "skipped" or "unavailable" when not runnable
    reason: str = ""  # why not, or what availability reported (e.g. the GPU's name)


def screen(backend: Backend, model_format: str, device: Device | str) -> Screening:
    """Screen one backend for a model of `model_format` on `device` (imports its library for real)."""
    name = backend.candidate_name(device)
    if model_format not in backend.consumes:
        return Screening(backend, name, False, "skipped",
                         f"{backend.name} cannot build from a {model_format} model (it takes: {', '.join(sorted(backend.consumes))})")
    if not backend.publishable:
        return Screening(backend, name, False, "skipped", f"{backend.name} is a baseline and is never published")
    av = backend.availability(device)
    return Screening(backend, name, bool(av), "" if av else "unavailable", av.reason)
