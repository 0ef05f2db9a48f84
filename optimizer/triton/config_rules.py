"""Triton's load-time rules, checked before anything is written (reference/triton.md §2.10).

Messages quote Triton's own wording (core/src/model_config_utils.cc and the backends) so that a
user who has seen the server's error recognizes it, and add what to change.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from optimizer.backend.base import Artifact
from optimizer.backend.triton_platforms import PLATFORMS
from optimizer.errors import ConfigRuleError
from optimizer.model.onnx_graph import onnx_io_names

WILDCARD = -1
_LIBTORCH_NAME = re.compile(r"^.+__\d+$")


@dataclass(frozen=True)
class ArtifactFacts:
    """What the artifact itself says, for the backend-level rules (None where unknown)."""

    directory_name: str | None = None
    onnx_inputs: tuple[str, ...] | None = None
    onnx_outputs: tuple[str, ...] | None = None
    engine_max_batch: int | None = None  # TensorRT: min over inputs of the largest profile-max batch
    on_cpu_only_machine: bool = False


@dataclass
class RuleViolation:
    rule: str
    message: str


Rule = Callable[[Any, ArtifactFacts], list[str]]
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


def _kind(config: Any, enum_value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.ModelInstanceGroup.Kind.Name(enum_value)


@rule("name")
def _name(config: Any, facts: ArtifactFacts) -> list[str]:
    if not config.name:
        return ["must specify 'name'"]
    if facts.directory_name is not None and config.name != facts.directory_name:
        return [f"model name '{config.name}' does not match the directory '{facts.directory_name}'; Triton requires them equal"]
    return []


@rule("platform_backend")
def _platform(config: Any, facts: ArtifactFacts) -> list[str]:
    if not config.platform and not config.backend:
        return ["must specify 'platform' or 'backend'"]
    if config.platform:
        known = {p.platform: p for p in PLATFORMS.values() if p.platform}
        if config.platform not in known:
            return [f"unexpected platform type '{config.platform}'; use one of: {', '.join(known)} (openvino is a backend, not a platform)"]
        if config.backend and config.backend != known[config.platform].backend:
            return ["unexpected 'platform' and 'backend' pair, got:" f"{config.platform}, {config.backend}"]
    return []


@rule("max_batch_size")
def _mbs(config: Any, facts: ArtifactFacts) -> list[str]:
    out = []
    if config.max_batch_size < 0:
        out.append("'max_batch_size' must be non-negative value")
    if facts.engine_max_batch is not None and config.max_batch_size > facts.engine_max_batch:
        out.append(
            f"configuration specified max-batch {config.max_batch_size} but TensorRT engine only supports max-batch {facts.engine_max_batch}"
        )
    return out


@rule("dynamic_batching")
def _dynamic(config: Any, facts: ArtifactFacts) -> list[str]:
    if not config.HasField("dynamic_batching"):
        return []
    out = []
    db = config.dynamic_batching
    if config.max_batch_size == 0:
        out.append("dynamic batching needs max_batch_size > 0; a non-batching model cannot use the dynamic batcher")
    for size in db.preferred_batch_size:
        if size < 1:
            out.append("dynamic batching preferred size must be positive")
        elif size > config.max_batch_size:
            out.append(f"dynamic batching preferred size must be <= max batch size ({size} > {config.max_batch_size})")
    if db.preserve_ordering and db.priority_levels > 1:
        out.append("Only one priority level is allowed when 'preserve_ordering' is true")
    if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
        out.append(f"default priority level must be in range [1, {db.priority_levels}]")
    return out


def _io_rules(kind: str, tensors: Any, config: Any) -> list[str]:
    out = []
    seen = set()
    for t in tensors:
        prefix = f"model {kind} "
        if not t.name:
            out.append(prefix + "must specify 'name'")
            continue
        if t.name in seen:
            out.append(f"{prefix}'{t.name}' is specified more than once")
        seen.add(t.name)
        p = f"{prefix}'{t.name}' "
        if t.data_type == 0:
            out.append(p + "must specify 'data_type'")
        if len(t.dims) == 0:
            out.append(p + "must specify 'dims'")
        for d in t.dims:
            if d < 1 and d != WILDCARD:
                out.append(p + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension")
                break
        if t.HasField("reshape"):
            shape = list(t.reshape.shape)
            if not shape and config.max_batch_size == 0:
                out.append(p + "cannot have empty reshape for non-batching model as scalar tensors are not supported")
            elif WILDCARD not in list(t.dims) + shape:
                if math.prod(t.dims) != (math.prod(shape) if shape else 1):
                    out.append(p + "has different size for dims and reshape")
            elif (WILDCARD in t.dims) != (WILDCARD in shape):
                out.append(p + "has different number of variable-size dimensions for dims and reshape")
        if t.is_shape_tensor and config.platform != "tensorrt_plan" and config.backend != "tensorrt":
            out.append("shape tensors are only supported for TensorRT platform")
    return out


@rule("inputs")
def _inputs(config: Any, facts: ArtifactFacts) -> list[str]:
    return _io_rules("input", config.input, config)


@rule("outputs")
def _outputs(config: Any, facts: ArtifactFacts) -> list[str]:
    return _io_rules("output", config.output, config)


@rule("instance_group")
def _instances(config: Any, facts: ArtifactFacts) -> list[str]:
    out = []
    for i, g in enumerate(config.instance_group):
        name = g.name or f"{config.name}_{i}"
        kind = _kind(config, g.kind)
        if g.count < 1:
            out.append(f"instance group {name} of model {config.name} must have count >= 1")
        if g.gpus and kind in ("KIND_CPU", "KIND_MODEL"):
            out.append(f"instance group {name} of model {config.name} has kind {kind} but specifies one or more GPUs")
        if g.profile and config.platform != "tensorrt_plan" and config.backend != "tensorrt":
            out.append(f"instance group {name} of model {config.name} and platform {config.platform or config.backend} specifies profile field which is only supported for TensorRT models")
        for p in g.profile:
            if not p.isdigit():
                out.append(f"instance group {name} of model {config.name} has invalid profile '{p}': it must be an integer")
        if kind == "KIND_GPU" and facts.on_cpu_only_machine:
            out.append(f"instance group {name} of model {config.name} has kind KIND_GPU but no GPUs are available")
        if kind == "KIND_CPU" and (config.platform == "tensorrt_plan" or config.backend == "tensorrt"):
            out.append(f"instance group {name} of model {config.name} has kind KIND_CPU but TensorRT engines run on GPUs only; use KIND_GPU")
    return out


@rule("warmup")
def _warmup(config: Any, facts: ArtifactFacts) -> list[str]:
    out = []
    inputs = {t.name: t for t in config.input}
    for w in config.model_warmup:
        if w.batch_size < 1 or (config.max_batch_size == 0 and w.batch_size != 1):
            out.append(f"warmup '{w.name}' batch size {w.batch_size} must be >= 1 (and 1 for a non-batching model)")
        if w.batch_size > max(config.max_batch_size, 1):
            out.append(f"warmup '{w.name}' batch size {w.batch_size} exceeds max_batch_size {config.max_batch_size}")
        for key, value in w.inputs.items():
            if key not in inputs:
                out.append(f"warmup '{w.name}' names input '{key}', which is not a model input")
            if any(d == WILDCARD for d in value.dims):
                out.append("warmup setting expects all variable-size dimensions are specified")
    return out


@rule("onnx_names")
def _onnx_names(config: Any, facts: ArtifactFacts) -> list[str]:
    out = []
    if facts.onnx_inputs is not None:
        for t in config.input:
            if t.name not in facts.onnx_inputs:
                out.append(f"unexpected inference input '{t.name}', allowed inputs are: {', '.join(facts.onnx_inputs)}")
    if facts.onnx_outputs is not None:
        for t in config.output:
            if t.name not in facts.onnx_outputs:
                out.append(f"unexpected inference output '{t.name}', allowed outputs are: {', '.join(facts.onnx_outputs)}")
    return out


@rule("libtorch_names")
def _libtorch(config: Any, facts: ArtifactFacts) -> list[str]:
    if config.platform != "pytorch_libtorch":
        return []
    return [
        f"output '{t.name}' does not follow the <name>__<index> naming convention the PyTorch backend needs"
        for t in config.output
        if not _LIBTORCH_NAME.match(t.name)
    ]


_OV_CHOICES = {
    "NUM_STREAMS": ("either AUTO/NUMA/<int_value>", lambda v: v in ("auto", "numa") or v.isdigit()),
    "PERFORMANCE_HINT": ("LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT", lambda v: v in ("latency", "throughput", "cumulative_throughput")),
    "INFERENCE_NUM_THREADS": ("a non-negative number", str.isdigit),
    "COMPILATION_NUM_THREADS": ("a non-negative number", str.isdigit),
    "HINT_BF16": ("YES", lambda v: v == "yes"),
}
"""The openvino backend's typed parameters: how it describes the accepted values, and the check (on the lower-cased value)."""


@rule("openvino")
def _openvino(config: Any, facts: ArtifactFacts) -> list[str]:
    if config.backend != "openvino" or config.platform:
        return []
    out = []
    if not config.input or not config.output:
        out.append("the openvino backend does not auto-complete the configuration; list every input and output")
    for i, g in enumerate(config.instance_group):
        kind = _kind(config, g.kind)
        if kind != "KIND_CPU":
            out.append(f"unable to load model '{config.name}', Triton openVINO backend supports only CPU device "
                       f"(instance group {g.name or f'{config.name}_{i}'} has kind {kind}; use KIND_CPU)")
    params = {key: value.string_value for key, value in config.parameters.items()}
    for key, (expected, ok) in _OV_CHOICES.items():
        if key in params and params[key] and not ok(params[key].lower()):
            out.append(f"expected the parameter '{key}' to be {expected}, got {params[key].lower()}")
    if config.max_batch_size > 1 and params.get("ENABLE_BATCH_PADDING", "").lower() != "yes":
        out.append(
            f"the openvino backend fixes the batch at max_batch_size {config.max_batch_size} and answers any smaller batch with "
            f"\"expected requests with batch size '{config.max_batch_size}', got ...\"; set the parameter ENABLE_BATCH_PADDING to YES"
        )
    return out


def violations(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Every broken rule (empty when the config would load)."""
    return [RuleViolation(name, msg) for name, fn in RULES.items() for msg in fn(config, facts)]


def check(config: Any, facts: ArtifactFacts, where: str = "config.pbtxt") -> None:
    """Raise ConfigRuleError quoting the first broken rule (and counting the others)."""
    found = violations(config, facts)
    if found:
        more = f" (and {len(found) - 1} more: {'; '.join(v.message for v in found[1:])})" if len(found) > 1 else ""
        raise ConfigRuleError(f"{where} would be rejected by Triton: {found[0].message}{more}.")


def facts_for(artifact: Artifact, directory_name: str) -> ArtifactFacts:
    """What the artifact says: ONNX graph names, the TensorRT engine's profile max batch."""
    onnx_in = onnx_out = None
    if artifact.files and artifact.files[0].endswith(".onnx"):
        ins, outs = onnx_io_names(artifact.path)
        onnx_in, onnx_out = tuple(ins), tuple(outs)
    engine_max = artifact.metadata.get("engine_max_batch")
    return ArtifactFacts(directory_name=directory_name, onnx_inputs=onnx_in, onnx_outputs=onnx_out, engine_max_batch=engine_max)
