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
    UsageError,
    ValidationError,
)
from optimizer.settings import ExportSettings  # noqa: E402


def export(settings: ExportSettings | None = None, **kwargs):
    """Tune and publish; see optimizer.app.export.export."""
    from optimizer.app.export import export as _export

    return _export(settings, **kwargs)


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
    "UsageError",
    "ValidationError",
    "__version__",
    "export",
]
