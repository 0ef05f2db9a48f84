"""Triton's load-time rules, checked on the parsed config before anything is written (reference/triton.md §2.10).

Each rule quotes the wording of the component that enforces it, so a user who has seen the
server's error recognizes it:
- "Triton core": triton-inference-server/core src/model_config_utils.cc and the repository manager.
  tests/test_triton_core_agreement.py loads every broken config into the real tritonserver 2.51 and
  checks that its log says the same words.
- a backend ("ONNX Runtime backend", "PyTorch backend", "TensorRT backend", "OpenVINO backend"):
  its source, checked against facts read from the artifact (ONNX graph, engine profiles).
- "aitune-export": checks of our own where the server's failure would come later (at warmup or at the
  first request); the message says what would happen.

Over 400 lines because it is a catalogue: one short function per rule, each quoting its enforcer,
and a rule is easiest to check against Triton's source when all of them sit side by side.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

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


@dataclass(frozen=True)
class RuleViolation:
    """One broken rule: whose wording it quotes, the words, and what to change."""

    rule: str
    source: str
    message: str
    fix: str = ""


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
    if config.backend in TYPED_BACKENDS and config.platform and PLATFORM_BACKEND.get(config.platform) != config.backend:
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
    out = []
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


@rule("libtorch_names")
def _libtorch(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    if config.platform not in LIBTORCH_NAMED:
        return []
    return [RuleViolation("libtorch_names", LIBTORCH, f"output '{t.name}' does not follow naming convention i.e. <name>__<index>.",
                          "name outputs output__0, output__1, ... (--output-names)")
            for t in config.output if not _LIBTORCH_OUTPUT.match(t.name)]


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
    out = []
    if not config.input or not config.output:
        out.append(RuleViolation("openvino", OPENVINO, "the openvino backend does not auto-complete the configuration",
                                 "list every input and output"))
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
        out.append(RuleViolation("openvino", OPENVINO, f"expected requests with batch size '{config.max_batch_size}'",
                                 f"the backend fixes the batch at max_batch_size {config.max_batch_size}; set the parameter "
                                 "ENABLE_BATCH_PADDING to YES so smaller batches are padded"))
    return out


def violations(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Every broken rule (empty when the config would load)."""
    return [v for fn in RULES.values() for v in fn(config, facts)]


def check(config: Any, facts: ArtifactFacts, where: str = "config.pbtxt") -> None:
    """Raise ConfigRuleError quoting the first broken rule in its enforcer's words (and counting the others)."""
    found = violations(config, facts)
    if not found:
        return
    first = found[0]
    more = f" ({len(found) - 1} more: {'; '.join(v.message for v in found[1:3])}{'; ...' if len(found) > 3 else ''})" if len(found) > 1 else ""
    fix = f"; fix: {first.fix}" if first.fix else ""
    raise ConfigRuleError(f"{where} would be rejected by {first.source}: \"{first.message}\"{fix}{more}.")


def facts_for(artifact: Artifact, directory_name: str, versions: tuple[int, ...] | None = None,
              warmup_files: Mapping[str, int] | None = None) -> ArtifactFacts:
    """What the artifact says: ONNX graph names and shapes, the TensorRT engine's profile max batch and profile count."""
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
