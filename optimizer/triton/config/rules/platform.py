"""Which model this is and who loads it: the name, the platform/backend pair, the versions served (Triton core)."""

from __future__ import annotations

from typing import Any

from optimizer.triton.config.rules.base import CORE, PLATFORM_BACKEND, TYPED_BACKENDS, ArtifactFacts, RuleViolation, backend_of, platform_of


def name(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: the config names its model, and the name is the model's directory name."""
    if not config.name:
        return [RuleViolation("name", CORE, "model configuration must specify 'name'", "set name to the model's directory name")]
    if facts.directory_name is not None and config.name != facts.directory_name:
        return [RuleViolation("name", CORE, f"unexpected directory name '{facts.directory_name}' for model '{config.name}', "
                              "directory name must equal model name", f'write name: "{facts.directory_name}"')]
    return []


def platform_backend(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: a platform or a backend Triton knows, and a platform/backend pair that agree (both as core completes them)."""
    # core ValidateModelConfig on the config AutoCompleteBackendFields completed: a default_model_filename such as model.onnx names the
    # backend too, so `default_model_filename: "model.xml"` loads with any platform or none (what the version folder holds we do not guess)
    n, backend, platform = config.name, backend_of(config), platform_of(config)
    if not config.platform and not backend:
        return [RuleViolation("platform_backend", CORE, f"must specify 'platform' or 'backend' for '{n}'", "keep the template's header partial")]
    if not backend and config.platform != "ensemble":
        hint = " (openvino is a backend: write backend: \"openvino\")" if config.platform == "openvino" else ""
        return [RuleViolation("platform_backend", CORE, f"unexpected platform type '{config.platform}' for {n}",
                              f"use one of {', '.join(PLATFORM_BACKEND)}{hint}")]
    if backend in TYPED_BACKENDS and platform not in ("", "ensemble") and PLATFORM_BACKEND.get(platform) != backend:
        return [RuleViolation("platform_backend", CORE, f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}",
                              "drop `backend` or make it the platform's backend" if config.backend else
                              f"default_model_filename {config.default_model_filename!r} is the {backend} backend's file: "
                              "drop it or name that backend's platform")]
    return []


def version_policy(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: the version policy serves at least one of the model's version directories."""
    if facts.versions is None:
        return []
    vp = config.version_policy
    kind = vp.WhichOneof("policy_choice") if config.HasField("version_policy") else "latest"
    if kind == "specific":
        served = [v for v in vp.specific.versions if v in facts.versions]
    elif kind == "all":
        served = list(facts.versions)
    else:
        count = vp.latest.num_versions if config.HasField("version_policy") else 1
        served = sorted(facts.versions)[-count:] if count > 0 else []
    if not served:
        return [RuleViolation("version_policy", CORE, f"at least one version must be available under the version policy of model '{config.name}'",
                              f"the model has versions {list(facts.versions)}; name one of them")]
    return []
