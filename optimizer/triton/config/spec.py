"""The config a tuning result gets, as plain data (ConfigSpec): tensors, batching, instances, optimization,
parameters and warmup, each derived from the selected candidate's record; model_config.py renders it.

What the spec takes from a backend's `Artifact.triton_settings` (all keys optional):
    parameters            {key: str | int | float | bool}  -> typed `parameters` (bools as "true"/"false")
    graph_level           ONNX Runtime graph level as Triton spells it (None = all, -1 basic, 1 extended, 2 none)
    tensorrt_accelerator  {"precision": "fp32"|"fp16"|"int8", "max_workspace_size_bytes": int, ...}
                          -> ORT's TensorRT execution accelerator, with profiles covering 1..max batch
    gpu_execution_accelerator / cpu_execution_accelerator   {"name": ..., "parameters": {...}} passed through
    cuda_graphs           TensorRT: optimization { cuda { graphs: true } }
    profiles              TensorRT: the engine profiles the instance group uses (["0", ...])
and from `Artifact.metadata`: `engine_max_batch` (TensorRT: the largest batch every profile accepts).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from optimizer.errors import PublishError
from optimizer.model.signature import Signature, TensorSpec
from optimizer.records.artifact import Artifact
from optimizer.records.triton_platforms import TritonPlatform
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.records.measurements import BatchProfile, MaxBatchDecision
    from optimizer.records.served_search import OperatingPoint
    from optimizer.records.tune_result import TuneResult

log = logging.getLogger(__name__)

QUEUE_DELAY_SHARE = 0.1
MIN_QUEUE_DELAY_US = 0
MAX_QUEUE_DELAY_US = 1_000
QUEUE_DELAY_FORMULA = (
    "max_queue_delay_microseconds = clamp(10% of p50(batch 1), 0, 1 ms); "
    "with a latency budget: min(that, budget - p<percentile>(max batch)), at least 0. "
    "preferred_batch_size = [the throughput peak] (the smallest batch within the measured noise of the best), above 1 only"
)
"""The rule README.md documents; `BatchingPlan.explanation` shows it with the run's numbers."""


@dataclass
class TensorEntry:
    """One config input/output: dims without the batch axis; `reshape` [] turns dims [1] into a per-sample scalar."""

    name: str
    data_type: str
    dims: list[int]
    reshape: list[int] | None = None


@dataclass
class BatchingPlan:
    """The dynamic_batching block and every number it was derived from (report.json shows this record)."""

    enabled: bool
    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int
    max_batch_size: int
    peak: int  # the throughput peak the preferred size comes from
    peak_p50_ms: float | None
    percentile: int
    latency_budget_ms: float | None
    max_batch_latency_ms: float | None  # latency at `percentile` of the largest measured batch <= max_batch_size
    max_batch_latency_at: int | None  # that batch size
    single_p50_ms: float | None  # p50 of batch 1 (the smallest measured batch)
    share_us: int | None  # QUEUE_DELAY_SHARE of it, in microseconds
    clamped_us: int | None
    budget_room_us: int | None  # budget - max_batch_latency, when a budget is set
    formula: str = QUEUE_DELAY_FORMULA
    explanation: str = ""


@dataclass
class ConfigSpec:
    """Everything a template needs, as plain data, so a user template can use any of it.

    `optimization` has keys graph_level (int | None), gpu_execution_accelerator and
    cpu_execution_accelerator (lists of {"name", "parameters"}) and cuda_graphs (bool).
    `settings` is the artifact's raw triton_settings, for user templates that want more.
    """

    name: str
    platform: str | None
    backend: str | None
    max_batch_size: int
    inputs: list[TensorEntry]
    outputs: list[TensorEntry]
    instance_group: dict[str, Any]
    batching: BatchingPlan
    optimization: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    warmup: list[dict[str, Any]] = field(default_factory=list)
    version_policy: dict[str, Any] | None = None
    default_model_filename: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    template: str = ""  # template stem (the platform key)

    @property
    def dynamic_batching(self) -> dict[str, Any] | None:
        """The dynamic_batching block as the templates read it (None: no block)."""
        if not self.batching.enabled:
            return None
        return {"preferred_batch_size": self.batching.preferred_batch_size,
                "max_queue_delay_microseconds": self.batching.max_queue_delay_microseconds}

    def context(self) -> dict[str, Any]:
        """The template variables: every field as plain dicts and lists, plus `dynamic_batching`."""
        ctx = asdict(self)
        ctx["dynamic_batching"] = self.dynamic_batching
        return ctx

    def to_json(self) -> dict[str, Any]:
        """The spec as report.json records it (the template variables)."""
        return self.context()


# -- what the config says ------------------------------------------------------------------------


def tensor_entry(spec: TensorSpec, batching: bool) -> TensorEntry:
    """dims without the batch axis, -1 only where the axis varies; a per-sample scalar becomes dims [1] + empty reshape."""
    dims = spec.triton_dims
    if not dims:
        if not batching:
            raise PublishError(
                f"tensor {spec.name!r} is a scalar in a non-batching model; Triton rejects it (\"cannot have empty reshape for "
                "non-batching model as scalar tensors are not supported\"). Return at least one dimension, or publish with batching."
            )
        return TensorEntry(spec.name, spec.dtype.triton, [1], [])
    return TensorEntry(spec.name, spec.dtype.triton, dims, None)


def _latency_at_max(decision: MaxBatchDecision, max_batch_size: int) -> BatchProfile:
    fitting = [p for p in decision.profiles if p.batch_size <= max_batch_size]
    return max(fitting or decision.profiles, key=lambda p: p.batch_size)


def batching_plan(decision: MaxBatchDecision | None, max_batch_size: int, latency_budget_ms: float | None, percentile: int) -> BatchingPlan:
    """preferred_batch_size and max_queue_delay_microseconds from the measured profile and the latency budget.

    Under load, requests queue while the instance is busy, so batches form without any waiting; the
    queue delay only helps requests that arrive together at an idle instance. A long delay makes every
    batch wait it out at moderate concurrency, so the wait is capped at a tenth of a single request's
    latency (at most 1 ms): it can cost a lone request at most 10%.
    """
    off = BatchingPlan(False, [], 0, max_batch_size, 0, None, percentile, latency_budget_ms, None, None, None, None, None, None)
    if max_batch_size == 0:
        off.explanation = "no dynamic_batching: the model does not batch"
        return off
    if max_batch_size == 1:
        off.explanation = "no dynamic_batching: max_batch_size is 1, nothing to batch"
        return off
    if decision is None or not decision.profiles:
        off.explanation = "no dynamic_batching: the record has no measured batch sizes to derive it from"
        return off
    peak = min(decision.peak or decision.best_batch, max_batch_size)
    peak_profile = decision.profile_at(peak) or decision.best
    single = min(decision.profiles, key=lambda p: p.batch_size)
    share = int(round(single.p50_ms * 1000 * QUEUE_DELAY_SHARE))
    clamped = max(MIN_QUEUE_DELAY_US, min(MAX_QUEUE_DELAY_US, share))
    worst = _latency_at_max(decision, max_batch_size)
    worst_ms = worst.percentile_ms(percentile)
    delay, room = clamped, None
    text = (f"p50 at batch {single.batch_size} = {single.p50_ms:.3f} ms -> {int(QUEUE_DELAY_SHARE * 100)}% = {share} us "
            f"-> clamped to [{MIN_QUEUE_DELAY_US}, {MAX_QUEUE_DELAY_US}] = {clamped} us")
    if latency_budget_ms is not None:
        room = int(round((latency_budget_ms - worst_ms) * 1000))
        delay = max(0, min(clamped, room))
        text += f"; budget {latency_budget_ms:g} ms - p{percentile} at batch {worst.batch_size} ({worst_ms:.3f} ms) = {room} us -> {delay} us"
    preferred = [peak] if 1 < peak <= max_batch_size else []
    text += f"; preferred_batch_size {preferred} (throughput peak {peak}, max {max_batch_size})"
    return BatchingPlan(True, preferred, delay, max_batch_size, peak, peak_profile.p50_ms, percentile, latency_budget_ms,
                        worst_ms, worst.batch_size, single.p50_ms, share, clamped, room, explanation=text)


def instance_group_for(artifact: Artifact, platform: TritonPlatform, count: int = 1) -> dict[str, Any]:
    """Explicit placement: KIND_CPU for CPU artifacts, KIND_GPU on the tuned GPU (and its engine profiles) for CUDA ones."""
    profiles = [str(p) for p in artifact.triton_settings.get("profiles", [])]
    if Device.of(artifact.device).kind == "cuda" or platform.gpu_only:
        index = int(artifact.device.split(":")[1]) if ":" in artifact.device else 0
        return {"kind": "KIND_GPU", "count": count, "gpus": [index], "profile": profiles}
    return {"kind": "KIND_CPU", "count": count, "gpus": [], "profile": profiles}


def parameter_text(value: Any) -> str:
    """Triton parameters are strings: bools become "true"/"false" (what the backends parse), numbers their decimal form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise PublishError(f"parameter value {value!r} is a {type(value).__name__}; Triton parameters are strings, numbers or booleans.")


def trt_profile_shapes(sig: Signature, max_batch_size: int) -> dict[str, str]:
    """ONNX Runtime TensorRT EP profile shapes covering batch 1..max and every dynamic axis' range ("x:1x3,y:1x5")."""
    def shapes(point: str, batch: int | None) -> str:
        return ",".join(f"{t.name}:{'x'.join(str(d) for d in t.shape(batch, point))}" for t in sig.inputs)

    if sig.batching:
        opt_batch = max(1, max_batch_size)
        return {"trt_profile_min_shapes": shapes("min", 1), "trt_profile_opt_shapes": shapes("max", opt_batch),
                "trt_profile_max_shapes": shapes("max", max(1, max_batch_size))}
    return {"trt_profile_min_shapes": shapes("min", None), "trt_profile_opt_shapes": shapes("max", None),
            "trt_profile_max_shapes": shapes("max", None)}


def optimization_for(settings: dict[str, Any], sig: Signature, max_batch_size: int) -> dict[str, Any]:
    """The optimization block: ORT graph level, execution accelerators (TensorRT with precision, workspace and profiles), CUDA graphs."""
    gpu = [dict(a) for a in _as_list(settings.get("gpu_execution_accelerator"))]
    cpu = [dict(a) for a in _as_list(settings.get("cpu_execution_accelerator"))]
    trt = settings.get("tensorrt_accelerator")
    if trt:
        params = {k: parameter_text(v) for k, v in trt.items() if k not in ("precision", "max_workspace_size_bytes")}
        params["precision_mode"] = str(trt.get("precision", "fp32")).upper()
        if trt.get("max_workspace_size_bytes") is not None:
            params["max_workspace_size_bytes"] = str(int(trt["max_workspace_size_bytes"]))
        params.update(trt_profile_shapes(sig, max_batch_size))
        gpu.insert(0, {"name": "tensorrt", "parameters": params})
    for acc in gpu + cpu:
        acc["parameters"] = {k: parameter_text(v) for k, v in (acc.get("parameters") or {}).items()}
    return {"graph_level": settings.get("graph_level"), "gpu_execution_accelerator": gpu,
            "cpu_execution_accelerator": cpu, "cuda_graphs": bool(settings.get("cuda_graphs", False))}


def _as_list(value: Any) -> list[dict[str, Any]]:
    if not value:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def config_signature(artifact: Artifact) -> tuple[Signature, dict[str, str]]:
    """The signature as the config names it, and config name -> the artifact's tensor name.

    Platforms that address tensors by position (torch_aoti: the PyTorch backend reads INPUT__<i> /
    OUTPUT__<i>) get positional names; every other platform keeps the artifact's names.
    """
    sig = Signature.from_json(artifact.signature)
    if artifact.platform is None or not artifact.platform.positional_io:
        return sig, {n: n for n in sig.input_names + sig.output_names}
    inputs = tuple(replace(t, name=f"INPUT__{i}") for i, t in enumerate(sig.inputs))
    outputs = tuple(replace(t, name=f"OUTPUT__{i}") for i, t in enumerate(sig.outputs))
    mapping = {new.name: old.name for new, old in zip(inputs + outputs, sig.inputs + sig.outputs)}
    return replace(sig, inputs=inputs, outputs=outputs), mapping


@functools.lru_cache(maxsize=64)
def _warn_once(message: str) -> None:
    """The served search renders a config per variant; its warnings about the artifact are said once per run."""
    log.warning("%s", message)


def build_spec(result: TuneResult, name: str, warmup: list[dict[str, Any]] | None = None,
               version_policy: dict[str, Any] | None = None, point: OperatingPoint | None = None, served_note: str = "") -> ConfigSpec:
    """The config of the selected candidate of a tuning result (no I/O: the record is all it needs).

    `point` (the served search's choice) replaces the in-process rules' max batch, preferred sizes, queue
    delay, instance count and per-instance threads.
    """
    cand = result.selected_candidate
    artifact = cand.artifact
    if artifact is None or artifact.platform is None:
        raise PublishError(f"candidate {cand.name} has no publishable artifact; re-run the export.")
    platform = artifact.platform
    sig, renamed = config_signature(artifact)
    mbs = (point.max_batch_size if point is not None else result.max_batch_size) if sig.batching else 0
    settings = dict(artifact.triton_settings)
    parameters = {k: parameter_text(v) for k, v in dict(settings.get("parameters", {})).items()}
    batching = batching_plan(cand.decision, mbs, result.latency_budget_ms, result.percentile)
    if platform.pads_batch and point is None and any(b < mbs for b in batching.preferred_batch_size):
        batching = replace(batching, preferred_batch_size=[], explanation=batching.explanation + (
            f"; no preferred_batch_size: the {platform.backend} backend computes max_batch_size rows for every batch, so a batch "
            "sent at a smaller preferred size costs a full one"))
    if point is not None:
        if batching.enabled:
            rules = batching_plan(cand.decision, result.max_batch_size if sig.batching else 0, result.latency_budget_ms, result.percentile)
            batching = replace(batching, preferred_batch_size=[b for b in point.preferred if 1 < b <= mbs],
                               max_queue_delay_microseconds=point.queue_delay_us,
                               explanation=f"measured in the served search: {point.label}{served_note}; the in-process rules said: {rules.explanation}")
        if point.threads and platform.thread_parameter:
            parameters[platform.thread_parameter] = str(point.threads)
    if platform.key == "torch_aoti":
        _warn_once(f"{cand.name} | platform torch_aoti needs Triton 26.03 or later; the PyTorch backend's README says batch sizes "
                   f"above 1 are not supported for AOTInductor packages yet (max_batch_size {mbs})")
    return ConfigSpec(
        name=name,
        platform=platform.platform,
        backend=None if platform.platform else platform.backend,
        max_batch_size=mbs,
        inputs=[tensor_entry(t, sig.batching) for t in sig.inputs],
        outputs=[tensor_entry(t, sig.batching) for t in sig.outputs],
        instance_group=instance_group_for(artifact, platform, point.instances if point is not None else 1),
        batching=batching,
        optimization=optimization_for(settings, sig, mbs),
        parameters=parameters,
        warmup=warmup or [],
        version_policy=version_policy,
        settings=settings,
        template=platform.key,
    )


def operating_point_of(spec: ConfigSpec, thread_parameter: str | None) -> OperatingPoint:
    """The operating point a spec serves at (the served search's starting point is the rules' spec)."""
    from optimizer.records.served_search import OperatingPoint

    threads = spec.parameters.get(thread_parameter) if thread_parameter else None
    return OperatingPoint(spec.max_batch_size, tuple(spec.batching.preferred_batch_size), spec.batching.max_queue_delay_microseconds,
                          int(spec.instance_group.get("count", 1)), int(threads) if threads and str(threads).isdigit() and int(threads) > 0 else None)


def warmup_entries(sig: Signature, feed: dict[str, np.ndarray], max_batch_size: int) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """model_warmup at batch 1 and at the max batch from one real sample, and the warmup/<input>.data files.

    Triton sends `batch_size` requests of one sample each, all reading the same file, so each file
    holds one sample (row-major, the input's dtype). Returns (entries, {path inside the model: bytes}).
    """
    inputs: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    for spec in sig.inputs:
        if spec.dtype.name == "bfloat16":
            raise PublishError(f"input {spec.name!r} is bfloat16, which has no numpy layout for a warmup file; publish without --warmup.")
        sample = np.ascontiguousarray((feed[spec.name][0] if sig.batching else feed[spec.name]).astype(spec.dtype.numpy, copy=False))
        files[f"warmup/{spec.name}.data"] = sample.tobytes()
        inputs[spec.name] = {"data_type": spec.dtype.triton, "dims": list(sample.shape) or [1], "input_data_file": f"{spec.name}.data"}
    batches = sorted({1, max(1, max_batch_size)}) if sig.batching else [1]
    return [{"name": f"sample_batch_{b}", "batch_size": b, "count": 1, "inputs": inputs} for b in batches], files
