"""Per-model server features: the response cache and model_metrics (Triton core ValidateModelConfig, ValidateModelMetrics)."""

from __future__ import annotations

from typing import Any

from optimizer.triton.config.rules.base import CORE, ArtifactFacts, RuleViolation


def response_cache(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: no response cache on a decoupled model."""
    # Triton core ValidateModelConfig (core main, 2026; the 2.51 server prints the same words); with sequence batching: rule sequence_batching
    if config.response_cache.enable and config.model_transaction_policy.decoupled:
        return [RuleViolation("response_cache", CORE, f"Response Cache does not currently support model {config.name} with 'decoupled' "
                              "transaction policy. Please disable the response cache.", "drop response_cache or decoupled")]
    return []


def model_metrics(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: model_metrics is well formed, and a warning that Triton 2.51 cannot read the field."""
    # Triton core ValidateModelMetrics (core main, 2026). The field is newer than Triton 2.51, whose parser does not know it.
    if "model_metrics" not in config.DESCRIPTOR.fields_by_name or not config.HasField("model_metrics"):
        return []
    out = [RuleViolation("model_metrics", CORE, 'Message type "inference.ModelConfig" has no field named "model_metrics"',
                         "serve it with a Triton release that defines model_metrics, or drop it", warn=True,
                         when="of Triton 2.51 (the server here) and older releases cannot read the field and skips the model ('failed to read text proto')")]
    for mc in config.model_metrics.metric_control:
        if not mc.HasField("metric_identifier"):
            message = "metric control must specify 'metric_identifier'"
        elif not mc.metric_identifier.family:
            message = "metric identifier must specify non-empty 'family'"
        elif not mc.HasField("histogram_options"):
            message = "metric control must specify 'histogram_options'"
        elif not mc.histogram_options.buckets:
            message = "histogram options must specify non-empty 'buckets'"
        else:
            continue
        return [RuleViolation("model_metrics", CORE, message, "metric_control { metric_identifier { family: ... } "
                              "histogram_options { buckets: [...] } }"), *out]
    return out
