"""The sequence batcher: its control tensors (Get{Boolean,Typed}SequenceControlProperties), preferred sizes and slots (Triton core)."""

from __future__ import annotations

from typing import Any

from optimizer.triton.config.rules.base import CORE, ArtifactFacts, RuleViolation

_BOOL_CONTROLS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY")
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


def _control_error(batcher: Any, n: str, kind: str) -> tuple[str | None, str]:
    """Get{Boolean,Typed}SequenceControlProperties (model_config_utils.cc): (Triton's error or None, the control's tensor name)."""
    typed = kind == "CONTROL_SEQUENCE_CORRID"
    seen_tensors, tensor = set(), ""
    for ci in batcher.control_input:
        if not ci.name:
            return f"sequence batching control tensor must have a name for {n}", ""
        if ci.name in seen_tensors:
            return f"sequence batching control tensor '{ci.name}' is specified for multiple control kinds for {n}", ""
        seen_tensors.add(ci.name)
        for c in ci.control:
            if type(c).Kind.Name(c.kind) != kind:
                continue
            if tensor:
                return f"sequence batching specifies multiple {kind} tensors for {n}", ""
            tensor = ci.name
            sizes = {"int32_false_true": len(c.int32_false_true), "fp32_false_true": len(c.fp32_false_true),
                     "bool_false_true": len(c.bool_false_true)}
            given = [k for k, v in sizes.items() if v]
            if typed:
                if given:
                    return f"sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {kind} for {n}", ""
            elif not given:
                return f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {kind} for {n}", ""
            elif len(given) > 1:
                return (f"sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' "
                        f"for {kind} for {n}"), ""
            elif sizes[given[0]] != 2:
                return f"sequence batching control '{given[0]}' must have exactly 2 entries for {kind} for {n}", ""
    return None, tensor


def sequence_controls(config: Any) -> dict[str, str]:
    """Control kind -> tensor name, for the controls the sequence batcher feeds (each is one more model input)."""
    if not config.HasField("sequence_batching"):
        return {}
    found = {kind: _control_error(config.sequence_batching, config.name, kind)[1] for kind in (*_BOOL_CONTROLS, "CONTROL_SEQUENCE_CORRID")}
    return {k: v for k, v in found.items() if v}


def sequence_batching(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: the sequence batcher's controls, preferred sizes and slot utilization (first error only, as Triton)."""
    # Triton core ValidateModelConfig, sequence block (core main, 2026; the 2.51 server prints the same words): first error only
    from tritonclient.grpc import model_config_pb2

    if not config.HasField("sequence_batching"):
        return []
    n, sb = config.name, config.sequence_batching

    def bad(message: str, fix: str) -> list[RuleViolation]:
        return [RuleViolation("sequence_batching", CORE, message, fix)]

    if config.response_cache.enable:
        return bad(f"Response Cache does not currently support model {n} with sequence batching scheduler. Please disable the response cache.",
                   "drop response_cache")
    for kind in (*_BOOL_CONTROLS, "CONTROL_SEQUENCE_CORRID"):
        error, tensor = _control_error(sb, n, kind)
        if error:
            return bad(error, "one control_input per tensor, each kind once; START/END/READY with one *_false_true pair, CORRID with a data_type")
        if kind == "CONTROL_SEQUENCE_CORRID" and tensor:
            control = next(c for ci in sb.control_input if ci.name == tensor for c in ci.control if c.kind == c.CONTROL_SEQUENCE_CORRID)
            if model_config_pb2.DataType.Name(control.data_type) not in _CORRID_TYPES:
                return bad(f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {n}. Allowed data types are TYPE_UINT64, TYPE_INT64, "
                           "TYPE_UINT32, TYPE_INT32 and TYPE_STRING", "give the CORRID control one of those data types")
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                return bad(f"sequence batching preferred batch size must be positive for {n}", "drop the preferred size")
            if size > config.max_batch_size:
                return bad(f"sequence batching preferred batch size must be <= max batch size for {n}",
                           f"preferred_batch_size {size} > max_batch_size {config.max_batch_size}")
    if sb.HasField("direct") and not 0.0 <= sb.direct.minimum_slot_utilization <= 1.0:
        return bad(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {n}", "use a fraction in (0, 1]")
    return []
