"""The TensorRT backend: the published max_batch_size against what the engine's profiles accept."""

from __future__ import annotations

from typing import Any

from optimizer.triton.config.rules.base import TRT, ArtifactFacts, RuleViolation, is_tensorrt


def tensorrt_engine(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """TensorRT backend: max_batch_size within what the engine's profiles accept."""
    if not is_tensorrt(config) or facts.engine_max_batch is None:
        return []
    if config.max_batch_size > facts.engine_max_batch:
        return [RuleViolation("tensorrt_engine", TRT, f"configuration specified max-batch {config.max_batch_size} but TensorRT engine only "
                              f"supports max-batch {facts.engine_max_batch}", f"publish max_batch_size <= {facts.engine_max_batch} or rebuild the engine")]
    return []
