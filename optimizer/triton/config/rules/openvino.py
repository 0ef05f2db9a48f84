"""The OpenVINO backend: CPU instances, the parameter values it parses, batch padding (openvino_backend src/openvino.cc)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from optimizer.triton.config.rules.base import OPENVINO, ArtifactFacts, RuleViolation, backend_of

_OV_VALUES = MappingProxyType({
    "NUM_STREAMS": ("either AUTO/NUMA/<int_value>", lambda v: v in ("auto", "numa") or v.isdigit()),
    "COMPILATION_NUM_THREADS": ("a non-negative number", str.isdigit),
    "HINT_BF16": ("YES", lambda v: v == "yes"),
})
"""openvino parameters whose values PARAMETER_TYPES cannot describe: the backend's wording and the check (lower-cased)."""


def openvino(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """OpenVINO backend: CPU instances only, parameter values it accepts, and batch padding below max_batch_size."""
    from tritonclient.grpc import model_config_pb2

    if backend_of(config) != "openvino":
        return []
    # openvino_backend src/openvino.cc (main, 2026). It auto-completes inputs, outputs and max_batch_size from model.xml, so a
    # config without them loads (unless the server runs with --disable-auto-complete-config).
    out = []
    for i, g in enumerate(config.instance_group):
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)
        if kind != "KIND_CPU":
            out.append(RuleViolation("openvino", OPENVINO, f"unable to load model '{config.name}', Triton openVINO backend supports only "
                                     "CPU device", f"instance group {g.name or f'{config.name}_{i}'} has kind {kind}; use KIND_CPU"))
    params = {key: value.string_value for key, value in config.parameters.items()}
    for key, (expected, ok) in _OV_VALUES.items():
        if key in params and params[key] and not ok(params[key].lower()):
            out.append(RuleViolation("openvino", OPENVINO, f"expected the parameter '{key}' to be {expected}, got {params[key].lower()}"))
    if config.max_batch_size > 1 and params.get("ENABLE_BATCH_PADDING", "").lower() != "yes":
        # enforced in ProcessRequests, i.e. at request time: the model loads
        out.append(RuleViolation("openvino", OPENVINO, f"expected requests with batch size '{config.max_batch_size}', got '<n>'... this error can "
                                 "be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model configuration to 'YES' at a performance cost.",
                                 'set the parameter ENABLE_BATCH_PADDING to "YES" so smaller batches are padded',
                                 warn=True, when="loads it, but at request time a batch below max_batch_size may fail with"))
    return out
