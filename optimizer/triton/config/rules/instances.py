"""Instance groups: kinds, GPU ids against the serving machine's GPUs, TensorRT profiles (Triton core ValidateInstanceGroup)."""

from __future__ import annotations

import re
from typing import Any

from optimizer.triton.config.rules.base import CORE, TRT, ArtifactFacts, RuleViolation, gpu_only, platform_of


def instance_group(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core and TensorRT backend: instance kinds, GPU ids and engine profiles."""
    from tritonclient.grpc import model_config_pb2

    out, platform = [], platform_of(config)  # core checks the platform it completed (backend "tensorrt" alone is tensorrt_plan)
    for i, g in enumerate(config.instance_group):
        name = g.name or f"{config.name}_{i}"
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)
        where = f"instance group {name} of model {config.name}"
        if g.gpus and kind in ("KIND_CPU", "KIND_MODEL"):
            out.append(RuleViolation("instance_group", CORE, f"{where} has kind {kind} but specifies one or more GPUs", "drop gpus or use KIND_GPU"))
        if g.gpus and kind == "KIND_GPU":
            out += _gpu_ids(where, list(g.gpus), facts)
        if g.profile and platform != "tensorrt_plan":
            # sic: Triton prints no space between the platform and "specifies"
            out.append(RuleViolation("instance_group", CORE, f"{where} and platform {platform}specifies profile field which is only "
                                     "supported for TensorRT models", "drop profile"))
        for p in g.profile:
            if not re.fullmatch(r"[+-]?\d+", p.strip()):
                out.append(RuleViolation("instance_group", CORE, f"unable to parse '{p}': stoi", "profiles are engine profile indexes: \"0\", \"1\", ..."))
            elif int(p) < 0:
                out.append(RuleViolation("instance_group", CORE, f"{where} and platform {platform} specifies invalid profile {p}. "
                                         "The field should contain the string representation of a non-negative integer.", "use \"0\", \"1\", ..."))
            elif facts.engine_profile_count is not None and int(p) >= facts.engine_profile_count:
                out.append(RuleViolation("instance_group", TRT, f"{where} selects optimization profile {p} but the engine has "
                                         f"{facts.engine_profile_count} profile(s)", f"use profiles 0..{facts.engine_profile_count - 1}"))
        if kind == "KIND_CPU" and gpu_only(config):
            out.append(RuleViolation("instance_group", TRT, f"{where} has kind KIND_CPU, but a TensorRT engine runs on a GPU only",
                                     "use KIND_GPU"))
    return out


def _gpu_ids(where: str, gpus: list[int], facts: ArtifactFacts) -> list[RuleViolation]:
    """Triton core ValidateInstanceGroup (core main, 2026; the 2.51 server prints the same words): every id must be a GPU of the
    serving machine. Triton goes on ". GPUs with at least the minimum required CUDA compute compatibility of 6.000000 are: <ids>".
    We know only this machine: with GPUs here the config is for it and a missing id is refused; without (none, or unknown) we warn."""
    words = f"{where} specifies invalid or unsupported gpu id "
    out = [RuleViolation("instance_group", CORE, words + str(i), "GPU ids are 0, 1, ...") for i in gpus if i < 0]
    count = _gpu_count(facts)
    high = sorted({i for i in gpus if i >= 0 and (count is None or i >= count)})
    if not high:
        return out
    if count:
        return out + [RuleViolation("instance_group", CORE, words + str(i), f"this machine has {count} GPU(s) (ids 0..{count - 1}) and the config "
                                    "is checked against this machine's count: list only those, or publish on the serving machine") for i in high]
    here = "this machine has no GPU" if count == 0 else "this machine's GPU count is unknown (torch without CUDA, no nvidia-smi)"
    return out + [RuleViolation("instance_group", CORE, words + str(high[-1]), "make sure the serving machine has these GPUs", warn=True,
                                when=f"is not checked ({here}); a serving machine without GPU {high[-1]} refuses the load with")]


def _gpu_count(facts: ArtifactFacts) -> int | None:
    return facts.gpu_count() if callable(facts.gpu_count) else facts.gpu_count
