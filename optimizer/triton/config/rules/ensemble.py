"""Ensembles: platform "ensemble", its steps and the data flow from its inputs to its outputs (Triton core
ValidateModelConfig, ValidateEnsembleSchedulingConfig, BuildEnsembleGraph)."""

from __future__ import annotations

from typing import Any

from optimizer.triton.config.rules.base import CORE, ArtifactFacts, RuleViolation, backend_of


def ensemble(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: an ensemble's platform, steps and data flow (first error only, as Triton)."""
    # Triton core ValidateModelConfig + ValidateEnsembleSchedulingConfig/BuildEnsembleGraph (core main, 2026; checked against 2.51): first error
    n, es = config.name, config.ensemble_scheduling

    def bad(message: str, fix: str) -> list[RuleViolation]:
        return [RuleViolation("ensemble", CORE, message, fix)]

    if config.platform == "ensemble" and backend_of(config):  # a default_model_filename such as model.onnx names a backend too
        return bad(f"Ensemble model '{n}' must have platform type 'ensemble' and empty backend type", "drop backend")
    if not config.HasField("ensemble_scheduling"):
        if config.platform == "ensemble":
            return bad(f"ensemble scheduling must be set for ensemble {n} whose platform is ensemble", "add ensemble_scheduling { step [...] }")
        return []
    if config.platform != "ensemble":
        return bad(f"ensemble scheduling cannot be set for model '{n}' whose platform is not ensemble",
                   "drop ensemble_scheduling (an ensemble is a model of its own, platform \"ensemble\")")
    for present, what in ((len(config.instance_group), "instance group should not be specified"),
                          (config.HasField("optimization"), "optimization should not be specified"),
                          (len(config.model_warmup), "model_warmup can not be specified")):
        if present:
            return bad(f"{what} for ensemble '{n}'", "an ensemble runs no instances of its own: drop it")
    if not es.step:
        return bad(f"must specify 'step' for ensemble '{n}'", "add the steps")
    produced: dict[str, int] = {}  # ensemble tensor -> step writing it
    consumers: dict[str, list[int]] = {}  # ensemble tensor -> steps reading it
    for i, step in enumerate(es.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                return bad(f"must specify '{field}' in step {i} of ensemble '{n}'", f"give step {i} a {field}")
        for tensor in step.output_map.values():
            if tensor in produced:
                return bad(f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{n}' step {i}",
                           "write each ensemble tensor in one step")
            produced[tensor] = i
        for tensor in step.input_map.values():
            consumers.setdefault(tensor, []).append(i)
    ready = _ensemble_ready(config, produced, consumers)
    if isinstance(ready, str):
        return bad(ready, "every ensemble input feeds a step; every step input is an ensemble input or another step's output")
    for out in config.output:
        if out.name not in produced and out.name not in consumers:
            return bad(f"ensemble output '{out.name}' for ensemble {n}' is not used", "write it in a step's output_map")  # sic, as 2.51
        if out.name not in ready:
            # Triton may go on ": at least one of its depending tensors, '<t>', is not connected" (which one depends on map order)
            return bad(f"output '{out.name}' for ensemble '{n}' is not written", "connect the steps that write it to the ensemble inputs "
                       f"(unreached: {', '.join(sorted(set(produced) | set(consumers) - ready))})")
    outputs = {o.name for o in config.output}
    for tensor in [*produced, *consumers]:
        if tensor not in outputs and (tensor not in ready or tensor not in consumers):
            return bad(f"ensemble tensor '{tensor}' is unused in ensemble '{n}'", "drop it or feed it to a step")
    return []


def _ensemble_ready(config: Any, produced: dict[str, int], consumers: dict[str, list[int]]) -> set[str] | str:
    """Ensemble tensors the data flow reaches from the ensemble inputs (BuildEnsembleGraph's ready marks), or Triton's error."""
    ready: set[str] = set()
    for t in config.input:
        if t.name not in produced and t.name not in consumers:
            return f"ensemble input '{t.name}' for ensemble {config.name}' is not used"  # sic: Triton prints one quote
        ready.add(t.name)
    steps = list(config.ensemble_scheduling.step)
    changed = True
    while changed:
        changed = False
        for step in steps:
            if all(v in ready for v in step.input_map.values()):
                new = set(step.output_map.values()) - ready
                if new:
                    ready |= new
                    changed = True
    return ready
