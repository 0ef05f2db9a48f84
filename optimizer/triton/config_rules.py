"""Triton's load-time rules, checked on the parsed config before anything is written (reference/triton.md §2.10).

Each rule quotes the wording of the component that enforces it, so a user who has seen the
server's error recognizes it, and says (a short comment) which source release it was read from:
- "Triton core": triton-inference-server/core src/model_config_utils.cc (ValidateModelConfig,
  ValidateInstanceGroup, ValidateModelIOConfig/ValidateBatchIO, the sequence-control getters,
  ValidateEnsembleSchedulingConfig) and the repository manager; `gpus` ids are checked against this
  machine's GPU count. tests/test_triton_core_agreement.py loads every broken config into the real
  tritonserver 2.51 and checks that its log says the same words.
- a backend ("ONNX Runtime backend", "PyTorch backend", "TensorRT backend", "OpenVINO backend"):
  its source, checked against facts read from the artifact (ONNX graph, engine profiles).
- "aitune-export": checks of our own where the server's failure would come later (at warmup or at the
  first request); the message says what would happen.

Two outcomes: a refusal (`violations`; `check` raises) is only for configs the enforcer refuses to
load. What Triton loads but fails later (OpenVINO requests below max_batch_size), loads with a
warning (libtorch outputs not named <name>__<index> bind in config order), or what cannot be decided
here (a `gpus` id with no GPU information on this machine; `model_metrics`, which Triton 2.51 cannot
read) is a warning (`warnings`; `check` logs it and returns it): a rule must never refuse a config
Triton loads.

Fields a --template-dir template can set are covered as far as the config alone decides: I/O,
batching, sequence-batching controls, batch_input/batch_output, ensemble_scheduling, response cache,
instance groups, warmup, model_metrics (two scheduling choices at once never get here: the parser
refuses them, as Triton's does). Not covered: ensemble steps against the composing models'
configs (core's ensemble_utils needs the other models), sequence `state` initial data, and backend
checks needing facts we do not read (ONNX dtypes, TorchScript signatures, OpenVINO IR).

Over 400 lines because it is a catalogue: one short function per rule, each quoting its enforcer,
and a rule is easiest to check against Triton's source when all of them sit side by side.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from optimizer.errors import ConfigRuleError
from optimizer.model.dtypes import triton_itemsize
from optimizer.records.artifact import Artifact
from optimizer.records.triton_platforms import PLATFORMS

log = logging.getLogger(__name__)

WILDCARD = -1
CORE = "Triton core"
ORT = "ONNX Runtime backend"
LIBTORCH = "PyTorch backend"
TRT = "TensorRT backend"
OPENVINO = "OpenVINO backend"
OURS = "aitune-export"
BACKEND_NAMES = MappingProxyType({"onnxruntime": ORT, "pytorch": LIBTORCH, "tensorrt": TRT, "openvino": OPENVINO})

# platform -> the backend Triton resolves it to (core AutoCompleteBackendFields; torch_aoti since Triton 26.03):
# ours from the one platform table, plus the TensorFlow platforms Triton also knows
PLATFORM_BACKEND = MappingProxyType({
    **{p.platform: p.backend for p in PLATFORMS.values() if p.platform},
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
})
LIBTORCH_NAMED = frozenset(p.platform for p in PLATFORMS.values() if p.libtorch_io_names)  # outputs <name>__<index>
GPU_ONLY = frozenset(p.platform for p in PLATFORMS.values() if p.gpu_only)
# backends core knows by type: a platform must resolve to the same one (others accept any platform)
TYPED_BACKENDS = frozenset({"tensorrt", "onnxruntime", "pytorch", "tensorflow"})

# Known backend parameters and their types: bool (true/false/1/0), int, or a tuple of allowed words.
PARAMETER_TYPES: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "onnxruntime": MappingProxyType({
        "intra_op_thread_count": int, "inter_op_thread_count": int, "execution_mode": ("0", "1"),
        "enable_mem_arena": bool, "enable_mem_pattern": bool, "memory.enable_memory_arena_shrinkage": str,
        "session.use_device_allocator_for_initializers": ("0", "1"),
    }),
    "pytorch": MappingProxyType({
        "DISABLE_OPTIMIZED_EXECUTION": bool, "INFERENCE_MODE": bool, "DISABLE_CUDNN": bool,
        "ENABLE_WEIGHT_SHARING": bool, "ENABLE_CACHE_CLEANING": bool, "ENABLE_JIT_EXECUTOR": bool,
        "ENABLE_JIT_PROFILING": bool, "ENABLE_TENSOR_FUSER": bool, "INTRA_OP_THREAD_COUNT": int,
        "INTER_OP_THREAD_COUNT": int,
    }),
    "tensorrt": MappingProxyType({"execution_context_allocation_strategy": ("STATIC", "ON_PROFILE_CHANGE", "USER_MANAGED")}),
    "openvino": MappingProxyType({
        "PERFORMANCE_HINT": ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"), "INFERENCE_NUM_THREADS": int,
        "CPU_THREADS_NUM": int, "SKIP_OV_DYNAMIC_BATCHSIZE": ("YES", "NO"), "ENABLE_BATCH_PADDING": ("YES", "NO"),
        "RESHAPE_IO_LAYERS": ("YES", "NO"),
    }),
})
ORT_GPU_ACCELERATORS = frozenset({"tensorrt", "cuda"})
ORT_CPU_ACCELERATORS = frozenset({"openvino"})
TRT_PRECISION_MODES = ("FP32", "FP16", "INT8")
DELAY = 1  # ModelQueuePolicy.TimeoutAction.DELAY
_LIBTORCH_OUTPUT = re.compile(r"^.+__\d+$")
_AOTI_INPUT = re.compile(r"^(INPUT__\d+|ARGS\[[^\[\]]+\](\[[^\[\]]+\])*|KWARGS\[[^\[\]]+\](\[[^\[\]]+\])*)$")
_AOTI_OUTPUT = re.compile(r"^(OUTPUT__\d+|RESULT(\[[^\[\]]+\])*)$")


@dataclass(frozen=True)
class ArtifactFacts:
    """What the artifact and the repository say, for the rules that need more than the config (None: unknown)."""

    directory_name: str | None = None
    onnx_inputs: Mapping[str, list[int] | None] | None = None  # graph input -> shape (-1 symbolic), in graph order
    onnx_outputs: Mapping[str, list[int] | None] | None = None
    engine_max_batch: int | None = None  # TensorRT: the largest batch every selected profile accepts
    engine_profile_count: int | None = None
    versions: tuple[int, ...] | None = None  # version directories the model has once published
    warmup_files: Mapping[str, int] | None = None  # file under <model>/warmup/ -> size in bytes
    gpu_count: int | Callable[[], int | None] | None = None  # GPUs of the machine the config is for; a callable asks when needed


def _gpu_count(facts: ArtifactFacts) -> int | None:
    return facts.gpu_count() if callable(facts.gpu_count) else facts.gpu_count


@functools.lru_cache(maxsize=1)
def local_gpu_count() -> int | None:
    """This machine's GPUs: torch's count when torch was built with CUDA, else nvidia-smi's, else None (unknown)."""
    try:
        import torch

        if torch.version.cuda:
            return torch.cuda.device_count()  # honours CUDA_VISIBLE_DEVICES, as Triton does
    except Exception as err:  # noqa: BLE001 - no torch or a broken CUDA runtime: try nvidia-smi
        log.debug("torch cannot count GPUs: %s", err)
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            r = subprocess.run([exe, "-L"], check=False, capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.debug("nvidia-smi failed: %s", err)
            return None
        if r.returncode == 0:
            return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    return None


@dataclass(frozen=True)
class RuleViolation:
    """One broken rule: whose wording it quotes, the words, and what to change.

    `warn`: Triton loads the config (or whether it does cannot be decided here); `when` completes "<source> ...:"
    with what happens instead of a refusal, e.g. "loads it, but at request time a batch ... may fail with"."""

    rule: str
    source: str
    message: str
    fix: str = ""
    warn: bool = False
    when: str = ""


Rule = Callable[[Any, ArtifactFacts], list[RuleViolation]]
RULES: dict[str, Rule] = {}
"""Rule name -> check; every rule runs on every config."""


def rule(name: str) -> Callable[[Rule], Rule]:
    """Register a check under `name` (tests break each registered rule once)."""

    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


def _shape(dims: Any) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _is_trt(config: Any) -> bool:
    return config.platform == "tensorrt_plan" or config.backend == "tensorrt"


def _gpu_only(config: Any) -> bool:
    return config.platform in GPU_ONLY or _is_trt(config)


def _backend_of(config: Any) -> str:
    return config.backend or PLATFORM_BACKEND.get(config.platform, "")


# -- Triton core -----------------------------------------------------------------------------------


@rule("name")
def _name(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    if not config.name:
        return [RuleViolation("name", CORE, "model configuration must specify 'name'", "set name to the model's directory name")]
    if facts.directory_name is not None and config.name != facts.directory_name:
        return [RuleViolation("name", CORE, f"unexpected directory name '{facts.directory_name}' for model '{config.name}', "
                              "directory name must equal model name", f'write name: "{facts.directory_name}"')]
    return []


@rule("platform_backend")
def _platform(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    n = config.name
    if not config.platform and not config.backend:
        return [RuleViolation("platform_backend", CORE, f"must specify 'platform' or 'backend' for '{n}'", "keep the template's header partial")]
    if config.platform and config.platform not in PLATFORM_BACKEND and config.platform != "ensemble" and not config.backend:
        hint = " (openvino is a backend: write backend: \"openvino\")" if config.platform == "openvino" else ""
        return [RuleViolation("platform_backend", CORE, f"unexpected platform type '{config.platform}' for {n}",
                              f"use one of {', '.join(PLATFORM_BACKEND)}{hint}")]
    if config.backend in TYPED_BACKENDS and config.platform not in ("", "ensemble") and PLATFORM_BACKEND.get(config.platform) != config.backend:
        return [RuleViolation("platform_backend", CORE, f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}",
                              "drop `backend` or make it the platform's backend")]
    return []


@rule("max_batch_size")
def _mbs(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    if config.max_batch_size < 0:
        return [RuleViolation("max_batch_size", CORE, f"'max_batch_size' must be non-negative value for {config.name}",
                              "use 0 (no batching) or the largest batch the model accepts")]
    return []


@rule("version_policy")
def _versions(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
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


@rule("dynamic_batching")
def _dynamic(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
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


def _sequence_controls(config: Any) -> dict[str, str]:
    """Control kind -> tensor name, for the controls the sequence batcher feeds (each is one more model input)."""
    if not config.HasField("sequence_batching"):
        return {}
    found = {kind: _control_error(config.sequence_batching, config.name, kind)[1] for kind in (*_BOOL_CONTROLS, "CONTROL_SEQUENCE_CORRID")}
    return {k: v for k, v in found.items() if v}


@rule("sequence_batching")
def _sequence(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
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


@rule("ensemble")
def _ensemble(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    # Triton core ValidateModelConfig + ValidateEnsembleSchedulingConfig/BuildEnsembleGraph (core main, 2026; checked against 2.51): first error
    n, es = config.name, config.ensemble_scheduling

    def bad(message: str, fix: str) -> list[RuleViolation]:
        return [RuleViolation("ensemble", CORE, message, fix)]

    if config.platform == "ensemble" and config.backend:
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


@rule("response_cache")
def _response_cache(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    # Triton core ValidateModelConfig (core main, 2026; the 2.51 server prints the same words); with sequence batching: rule sequence_batching
    if config.response_cache.enable and config.model_transaction_policy.decoupled:
        return [RuleViolation("response_cache", CORE, f"Response Cache does not currently support model {config.name} with 'decoupled' "
                              "transaction policy. Please disable the response cache.", "drop response_cache or decoupled")]
    return []


@rule("model_metrics")
def _model_metrics(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
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


def _io_shape(kind: str, t: Any, config: Any) -> str | None:
    """ValidateIOShape (model_config_utils.cc), message without Triton's trailing ' for <model>'."""
    if not t.name:
        return f"model {kind} must specify 'name'"
    p = f"model {kind} '{t.name}' "
    if t.data_type == 0:
        return p + "must specify 'data_type'"
    if len(t.dims) == 0:
        return p + "must specify 'dims'"
    if t.HasField("reshape") and len(t.reshape.shape) == 0 and config.max_batch_size == 0:
        return p + "cannot have empty reshape for non-batching model as scalar tensors are not supported"
    if any(d < 1 and d != WILDCARD for d in t.dims):
        return p + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if t.HasField("reshape"):
        shape = list(t.reshape.shape)
        if any(d < 1 and d != WILDCARD for d in shape):
            return p + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
        dims_size, reshape_size = _element_count(t.dims), _element_count(shape)
        if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
            return p + "has different size for dims and reshape"
        if dims_size == WILDCARD:
            a, b = _trunks(t.dims), _trunks(shape)
            if len(a) != len(b):
                return p + "has different number of variable-size dimensions for dims and reshape"
            if a != b:
                return p + "has different size for dims and reshape"
    return None


def _element_count(dims: Any) -> int:
    """triton::common::GetElementCount: -1 when any dim is variable, 0 for no dims."""
    dims = list(dims)
    if any(d == WILDCARD for d in dims):
        return WILDCARD
    return math.prod(dims) if dims else 0


def _trunks(dims: Any) -> list[int]:
    """Element counts of the runs of fixed dims between variable-size ones."""
    counts, current = [], 1
    for d in dims:
        if d == WILDCARD:
            counts.append(current)
            current = 1
        else:
            current *= d
    return counts + [current]


@rule("io")
def _io(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    out = []
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            msg = _io_shape(kind, t, config)
            if msg is None and kind == "input" and t.format in (1, 2) and len(t.dims) != 3:  # FORMAT_NHWC / FORMAT_NCHW
                msg = "model input NHWC/NCHW require 3 dims"
            if msg is None and t.is_shape_tensor and config.platform != "tensorrt_plan":
                msg = "shape tensors are only supported for TensorRT platform"
            if msg is None and t.is_non_linear_format_io:
                if config.platform != "tensorrt_plan":
                    msg = "Non-linear IO format is only supported for the TensorRT platform"
                elif len(t.dims) != 3:
                    msg = f"Non-linear IO format {kind} requires 3 dims"
            if msg:
                out.append(RuleViolation("io", CORE, f"{msg} for {config.name}", "dims exclude the batch axis; each is >= 1 or -1"))
    return out


@rule("batch_io")
def _batch_io(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    # Triton core ValidateBatchIO via ValidateModelIOConfig, which appends " for <model>" (core main, 2026; checked against 2.51)
    from tritonclient.grpc import model_config_pb2

    msg = _batch_io_error(config, model_config_pb2)
    if msg is None:
        return []
    return [RuleViolation("batch_io", CORE, f"{msg} for {config.name}", "batch_input/batch_output name config inputs/outputs as sources and targets")]


def _batch_io_error(config: Any, pb: Any) -> str | None:
    inputs, outputs = {t.name for t in config.input}, {t.name for t in config.output}
    for b in config.batch_input:
        kind = pb.BatchInput.Kind.Name(b.kind) if b.kind in pb.BatchInput.Kind.values() else str(b.kind)
        if b.kind not in pb.BatchInput.Kind.values():
            return f"unknown batch input kind '{kind}'"
        if len(b.source_input) != 1:
            return f"batch input kind '{kind}' expects 1 source input, got {len(b.source_input)}"
        if pb.DataType.Name(b.data_type) not in ("TYPE_INT32", "TYPE_FP32"):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        for source in b.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
    for b in config.batch_output:
        kind = pb.BatchOutput.Kind.Name(b.kind) if b.kind in pb.BatchOutput.Kind.values() else str(b.kind)
        if b.kind not in pb.BatchOutput.Kind.values():
            return f"unknown batch output kind '{kind}'"
        if len(b.source_input) != 1:
            return f"batch output kind '{kind}' expects 1 source input, got {len(b.source_input)}"
        for source in b.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
        seen = set()
        for target in b.target_name:
            if target not in outputs:
                return f"unknown target output name '{target}'"
            if target in seen:
                return f"target output name '{target}' can only be specified once"
            seen.add(target)
    return None


@rule("instance_group")
def _instances(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    from tritonclient.grpc import model_config_pb2

    out = []
    for i, g in enumerate(config.instance_group):
        name = g.name or f"{config.name}_{i}"
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)
        where = f"instance group {name} of model {config.name}"
        if g.gpus and kind in ("KIND_CPU", "KIND_MODEL"):
            out.append(RuleViolation("instance_group", CORE, f"{where} has kind {kind} but specifies one or more GPUs", "drop gpus or use KIND_GPU"))
        if g.gpus and kind == "KIND_GPU":
            out += _gpu_ids(where, list(g.gpus), facts)
        if g.profile and config.platform != "tensorrt_plan":
            # sic: Triton prints no space between the platform and "specifies"
            out.append(RuleViolation("instance_group", CORE, f"{where} and platform {config.platform}specifies profile field which is only "
                                     "supported for TensorRT models", "drop profile"))
        for p in g.profile:
            if not re.fullmatch(r"[+-]?\d+", p.strip()):
                out.append(RuleViolation("instance_group", CORE, f"unable to parse '{p}': stoi", "profiles are engine profile indexes: \"0\", \"1\", ..."))
            elif int(p) < 0:
                out.append(RuleViolation("instance_group", CORE, f"{where} and platform {config.platform} specifies invalid profile {p}. "
                                         "The field should contain the string representation of a non-negative integer.", "use \"0\", \"1\", ..."))
            elif facts.engine_profile_count is not None and int(p) >= facts.engine_profile_count:
                out.append(RuleViolation("instance_group", TRT, f"{where} selects optimization profile {p} but the engine has "
                                         f"{facts.engine_profile_count} profile(s)", f"use profiles 0..{facts.engine_profile_count - 1}"))
        if kind == "KIND_CPU" and _gpu_only(config):
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


@rule("warmup")
def _warmup(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    from tritonclient.grpc import model_config_pb2

    out = []
    inputs = {t.name: t for t in config.input}
    for w in config.model_warmup:
        if w.batch_size == 0:
            continue  # Triton skips batch-0 samples
        limit = max(config.max_batch_size, 1)
        if w.batch_size > limit:
            out.append(RuleViolation("warmup", OURS, f"warmup '{w.name}' runs batch {w.batch_size} but max_batch_size is {config.max_batch_size}: "
                                     f"the backend fails the load with \"batch size {w.batch_size} for '{config.name}', max allowed is {limit}\"",
                                     f"warm up at batch <= {limit}"))
        missing = [n for n in inputs if n not in w.inputs and not inputs[n].optional]
        if missing:
            out.append(RuleViolation("warmup", CORE, f"expected {len(inputs)} inputs but got {len(w.inputs)} inputs for model '{config.name}'",
                                     f"warmup '{w.name}' lacks {', '.join(missing)}"))
        for key, value in w.inputs.items():
            if any(d == WILDCARD for d in value.dims):
                out.append(RuleViolation("warmup", CORE, f"warmup setting expects all variable-size dimensions are specified for input '{key}'",
                                         "give concrete dims"))
                continue
            case = value.WhichOneof("input_data_type")
            if case is None:
                out.append(RuleViolation("warmup", CORE, f"warmup setting expects input '{key}' to have input_data_type set",
                                         "set zero_data, random_data or input_data_file"))
            if key in inputs:
                t = inputs[key]
                want = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
                got = list(value.dims)
                expected = list(t.dims)
                if len(got) != len(expected) or any(e != WILDCARD and e != g for e, g in zip(expected, got)):
                    batch = [1] if config.max_batch_size else []
                    full = [-1] if config.max_batch_size else []
                    out.append(RuleViolation("warmup", CORE, f"unexpected shape for input '{key}' for model '{config.name}'. "
                                             f"Expected {_shape(full + expected)}, got {_shape(batch + got)}",
                                             f"warmup dims follow the config dims {_shape(expected)} (not the reshape {_shape(want)})"))
                if value.data_type != t.data_type:
                    dt = model_config_pb2.DataType.Name
                    out.append(RuleViolation("warmup", CORE, f"inference input '{key}' data-type is '{dt(value.data_type)[5:]}', but model "
                                             f"'{config.name}' expects '{dt(t.data_type)[5:]}'", "use the input's data_type"))
            else:
                out.append(RuleViolation("warmup", OURS, f"warmup '{w.name}' feeds '{key}', which is not an input of model '{config.name}'",
                                         f"the inputs are {', '.join(inputs)}"))
            if case == "input_data_file" and facts.warmup_files is not None:
                size = facts.warmup_files.get(value.input_data_file)
                need = _element_count(value.dims) * _dtype_size(value.data_type)
                if size is None:
                    out.append(RuleViolation("warmup", OURS, f"warmup data file '{value.input_data_file}' is not in {config.name}/warmup/",
                                             "publish with --warmup to write it"))
                elif value.data_type != model_config_pb2.DataType.Value("TYPE_STRING") and need > size:
                    # sic: Triton prints no space before "only"
                    out.append(RuleViolation("warmup", CORE, f"warmup setting expects {need} bytes, but the data provided from "
                                             f"{value.input_data_file}only has {size} bytes", "write one whole sample per file"))
    return out


def _dtype_size(data_type: int) -> int:
    from tritonclient.grpc import model_config_pb2

    return triton_itemsize(model_config_pb2.DataType.Name(data_type))


# -- backends ------------------------------------------------------------------------------------


@rule("parameters")
def _parameters(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    backend = _backend_of(config)
    known = PARAMETER_TYPES.get(backend, {})
    out = []
    for key, value in config.parameters.items():
        kind, text = known.get(key), value.string_value
        source = BACKEND_NAMES.get(backend, f"{backend} backend")
        if kind is bool and text.lower() not in ("true", "false", "1", "0"):
            out.append(RuleViolation("parameters", source, f"failed to convert {key} '{text}' to boolean value", 'use "true" or "false"'))
        elif kind is int and not re.fullmatch(r"[+-]?\d+", text.strip()):
            out.append(RuleViolation("parameters", source, f"failed to convert {key} '{text}' to integral number", "use a whole number"))
        elif isinstance(kind, tuple) and text not in kind:
            out.append(RuleViolation("parameters", source, f"parameter {key} is '{text}'; the {backend} backend accepts {', '.join(kind)}",
                                     f"use one of {', '.join(kind)}"))
    return out


@rule("optimization")
def _optimization(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    if not config.HasField("optimization") or _backend_of(config) != "onnxruntime":
        return []
    out = []
    ea = config.optimization.execution_accelerators
    for kind, allowed in (("gpu", ORT_GPU_ACCELERATORS), ("cpu", ORT_CPU_ACCELERATORS)):
        for acc in getattr(ea, f"{kind}_execution_accelerator"):
            if acc.name not in allowed:
                out.append(RuleViolation("optimization", ORT, f"unknown Execution Accelerator '{acc.name}' is requested",
                                         f"{kind} accelerators: {', '.join(sorted(allowed))}"))
            if acc.name != "tensorrt":
                continue
            mode = acc.parameters.get("precision_mode")
            if mode is not None and mode not in TRT_PRECISION_MODES:
                out.append(RuleViolation("optimization", ORT, f"unsupported precision mode '{mode}' is requested",
                                         f"use {', '.join(TRT_PRECISION_MODES)}"))
            workspace = acc.parameters.get("max_workspace_size_bytes")
            if workspace is not None and not workspace.isdigit():
                out.append(RuleViolation("optimization", ORT, f"failed to convert '{workspace}' to unsigned long long integral number",
                                         "give the workspace in bytes"))
    return out


@rule("onnx_io")
def _onnx_io(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    # onnxruntime_backend src/onnxruntime.cc ModelInstanceState: sequence controls, then the input count, then each tensor (main, 2026)
    out = _onnx_inputs(config, facts.onnx_inputs) if facts.onnx_inputs is not None else []
    batching = config.max_batch_size > 0
    for kind, tensors, graph in (("input", config.input, facts.onnx_inputs), ("output", config.output, facts.onnx_outputs)):
        if graph is None:
            continue
        for t in tensors:
            if t.name not in graph:
                out.append(RuleViolation("onnx_io", ORT, f"unexpected inference {kind} '{t.name}', allowed {kind}s are: {', '.join(graph)}",
                                         "name config tensors as the ONNX graph does"))
                continue
            model = graph[t.name]
            if model is None:
                continue
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            where = f"model '{config.name}', tensor '{t.name}'"
            if batching:
                if not model or model[0] != WILDCARD:
                    out.append(RuleViolation("onnx_io", ORT, f"{where}: for the model to support batching the shape should have at least 1 "
                                             f"dimension and the first dimension must be -1; but shape expected by the model is {_shape(model)}",
                                             "export the ONNX file with a dynamic batch axis, or publish with --no-batching"))
                    continue
                full = [WILDCARD] + dims
                ok = len(model) == len(full) and all(m == WILDCARD or c == WILDCARD or m == c for m, c in zip(model[1:], full[1:]))
                if not ok:
                    out.append(RuleViolation("onnx_io", ORT, f"{where}: the model expects {len(model)} dimensions (shape {_shape(model)}) but the "
                                             f"model configuration specifies {len(full)} dimensions (an initial batch dimension because "
                                             f"max_batch_size > 0 followed by the explicit tensor shape, making complete shape {_shape(full)})",
                                             "dims exclude the batch axis"))
            elif len(model) != len(dims) or any(m != WILDCARD and c != WILDCARD and m != c for m, c in zip(model, dims)):
                out.append(RuleViolation("onnx_io", ORT, f"{where}: the model expects {len(model)} dimensions (shape {_shape(model)}) but the "
                                         f"model configuration specifies {len(dims)} dimensions (shape {_shape(dims)})",
                                         "with max_batch_size 0, dims are the full shape"))
    return out


def _onnx_inputs(config: Any, graph: Mapping[str, list[int] | None]) -> list[RuleViolation]:
    """Every graph input is fed: config inputs (optional ones excepted), batch inputs, sequence controls and states count."""
    out, n = [], config.name
    controls = _sequence_controls(config)
    for name in controls.values():
        if name not in graph:
            out.append(RuleViolation("onnx_io", ORT, f"configuration specified sequence control '{name}', but model does not provide that input",
                                     "name the control as the graph input that takes it"))
            continue
        model = graph[name]
        debatched = (model[1:] if config.max_batch_size > 0 else model) if model is not None else [1]
        if debatched != [1]:
            out.append(RuleViolation("onnx_io", ORT, f"unable to load model '{n}', sequence control '{name}' in model has dims "
                                     f"{_shape(debatched)} but dims [1] is expected", "the control input takes one value per sequence"))
    expected = sum(not t.optional for t in config.input) + len(config.batch_input) + len(controls)
    expected += len(config.sequence_batching.state) if config.HasField("sequence_batching") else 0
    if expected != len(graph):
        missing = [g for g in graph if g not in {t.name for t in config.input} | set(controls.values())]
        out.append(RuleViolation("onnx_io", ORT, f"unable to load model '{n}', configuration expects {expected} inputs, model provides {len(graph)}",
                                 f"list every graph input ({', '.join(graph)}); not in the config: {', '.join(missing) or '-'}"))
    return out


@rule("libtorch_names")
def _libtorch(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    # PyTorch backend since pytorch_backend ff103c4 (2022-05; every release we target): other names load and bind in config order
    # (NamingConvention STRICT_CONFIG_ORDERING), with a warning when a name has "__" and no index. The refusal "does not follow
    # naming convention i.e. <name>__<index>." is gone, so this only warns; our stand-in backend binds the same way.
    if config.platform not in LIBTORCH_NAMED:
        return []
    odd = [t.name for t in config.output if not _LIBTORCH_OUTPUT.match(t.name)]
    if not odd:
        return []
    return [RuleViolation("libtorch_names", LIBTORCH, f"output '{odd[0]}' does not follow the <name>__<index> naming convention",
                          "list outputs in the order forward() returns them, or name them output__0, output__1, ... (--output-names)",
                          warn=True, when="loads it and binds every output by its position in the config")]


@rule("torch_aoti_names")
def _aoti(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    if config.platform != "torch_aoti":
        return []
    out = [RuleViolation("torch_aoti_names", LIBTORCH, f"input '{t.name}' is not addressable in a torch_aoti model: the PyTorch backend names "
                         "inputs INPUT__<index>, ARGS[<i>] or KWARGS[<name>]", "name inputs INPUT__0, INPUT__1, ...")
           for t in config.input if not _AOTI_INPUT.match(t.name)]
    out += [RuleViolation("torch_aoti_names", LIBTORCH, f"output '{t.name}' is not addressable in a torch_aoti model: the PyTorch backend names "
                          "outputs OUTPUT__<index> or RESULT[...]", "name outputs OUTPUT__0, OUTPUT__1, ... (--output-names)")
            for t in config.output if not _AOTI_OUTPUT.match(t.name)]
    return out


@rule("tensorrt_engine")
def _tensorrt(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    if not _is_trt(config) or facts.engine_max_batch is None:
        return []
    if config.max_batch_size > facts.engine_max_batch:
        return [RuleViolation("tensorrt_engine", TRT, f"configuration specified max-batch {config.max_batch_size} but TensorRT engine only "
                              f"supports max-batch {facts.engine_max_batch}", f"publish max_batch_size <= {facts.engine_max_batch} or rebuild the engine")]
    return []


# -- running the rules ---------------------------------------------------------------------------


_OV_VALUES = MappingProxyType({
    "NUM_STREAMS": ("either AUTO/NUMA/<int_value>", lambda v: v in ("auto", "numa") or v.isdigit()),
    "COMPILATION_NUM_THREADS": ("a non-negative number", str.isdigit),
    "HINT_BF16": ("YES", lambda v: v == "yes"),
})
"""openvino parameters whose values PARAMETER_TYPES cannot describe: the backend's wording and the check (lower-cased)."""


@rule("openvino")
def _openvino(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    from tritonclient.grpc import model_config_pb2

    if _backend_of(config) != "openvino":
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


def facts_for(artifact: Artifact, directory_name: str, versions: tuple[int, ...] | None = None,
              warmup_files: Mapping[str, int] | None = None,
              gpu_count: int | Callable[[], int | None] | None = local_gpu_count) -> ArtifactFacts:
    """What the artifact says: ONNX graph names and shapes, the TensorRT engine's profile max batch and profile count;
    and the GPUs the config is checked against (this machine's, counted only when a config lists `gpus`)."""
    onnx_in = onnx_out = None
    if artifact.files and artifact.files[0].endswith(".onnx") and artifact.path.is_file():
        onnx_in, onnx_out = _onnx_facts(artifact)
    meta = artifact.metadata
    return ArtifactFacts(
        directory_name=directory_name,
        onnx_inputs=onnx_in,
        onnx_outputs=onnx_out,
        engine_max_batch=meta.get("engine_max_batch"),
        engine_profile_count=meta.get("engine_profile_count"),
        versions=versions,
        warmup_files=warmup_files,
        gpu_count=gpu_count,
    )


def _onnx_facts(artifact: Artifact) -> tuple[Any, Any]:
    try:
        from optimizer.model.onnx_graph import onnx_io_shapes

        return onnx_io_shapes(artifact.path)
    except ImportError as err:
        log.warning("onnx is not installed (%s): the ONNX names and shapes in the config are not checked against the graph", err)
        return None, None
    except Exception as err:  # a file onnx cannot read: the ONNX Runtime backend would fail to load it too
        raise ConfigRuleError(f"{artifact.path} is not an ONNX model onnx can read ({type(err).__name__}: {err}); re-run the export.") from err
