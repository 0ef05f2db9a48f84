"""The one entry point: every rule (Triton core's first, then the backends'), run on a parsed config.

Two outcomes: a refusal (`violations`; `check` raises) is only for configs the enforcer refuses to
load. What Triton loads but fails later (OpenVINO requests below max_batch_size), loads with a
warning (libtorch outputs not named <name>__<index> bind in config order), or what cannot be decided
here (a `gpus` id with no GPU information on this machine; `model_metrics`, which Triton 2.51 cannot
read) is a warning (`warnings`; `check` logs it and returns it): a rule must never refuse a config
Triton loads.
"""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import Any

from optimizer.errors import ConfigRuleError
from optimizer.triton.config.rules.base import ArtifactFacts, Rule, RuleViolation
from optimizer.triton.config.rules.batching import dynamic_batching, max_batch_size
from optimizer.triton.config.rules.ensemble import ensemble
from optimizer.triton.config.rules.instances import instance_group
from optimizer.triton.config.rules.onnxruntime import onnx_io, optimization
from optimizer.triton.config.rules.openvino import openvino
from optimizer.triton.config.rules.parameters import parameters
from optimizer.triton.config.rules.platform import name, platform_backend, version_policy
from optimizer.triton.config.rules.pytorch import libtorch_names, torch_aoti_names
from optimizer.triton.config.rules.sequence import sequence_batching
from optimizer.triton.config.rules.server_features import model_metrics, response_cache
from optimizer.triton.config.rules.tensorrt import tensorrt_engine
from optimizer.triton.config.rules.tensors import batch_io, io
from optimizer.triton.config.rules.warmup import warmup

log = logging.getLogger(__name__)

RULES: MappingProxyType[str, Rule] = MappingProxyType({
    # Triton core: ValidateModelConfig (model_config_utils.cc), then the repository manager's name check, then what loading checks
    "platform_backend": platform_backend,
    "max_batch_size": max_batch_size,
    "dynamic_batching": dynamic_batching,
    "sequence_batching": sequence_batching,
    "ensemble": ensemble,
    "response_cache": response_cache,
    "model_metrics": model_metrics,
    "name": name,  # after ValidateModelConfig: Triton fills an empty name and checks the directory once the config is valid
    "version_policy": version_policy,
    "io": io,
    "batch_io": batch_io,
    "instance_group": instance_group,
    "warmup": warmup,
    # the backends, as they load the model
    "parameters": parameters,
    "optimization": optimization,
    "onnx_io": onnx_io,
    "libtorch_names": libtorch_names,
    "torch_aoti_names": torch_aoti_names,
    "tensorrt_engine": tensorrt_engine,
    "openvino": openvino,
})
"""Rule name -> check; every rule runs on every config, in this order (the first refusal is the one `check` quotes).
A rule's function is named as the rule, in the module of its family (tests/test_triton_config.py breaks each one once)."""


def _all(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    return [v for fn in RULES.values() for v in fn(config, facts)]


def violations(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Every refusal (empty when the config would load)."""
    return [v for v in _all(config, facts) if not v.warn]


def warnings(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """What Triton loads but fails or warns about later, or what cannot be decided on this machine."""
    return [v for v in _all(config, facts) if v.warn]


def check(config: Any, facts: ArtifactFacts, where: str = "config.pbtxt") -> list[RuleViolation]:
    """Raise ConfigRuleError quoting the first refusal in its enforcer's words (and counting the others); log and return the warnings."""
    found, advisories = [], []
    for v in _all(config, facts):
        (advisories if v.warn else found).append(v)
    for w in advisories:
        log.warning("%s: %s %s: \"%s\"%s", where, w.source, w.when, w.message, f"; fix: {w.fix}" if w.fix else "")
    if not found:
        return advisories
    first = found[0]
    more = f" ({len(found) - 1} more: {'; '.join(v.message for v in found[1:3])}{'; ...' if len(found) > 3 else ''})" if len(found) > 1 else ""
    fix = f"; fix: {first.fix}" if first.fix else ""
    raise ConfigRuleError(f"{where} would be rejected by {first.source}: \"{first.message}\"{fix}{more}.")
