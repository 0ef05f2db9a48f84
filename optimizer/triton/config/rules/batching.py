"""How requests are batched: max_batch_size and the dynamic batcher (Triton core)."""

from __future__ import annotations

from typing import Any

from optimizer.triton.config.rules.base import CORE, ArtifactFacts, RuleViolation

DELAY = 1  # ModelQueuePolicy.TimeoutAction.DELAY


def max_batch_size(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: max_batch_size is 0 (no batching) or positive."""
    if config.max_batch_size < 0:
        return [RuleViolation("max_batch_size", CORE, f"'max_batch_size' must be non-negative value for {config.name}",
                              "use 0 (no batching) or the largest batch the model accepts")]
    return []


def dynamic_batching(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: preferred sizes within max_batch_size, priority levels in range, no DELAY with preserve_ordering."""
    if not config.HasField("dynamic_batching"):
        return []
    n, db, out = config.name, config.dynamic_batching, []

    def bad(message: str, fix: str) -> None:
        out.append(RuleViolation("dynamic_batching", CORE, message, fix))

    for size in db.preferred_batch_size:
        if size <= 0:
            bad(f"dynamic batching preferred size must be positive for {n}", "drop the preferred size")
        elif size > config.max_batch_size:
            bad(f"dynamic batching preferred size must be <= max batch size for {n}",
                f"preferred_batch_size {size} > max_batch_size {config.max_batch_size}")
    levels = db.priority_levels
    if levels:
        if db.default_priority_level == 0 or db.default_priority_level > levels:
            bad(f"default priority level must be in range [1, {levels}] for {n}", "set default_priority_level within the levels")
        for level in db.priority_queue_policy:
            if level == 0 or level > levels:
                bad(f"priority queue policy must have priority level in range [1, {levels}] for {n}", "use levels 1..priority_levels")
    if db.preserve_ordering:
        if levels > 1:
            bad(f"Only one priority level is allowed when 'preserve_ordering' is true for {n}", "drop priority_levels or preserve_ordering")
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == DELAY for p in policies):
            bad(f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {n}", "use REJECT")
    return out
