"""aitune-export: tune a PyTorch model over inference backends and publish a validated Triton model repository.

The public Python API. Heavy libraries (torch, onnxruntime, openvino, tensorrt) are imported only
when a backend needs them, so importing this package is cheap.
"""

from __future__ import annotations

from optimizer._version import __version__
from optimizer.errors import (  # noqa: E402
    BackendError,
    CheckFailed,
    ConfigRuleError,
    ModelLoadError,
    NoCandidateError,
    OptimizerError,
    PublishError,
    SettingsError,
    SignatureError,
    TemplateError,
    TrafficError,
    UsageError,
    ValidationError,
)
from optimizer.settings import ExportSettings  # noqa: E402


def export(settings: ExportSettings | None = None, *, module=None, example_inputs=None, on_event=None, **options):
    """Tune and publish; see optimizer.app.export.export. `options` are ExportSettings fields, the CLI's long option
    names with underscores (`model="pkg.mod:build"`, `backend=["onnxruntime"]`, `max_batch_size=8`), over `settings`."""
    from dataclasses import asdict

    from optimizer.app.export import export as _export
    from optimizer.events import ignore
    from optimizer.settings import settings_from

    if options:
        settings = settings_from({**(asdict(settings) if settings is not None else {}), **options})
    return _export(settings, module=module, example_inputs=example_inputs, on_event=on_event or ignore)


__all__ = [
    "BackendError",
    "CheckFailed",
    "ConfigRuleError",
    "ExportSettings",
    "ModelLoadError",
    "NoCandidateError",
    "OptimizerError",
    "PublishError",
    "SettingsError",
    "SignatureError",
    "TemplateError",
    "TrafficError",
    "UsageError",
    "ValidationError",
    "__version__",
    "export",
]
