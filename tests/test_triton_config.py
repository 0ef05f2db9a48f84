"""config.pbtxt from records: golden configs per platform, what the config says, every rule broken once, templates.

Everything here builds TuneResult/Artifact records directly (tests/triton_records.py): no tuning, no model.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from optimizer.errors import ConfigRuleError, PublishError, TemplateError
from optimizer.triton.config import rules
from optimizer.triton.config.rules import RULES, ArtifactFacts, violations
from optimizer.triton.config.model_config import canonical, packaged_template_dir, parse, render
from optimizer.triton.config.spec import MAX_QUEUE_DELAY_US, MIN_QUEUE_DELAY_US, batching_plan, build_spec
from optimizer.triton.repository.publish import PublishOptions, render_config, version_policy_for
from optimizer.triton.repository.atomic import RepositoryState
from tests.conftest import ROOT
from tests.triton_records import decision, make_result, profile, tensor

GOLDEN = Path(__file__).parent / "golden"
PLATFORMS = ("onnxruntime_onnx", "pytorch_libtorch", "torch_aoti", "tensorrt_plan", "openvino")

# What each platform's artifact says about itself (what its backend's triton_settings would return).
SETTINGS: dict[str, dict[str, Any]] = {
    "onnxruntime_onnx": {"parameters": {"intra_op_thread_count": 2, "inter_op_thread_count": 1, "execution_mode": 0}, "graph_level": 1},
    "pytorch_libtorch": {"parameters": {"INFERENCE_MODE": True, "DISABLE_OPTIMIZED_EXECUTION": False, "INTRA_OP_THREAD_COUNT": 2}},
    "torch_aoti": {"parameters": {"INFERENCE_MODE": True}},
    "tensorrt_plan": {"cuda_graphs": True, "profiles": ["0"], "parameters": {"execution_context_allocation_strategy": "ON_PROFILE_CHANGE"}},
    "openvino": {"parameters": {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_NUM_THREADS": 2, "NUM_STREAMS": 1, "ENABLE_BATCH_PADDING": "YES"}},
}
AOTI_IO = {"inputs": (tensor("INPUT__0", "float32", "3x8x8"),), "outputs": (tensor("OUTPUT__0", "float32", "10"),)}


def golden_result(tmp: Path, platform: str, **kw: Any):
    device = "cuda:0" if platform == "tensorrt_plan" else "cpu"
    metadata = {"engine_max_batch": 16, "engine_profile_count": 1} if platform == "tensorrt_plan" else {}
    io = AOTI_IO if platform == "torch_aoti" else {}
    return make_result(tmp, platform, triton_settings=SETTINGS[platform], device=device, metadata=metadata, **{**io, **kw})


def state(name: str = "m", versions: tuple[int, ...] = (), version: int = 1, overwrite: bool = False) -> RepositoryState:
    return RepositoryState(name, bool(versions), versions, version, overwrite, None)


def config_of(tmp: Path, platform: str, warmup: bool = False, **kw: Any):
    result = golden_result(tmp, platform, **kw)
    text, files, spec = render_config(result, PublishOptions(tmp / "repo", "m", warmup=warmup), state())
    return parse(text), text, files, spec, result


# -- golden configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_golden_config_per_platform(tmp_path: Path, platform: str):
    config, text, files, spec, result = config_of(tmp_path, platform, warmup=True)
    golden = GOLDEN / f"{platform}.pbtxt"
    if os.environ.get("AITUNE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendered config differs from {golden} (AITUNE_UPDATE_GOLDEN=1 rewrites it after review)"
    assert canonical(parse(text)) == text  # canonical form is a fixed point
    facts = rules.facts_for(result.selected_candidate.artifact, "m", (1,), {k.split("/", 1)[1]: len(v) for k, v in files.items()})
    assert violations(config, facts) == []
    # what the config says
    assert config.name == "m" and config.max_batch_size == 8
    assert (config.platform or config.backend) == ("openvino" if platform == "openvino" else platform)
    assert [list(t.dims) for t in config.input] == [[3, 8, 8]] and [list(t.dims) for t in config.output] == [[10]]
    # openvino computes max_batch_size rows for every batch: a batch sent at preferred [4] would cost 8
    assert list(config.dynamic_batching.preferred_batch_size) == ([] if platform == "openvino" else [4])
    assert config.dynamic_batching.max_queue_delay_microseconds == 100  # a tenth of the 1.0 ms p50 at batch 1
    group = config.instance_group[0]
    if platform == "tensorrt_plan":
        assert (group.kind, list(group.gpus), list(group.profile)) == (1, [0], ["0"])  # KIND_GPU on the tuned GPU, engine profile 0
        assert config.optimization.cuda.graphs
    else:
        assert (group.kind, list(group.gpus), group.count) == (2, [], 1)  # KIND_CPU, one instance using every core
    assert [(w.batch_size, list(w.inputs["image" if platform != "torch_aoti" else "INPUT__0"].dims)) for w in config.model_warmup] == [
        (1, [3, 8, 8]), (8, [3, 8, 8])]
    assert set(files) == {f"warmup/{config.input[0].name}.data"} and len(next(iter(files.values()))) == 3 * 8 * 8 * 4
    assert spec.batching.explanation.startswith("p50 at batch 1 = 1.000 ms")


def test_onnxruntime_threads_graph_level_and_typed_parameters(tmp_path: Path):
    config, *_ = config_of(tmp_path, "onnxruntime_onnx")
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {"intra_op_thread_count": "2", "inter_op_thread_count": "1", "execution_mode": "0"}
    assert config.optimization.graph.level == 1  # Triton's ORT spelling of "extended"


def test_onnxruntime_tensorrt_accelerator_has_precision_workspace_and_profiles(tmp_path: Path):
    settings = {"graph_level": None, "tensorrt_accelerator": {"precision": "fp16", "max_workspace_size_bytes": 1 << 30}}
    result = make_result(tmp_path, "onnxruntime_onnx", device="cuda:1", triton_settings=settings,
                         inputs=(tensor("input_ids", "int64", "1-128"),), outputs=(tensor("output__0", "float32", "1-128x16"),))
    config = parse(render_config(result, PublishOptions(tmp_path / "r", "m"), state())[0])
    acc = config.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert acc.name == "tensorrt"
    assert dict(acc.parameters) == {
        "precision_mode": "FP16", "max_workspace_size_bytes": str(1 << 30),
        "trt_profile_min_shapes": "input_ids:1x1", "trt_profile_opt_shapes": "input_ids:8x128", "trt_profile_max_shapes": "input_ids:8x128"}
    assert (config.instance_group[0].kind, list(config.instance_group[0].gpus)) == (1, [1])  # KIND_GPU on cuda:1
    assert not config.optimization.HasField("graph")


def test_dims_omit_batch_vary_only_where_the_signature_varies_and_scalars_reshape(tmp_path: Path):
    result = make_result(tmp_path, "onnxruntime_onnx", inputs=(tensor("ids", "int64", "1-128"), tensor("mask", "bool", "128")),
                         outputs=(tensor("logits", "float32", "1-128x5"), tensor("score", "float32", "")))
    config = parse(render_config(result, PublishOptions(tmp_path / "r", "m"), state())[0])
    assert [list(t.dims) for t in config.input] == [[-1], [128]]
    assert [list(t.dims) for t in config.output] == [[-1, 5], [1]]
    assert config.output[1].HasField("reshape") and list(config.output[1].reshape.shape) == []
    assert not config.output[0].HasField("reshape")


def test_non_batching_model_says_max_batch_size_0_and_has_no_batcher(tmp_path: Path):
    result = make_result(tmp_path, "pytorch_libtorch", batching=False)
    text, _, spec = render_config(result, PublishOptions(tmp_path / "r", "m", warmup=True), state())
    config = parse(text)
    assert "max_batch_size: 0\n" in text and text.index("max_batch_size") < text.index("input {")
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [w.batch_size for w in config.model_warmup] == [1]
    assert not spec.batching.enabled and "does not batch" in spec.batching.explanation


def test_scalar_tensor_without_batching_is_refused_with_tritons_words(tmp_path: Path):
    result = make_result(tmp_path, "onnxruntime_onnx", batching=False, outputs=(tensor("y", "float32", ""),))
    with pytest.raises(PublishError, match="scalar tensors are not supported"):
        build_spec(result, "m")


# -- dynamic batching: the formula's inputs and result -----------------------------------------------


def test_queue_delay_is_a_tenth_of_a_single_requests_p50():
    plan = batching_plan(decision(8, 4, [profile(1, 2.0), profile(4, 3.2), profile(8, 6.0)]), 8, None, 95)
    assert (plan.peak, plan.single_p50_ms, plan.share_us, plan.clamped_us, plan.max_queue_delay_microseconds) == (4, 2.0, 200, 200, 200)
    assert plan.preferred_batch_size == [4] and plan.budget_room_us is None
    assert "p50 at batch 1 = 2.000 ms -> 10% = 200 us" in plan.explanation


@pytest.mark.parametrize("p50_ms, expected", [(0.004, MIN_QUEUE_DELAY_US), (400.0, MAX_QUEUE_DELAY_US)])
def test_queue_delay_is_clamped(p50_ms: float, expected: int):
    plan = batching_plan(decision(2, 2, [profile(1, p50_ms), profile(2, p50_ms)]), 2, None, 95)
    assert plan.max_queue_delay_microseconds == expected and plan.clamped_us == expected


def test_latency_budget_caps_the_delay_at_what_the_max_batch_leaves():
    profiles = [profile(1, 5.0), profile(4, 5.5), profile(8, 6.5)]  # p95 = 1.2 x p50 -> 7.8 ms at batch 8; 10% of 5 ms = 500 us
    plan = batching_plan(decision(8, 4, profiles), 8, 8.1, 95)
    assert plan.max_batch_latency_at == 8 and plan.budget_room_us == 300 and plan.max_queue_delay_microseconds == 300
    assert "budget 8.1 ms - p95 at batch 8 (7.800 ms) = 300 us -> 300 us" in plan.explanation
    tight = batching_plan(decision(8, 4, profiles), 8, 7.0, 95)
    assert tight.budget_room_us < 0 and tight.max_queue_delay_microseconds == 0


def test_max_batch_1_has_no_dynamic_batching(tmp_path: Path):
    plan = batching_plan(decision(1, 1, [profile(1, 1.0)]), 1, None, 95)
    assert not plan.enabled and plan.preferred_batch_size == []
    result = make_result(tmp_path, max_batch=1, knee=1)
    config = parse(render_config(result, PublishOptions(tmp_path / "r", "m"), state())[0])
    assert not config.HasField("dynamic_batching") and config.max_batch_size == 1


def test_version_policy_serves_the_version_just_published():
    assert version_policy_for(state()) is None
    assert version_policy_for(state(versions=(1,), version=2)) == {"latest": 1}
    assert version_policy_for(state(versions=(1, 3), version=2)) == {"specific": [2]}
    assert version_policy_for(state(versions=(1, 2), version=3, overwrite=True)) is None


# -- every rule, broken once ---------------------------------------------------------------------------

OK_FACTS = ArtifactFacts(directory_name="m", versions=(1,))


def _io(c, kind="input"):
    return getattr(c, kind)[0]


def _warm(c, **fields):
    w = c.model_warmup.add(name="w", batch_size=fields.pop("batch", 1))
    value = w.inputs["image"]
    value.data_type = fields.pop("data_type", 11)
    value.dims.extend(fields.pop("dims", [3, 8, 8]))
    if fields.pop("data", True):
        value.input_data_file = "image.data"
    return w


def _facts(**kw):
    return ArtifactFacts(**{"directory_name": "m", "versions": (1,), **kw})


def _gpu(c, *ids):
    c.instance_group[0].kind = 1  # KIND_GPU
    c.instance_group[0].gpus.extend(ids)


def _control(c, name, kind, **values):
    """A sequence batcher (replacing dynamic_batching: one scheduling choice) with one control input."""
    ci = c.sequence_batching.control_input.add(name=name)
    ci.control.add(kind=kind, **values)
    return ci


START, READY, END, CORRID = 0, 1, 2, 3  # ModelSequenceBatching.Control.Kind


def _sequence(c):
    """A valid sequence batcher: START (int32 pair) and CORRID (TYPE_INT32)."""
    _control(c, "START", START, int32_false_true=[0, 1])
    _control(c, "CORRID", CORRID, data_type=8)
    return c.sequence_batching


def _ensemble(c, steps=(("classifier", {"image": "image"}, {"output__0": "output__0"}),)):
    """The onnxruntime config turned into a valid ensemble: platform ensemble, one step classifier(image) -> output__0."""
    c.platform = "ensemble"
    for f in ("backend", "instance_group", "optimization", "dynamic_batching", "parameters", "model_warmup"):
        c.ClearField(f)
    for model, inputs, outputs in steps:
        step = c.ensemble_scheduling.step.add(model_name=model, model_version=-1)
        step.input_map.update(inputs)
        step.output_map.update(outputs)
    return c.ensemble_scheduling


def _batch_input(c, kind=0, sources=("image",), data_type=8, target="count"):
    return c.batch_input.add(kind=kind, target_name=[target], data_type=data_type, source_input=list(sources))


def _metrics(c, family="nv_inference_first_response_histogram_ms", buckets=(1.0, 10.0)):
    mc = c.model_metrics.metric_control.add()
    if family is not None:
        mc.metric_identifier.family = family
    if buckets is not None:
        mc.histogram_options.buckets.extend(buckets)
    return mc


# (rule, id, platform, mutate config, facts, expected words)
CASES: list[tuple[str, str, str, Callable[[Any], Any] | None, ArtifactFacts, str]] = [
    ("name", "empty", "onnxruntime_onnx", lambda c: c.ClearField("name"), OK_FACTS, "model configuration must specify 'name'"),
    ("name", "directory", "onnxruntime_onnx", lambda c: setattr(c, "name", "other"), OK_FACTS,
     "unexpected directory name 'm' for model 'other', directory name must equal model name"),
    ("platform_backend", "none", "onnxruntime_onnx", lambda c: c.ClearField("platform"), OK_FACTS, "must specify 'platform' or 'backend' for 'm'"),
    ("platform_backend", "unknown", "onnxruntime_onnx", lambda c: setattr(c, "platform", "onnx"), OK_FACTS, "unexpected platform type 'onnx' for m"),
    ("platform_backend", "openvino", "openvino", lambda c: (c.ClearField("backend"), setattr(c, "platform", "openvino")), OK_FACTS,
     "unexpected platform type 'openvino' for m"),
    ("platform_backend", "pair", "onnxruntime_onnx", lambda c: setattr(c, "backend", "pytorch"), OK_FACTS,
     "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch"),
    # core takes the backend from default_model_filename too (AutoCompleteBackendFields): model.onnx names onnxruntime, before pytorch_libtorch
    ("platform_backend", "default_file", "pytorch_libtorch", lambda c: setattr(c, "default_model_filename", "model.onnx"), OK_FACTS,
     "unexpected 'platform' and 'backend' pair, got:pytorch_libtorch, onnxruntime"),
    ("max_batch_size", "negative", "onnxruntime_onnx", lambda c: (setattr(c, "max_batch_size", -1), c.ClearField("dynamic_batching")), OK_FACTS,
     "'max_batch_size' must be non-negative value for m"),
    ("version_policy", "specific", "onnxruntime_onnx", lambda c: c.version_policy.specific.versions.append(7), OK_FACTS,
     "at least one version must be available under the version policy of model 'm'"),
    ("dynamic_batching", "preferred_zero", "onnxruntime_onnx", lambda c: c.dynamic_batching.preferred_batch_size.append(0), OK_FACTS,
     "dynamic batching preferred size must be positive for m"),
    ("dynamic_batching", "preferred_above_max", "onnxruntime_onnx", lambda c: c.dynamic_batching.preferred_batch_size.append(16), OK_FACTS,
     "dynamic batching preferred size must be <= max batch size for m"),
    ("dynamic_batching", "default_priority", "onnxruntime_onnx",
     lambda c: (setattr(c.dynamic_batching, "priority_levels", 2), setattr(c.dynamic_batching, "default_priority_level", 3)), OK_FACTS,
     "default priority level must be in range [1, 2] for m"),
    ("dynamic_batching", "queue_policy_level", "onnxruntime_onnx",
     lambda c: (setattr(c.dynamic_batching, "priority_levels", 2), setattr(c.dynamic_batching, "default_priority_level", 1),
                c.dynamic_batching.priority_queue_policy[5].CopyFrom(c.dynamic_batching.default_queue_policy)), OK_FACTS,
     "priority queue policy must have priority level in range [1, 2] for m"),
    ("dynamic_batching", "ordering_levels", "onnxruntime_onnx",
     lambda c: (setattr(c.dynamic_batching, "preserve_ordering", True), setattr(c.dynamic_batching, "priority_levels", 2),
                setattr(c.dynamic_batching, "default_priority_level", 1)), OK_FACTS,
     "Only one priority level is allowed when 'preserve_ordering' is true for m"),
    ("dynamic_batching", "ordering_delay", "onnxruntime_onnx",
     lambda c: (setattr(c.dynamic_batching, "preserve_ordering", True), setattr(c.dynamic_batching.default_queue_policy, "timeout_action", 1),
                setattr(c.dynamic_batching.default_queue_policy, "default_timeout_microseconds", 100)), OK_FACTS,
     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m"),
    ("io", "no_name", "onnxruntime_onnx", lambda c: _io(c).ClearField("name"), _facts(onnx_inputs=None), "model input must specify 'name' for m"),
    ("io", "no_data_type", "onnxruntime_onnx", lambda c: _io(c).ClearField("data_type"), OK_FACTS, "model input 'image' must specify 'data_type' for m"),
    ("io", "no_dims", "onnxruntime_onnx", lambda c: _io(c).ClearField("dims"), OK_FACTS, "model input 'image' must specify 'dims' for m"),
    ("io", "empty_reshape_no_batching", "onnxruntime_onnx",
     lambda c: (setattr(c, "max_batch_size", 0), c.ClearField("dynamic_batching"), c.output[0].reshape.SetInParent()), OK_FACTS,
     "model output 'output__0' cannot have empty reshape for non-batching model as scalar tensors are not supported for m"),
    ("io", "zero_dim", "onnxruntime_onnx", lambda c: _io(c).dims.__setitem__(0, 0), OK_FACTS,
     "model input 'image' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m"),
    ("io", "zero_reshape", "onnxruntime_onnx", lambda c: _io(c).reshape.shape.extend([0, 8, 8]), OK_FACTS,
     "model input 'image' reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension for m"),
    ("io", "reshape_size", "onnxruntime_onnx", lambda c: _io(c).reshape.shape.extend([3, 8]), OK_FACTS,
     "model input 'image' has different size for dims and reshape for m"),
    ("io", "reshape_wildcards", "onnxruntime_onnx", lambda c: (_io(c).dims.__setitem__(0, -1), _io(c).reshape.shape.extend([-1, 8, -1])),
     OK_FACTS, "model input 'image' has different number of variable-size dimensions for dims and reshape for m"),
    ("io", "reshape_trunks", "onnxruntime_onnx", lambda c: (_io(c).dims.__setitem__(0, -1), _io(c).reshape.shape.extend([-1, 4, 8])),
     OK_FACTS, "model input 'image' has different size for dims and reshape for m"),
    ("io", "format_dims", "onnxruntime_onnx", lambda c: (setattr(_io(c), "format", 1), _io(c).dims.pop()), OK_FACTS,
     "model input NHWC/NCHW require 3 dims for m"),
    ("io", "shape_tensor", "onnxruntime_onnx", lambda c: setattr(_io(c), "is_shape_tensor", True), OK_FACTS,
     "shape tensors are only supported for TensorRT platform for m"),
    ("io", "non_linear", "onnxruntime_onnx", lambda c: setattr(_io(c), "is_non_linear_format_io", True), OK_FACTS,
     "Non-linear IO format is only supported for the TensorRT platform for m"),
    ("instance_group", "cpu_gpus", "onnxruntime_onnx", lambda c: c.instance_group[0].gpus.append(0), OK_FACTS,
     "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
    ("instance_group", "model_gpus", "onnxruntime_onnx", lambda c: (setattr(c.instance_group[0], "kind", 3), c.instance_group[0].gpus.append(0)),
     OK_FACTS, "instance group m_0 of model m has kind KIND_MODEL but specifies one or more GPUs"),
    ("instance_group", "profile_not_trt", "onnxruntime_onnx", lambda c: c.instance_group[0].profile.append("0"), OK_FACTS,
     "instance group m_0 of model m and platform onnxruntime_onnxspecifies profile field which is only supported for TensorRT models"),
    ("instance_group", "profile_word", "tensorrt_plan", lambda c: c.instance_group[0].profile.__setitem__(0, "first"), OK_FACTS,
     "unable to parse 'first': stoi"),
    ("instance_group", "profile_negative", "tensorrt_plan", lambda c: c.instance_group[0].profile.__setitem__(0, "-1"), OK_FACTS,
     ("instance group m_0 of model m and platform tensorrt_plan specifies invalid profile -1. The field should contain the string "
     "representation of a non-negative integer.")),
    ("instance_group", "profile_out_of_engine", "tensorrt_plan", lambda c: c.instance_group[0].profile.__setitem__(0, "1"),
     _facts(engine_profile_count=1), "instance group m_0 of model m selects optimization profile 1 but the engine has 1 profile(s)"),
    ("instance_group", "gpu_id_this_machine", "onnxruntime_onnx", lambda c: _gpu(c, 3), _facts(gpu_count=2),
     "instance group m_0 of model m specifies invalid or unsupported gpu id 3"),
    ("instance_group", "gpu_id_negative", "onnxruntime_onnx", lambda c: _gpu(c, -1), _facts(gpu_count=None),
     "instance group m_0 of model m specifies invalid or unsupported gpu id -1"),
    ("instance_group", "trt_on_cpu", "tensorrt_plan", lambda c: (setattr(c.instance_group[0], "kind", 2), c.instance_group[0].ClearField("gpus")),
     OK_FACTS, "instance group m_0 of model m has kind KIND_CPU, but a TensorRT engine runs on a GPU only"),
    ("warmup", "batch_above_max", "onnxruntime_onnx", lambda c: _warm(c, batch=16), OK_FACTS,
     "warmup 'w' runs batch 16 but max_batch_size is 8: the backend fails the load with \"batch size 16 for 'm', max allowed is 8\""),
    ("warmup", "missing_input", "onnxruntime_onnx", lambda c: c.model_warmup.add(name="w", batch_size=1), OK_FACTS,
     "expected 1 inputs but got 0 inputs for model 'm'"),
    ("warmup", "variable_dims", "onnxruntime_onnx", lambda c: _warm(c, dims=[3, -1, 8]), OK_FACTS,
     "warmup setting expects all variable-size dimensions are specified for input 'image'"),
    ("warmup", "no_data", "onnxruntime_onnx", lambda c: _warm(c, data=False), OK_FACTS,
     "warmup setting expects input 'image' to have input_data_type set"),
    ("warmup", "shape", "onnxruntime_onnx", lambda c: _warm(c, dims=[3, 4, 4]), _facts(warmup_files={"image.data": 192}),
     "unexpected shape for input 'image' for model 'm'. Expected [-1,3,8,8], got [1,3,4,4]"),
    ("warmup", "dtype", "onnxruntime_onnx", lambda c: _warm(c, data_type=10), _facts(warmup_files={"image.data": 4096}),
     "inference input 'image' data-type is 'FP16', but model 'm' expects 'FP32'"),
    ("warmup", "unknown_input", "onnxruntime_onnx", lambda c: (_warm(c), c.model_warmup[0].inputs["other"].CopyFrom(c.model_warmup[0].inputs["image"])),
     _facts(warmup_files={"image.data": 768}), "warmup 'w' feeds 'other', which is not an input of model 'm'"),
    ("warmup", "file_missing", "onnxruntime_onnx", lambda c: _warm(c), _facts(warmup_files={}),
     "warmup data file 'image.data' is not in m/warmup/"),
    ("warmup", "file_short", "onnxruntime_onnx", lambda c: _warm(c), _facts(warmup_files={"image.data": 100}),
     "warmup setting expects 768 bytes, but the data provided from image.dataonly has 100 bytes"),
    ("parameters", "bool", "pytorch_libtorch", lambda c: c.parameters["INFERENCE_MODE"].__setattr__("string_value", "True!"), OK_FACTS,
     "failed to convert INFERENCE_MODE 'True!' to boolean value"),
    ("parameters", "int", "onnxruntime_onnx", lambda c: c.parameters["intra_op_thread_count"].__setattr__("string_value", "all"), OK_FACTS,
     "failed to convert intra_op_thread_count 'all' to integral number"),
    ("parameters", "choice", "tensorrt_plan", lambda c: c.parameters["execution_context_allocation_strategy"].__setattr__("string_value", "LAZY"),
     OK_FACTS, "Invalid value for 'execution_context_allocation_strategy': 'LAZY' for model instance 'm'. Supported values are 'STATIC' and "
     "'ON_PROFILE_CHANGE'."),
    ("parameters", "choice_of_tensorrt_not_the_backend", "tensorrt_plan",
     lambda c: c.parameters["execution_context_allocation_strategy"].__setattr__("string_value", "USER_MANAGED"), OK_FACTS,
     "Invalid value for 'execution_context_allocation_strategy': 'USER_MANAGED' for model instance 'm'. Supported values are 'STATIC' and "
     "'ON_PROFILE_CHANGE'."),
    ("parameters", "choice_in_our_words", "onnxruntime_onnx", lambda c: c.parameters["execution_mode"].__setattr__("string_value", "2"), OK_FACTS,
     "parameter execution_mode is '2'; the onnxruntime backend accepts 0, 1"),
    ("optimization", "accelerator", "onnxruntime_onnx",
     lambda c: c.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt_llm"), OK_FACTS,
     "unknown Execution Accelerator 'tensorrt_llm' is requested"),
    ("optimization", "precision", "onnxruntime_onnx",
     lambda c: c.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt").parameters.__setitem__("precision_mode", "BF16"),
     OK_FACTS, "unsupported precision mode 'BF16' is requested"),
    ("optimization", "workspace", "onnxruntime_onnx",
     lambda c: c.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt").parameters.__setitem__(
         "max_workspace_size_bytes", "1GiB"), OK_FACTS, "failed to convert '1GiB' to unsigned long long integral number"),
    ("onnx_io", "input_name", "onnxruntime_onnx", lambda c: setattr(_io(c), "name", "x"),
     _facts(onnx_inputs={"image": [-1, 3, 8, 8]}), "unexpected inference input 'x', allowed inputs are: image"),
    ("onnx_io", "output_name", "onnxruntime_onnx", lambda c: setattr(_io(c, "output"), "name", "logits"),
     _facts(onnx_outputs={"output__0": [-1, 10]}), "unexpected inference output 'logits', allowed outputs are: output__0"),
    ("onnx_io", "fixed_batch", "onnxruntime_onnx", None, _facts(onnx_inputs={"image": [1, 3, 8, 8]}),
     ("model 'm', tensor 'image': for the model to support batching the shape should have at least 1 dimension and the first dimension "
     "must be -1; but shape expected by the model is [1,3,8,8]")),
    ("onnx_io", "rank", "onnxruntime_onnx", None, _facts(onnx_inputs={"image": [-1, 192]}),
     ("model 'm', tensor 'image': the model expects 2 dimensions (shape [-1,192]) but the model configuration specifies 4 dimensions (an "
     "initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making complete shape [-1,3,8,8])")),
    ("onnx_io", "dims_no_batching", "onnxruntime_onnx", lambda c: (setattr(c, "max_batch_size", 0), c.ClearField("dynamic_batching")),
     _facts(onnx_inputs={"image": [-1, 3, 8, 8]}), ("model 'm', tensor 'image': the model expects 4 dimensions (shape [-1,3,8,8]) but the "
     "model configuration specifies 3 dimensions (shape [3,8,8])")),
    ("onnx_io", "input_left_out", "onnxruntime_onnx", None, _facts(onnx_inputs={"image": [-1, 3, 8, 8], "mask": [-1, 8]}),
     "unable to load model 'm', configuration expects 1 inputs, model provides 2"),
    ("onnx_io", "batch_input_counts", "onnxruntime_onnx", lambda c: _batch_input(c), _facts(onnx_inputs={"image": [-1, 3, 8, 8]}),
     "unable to load model 'm', configuration expects 2 inputs, model provides 1"),
    ("batch_io", "sources", "onnxruntime_onnx", lambda c: _batch_input(c, sources=()), OK_FACTS,
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m"),
    ("batch_io", "data_type", "onnxruntime_onnx", lambda c: _batch_input(c, data_type=9), OK_FACTS,
     "batch input data type must be TYPE_INT32 or TYPE_FP32 for m"),
    ("batch_io", "unknown_source", "onnxruntime_onnx", lambda c: _batch_input(c, sources=("ids",)), OK_FACTS,
     "unknown source input name 'ids' for m"),
    ("batch_io", "output_target", "onnxruntime_onnx", lambda c: c.batch_output.add(target_name=["logits"], source_input=["image"]), OK_FACTS,
     "unknown target output name 'logits' for m"),
    ("batch_io", "output_target_twice", "onnxruntime_onnx",
     lambda c: c.batch_output.add(target_name=["output__0", "output__0"], source_input=["image"]), OK_FACTS,
     "target output name 'output__0' can only be specified once for m"),
    ("batch_io", "output_source", "onnxruntime_onnx", lambda c: c.batch_output.add(target_name=["output__0"]), OK_FACTS,
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0 for m"),
    ("sequence_batching", "no_name", "onnxruntime_onnx", lambda c: _control(c, "", START, int32_false_true=[0, 1]), OK_FACTS,
     "sequence batching control tensor must have a name for m"),
    ("sequence_batching", "tensor_twice", "onnxruntime_onnx",
     lambda c: (_control(c, "S", START, int32_false_true=[0, 1]), _control(c, "S", END, int32_false_true=[0, 1])), OK_FACTS,
     "sequence batching control tensor 'S' is specified for multiple control kinds for m"),
    ("sequence_batching", "kind_twice", "onnxruntime_onnx",
     lambda c: (_control(c, "S1", START, int32_false_true=[0, 1]), _control(c, "S2", START, bool_false_true=[False, True])), OK_FACTS,
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
    ("sequence_batching", "no_pair", "onnxruntime_onnx", lambda c: _control(c, "END", END, data_type=8), OK_FACTS,
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_END for m"),
    ("sequence_batching", "two_pairs", "onnxruntime_onnx", lambda c: _control(c, "READY", READY, int32_false_true=[0, 1], fp32_false_true=[0, 1]),
     OK_FACTS, ("sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' "
     "for CONTROL_SEQUENCE_READY for m")),
    ("sequence_batching", "pair_size", "onnxruntime_onnx", lambda c: _control(c, "START", START, fp32_false_true=[0, 1, 1]), OK_FACTS,
     "sequence batching control 'fp32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m"),
    ("sequence_batching", "corrid_pair", "onnxruntime_onnx", lambda c: _control(c, "CORRID", CORRID, data_type=8, int32_false_true=[0, 1]),
     OK_FACTS, ("sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
     "for CONTROL_SEQUENCE_CORRID for m")),
    ("sequence_batching", "corrid_type", "onnxruntime_onnx", lambda c: _control(c, "CORRID", CORRID, data_type=11), OK_FACTS,
     ("unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
     "TYPE_INT32 and TYPE_STRING")),
    ("sequence_batching", "oldest_preferred", "onnxruntime_onnx", lambda c: c.sequence_batching.oldest.preferred_batch_size.append(16), OK_FACTS,
     "sequence batching preferred batch size must be <= max batch size for m"),
    ("sequence_batching", "slot_utilization", "onnxruntime_onnx", lambda c: setattr(c.sequence_batching.direct, "minimum_slot_utilization", 1.5),
     OK_FACTS, "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m"),
    ("sequence_batching", "response_cache", "onnxruntime_onnx", lambda c: (_sequence(c), setattr(c.response_cache, "enable", True)), OK_FACTS,
     "Response Cache does not currently support model m with sequence batching scheduler. Please disable the response cache."),
    ("response_cache", "decoupled", "onnxruntime_onnx",
     lambda c: (setattr(c.response_cache, "enable", True), setattr(c.model_transaction_policy, "decoupled", True)), OK_FACTS,
     "Response Cache does not currently support model m with 'decoupled' transaction policy. Please disable the response cache."),
    ("ensemble", "not_ensemble", "onnxruntime_onnx",
     lambda c: (c.ClearField("dynamic_batching"), c.ensemble_scheduling.step.add(model_name="x", input_map={"a": "image"},
                                                                                  output_map={"b": "output__0"})), OK_FACTS,
     "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"),
    ("ensemble", "no_scheduling", "onnxruntime_onnx", lambda c: (_ensemble(c), c.ClearField("ensemble_scheduling")), OK_FACTS,
     "ensemble scheduling must be set for ensemble m whose platform is ensemble"),
    ("ensemble", "backend", "onnxruntime_onnx", lambda c: (_ensemble(c), setattr(c, "backend", "onnxruntime")), OK_FACTS,
     "Ensemble model 'm' must have platform type 'ensemble' and empty backend type"),
    ("ensemble", "instance_group", "onnxruntime_onnx", lambda c: (_ensemble(c), c.instance_group.add(kind=2)), OK_FACTS,
     "instance group should not be specified for ensemble 'm'"),
    ("ensemble", "warmup", "onnxruntime_onnx", lambda c: (_ensemble(c), _warm(c)), OK_FACTS,
     "model_warmup can not be specified for ensemble 'm'"),
    ("ensemble", "step_output_map", "onnxruntime_onnx", lambda c: _ensemble(c, [("classifier", {"image": "image"}, {})]), OK_FACTS,
     "must specify 'output_map' in step 0 of ensemble 'm'"),
    ("ensemble", "written_twice", "onnxruntime_onnx",
     lambda c: _ensemble(c, [("a", {"x": "image"}, {"y": "output__0"}), ("b", {"x": "image"}, {"y": "output__0"})]), OK_FACTS,
     "ensemble tensor 'output__0' can appear in an output map only once for ensemble 'm' step 1"),
    ("ensemble", "input_unused", "onnxruntime_onnx", lambda c: _ensemble(c, [("classifier", {"image": "pixels"}, {"output__0": "output__0"})]),
     OK_FACTS, "ensemble input 'image' for ensemble m' is not used"),
    ("ensemble", "output_unused", "onnxruntime_onnx", lambda c: _ensemble(c, [("classifier", {"image": "image"}, {"output__0": "logits"})]),
     OK_FACTS, "ensemble output 'output__0' for ensemble m' is not used"),
    ("ensemble", "output_not_written", "onnxruntime_onnx",
     lambda c: _ensemble(c, [("a", {"x": "image"}, {"y": "feature"}), ("b", {"x": "feature", "z": "mask"}, {"y": "output__0"})]), OK_FACTS,
     "output 'output__0' for ensemble 'm' is not written"),
    ("ensemble", "tensor_unused", "onnxruntime_onnx",
     lambda c: _ensemble(c, [("classifier", {"image": "image"}, {"output__0": "output__0", "extra": "scores"})]), OK_FACTS,
     "ensemble tensor 'scores' is unused in ensemble 'm'"),
    ("model_metrics", "family", "onnxruntime_onnx", lambda c: _metrics(c, family=""), OK_FACTS,
     "metric identifier must specify non-empty 'family'"),
    ("model_metrics", "histogram", "onnxruntime_onnx", lambda c: _metrics(c, buckets=None), OK_FACTS,
     "metric control must specify 'histogram_options'"),
    ("model_metrics", "buckets", "onnxruntime_onnx", lambda c: _metrics(c, buckets=None).histogram_options.SetInParent(), OK_FACTS,
     "histogram options must specify non-empty 'buckets'"),
    ("torch_aoti_names", "input", "torch_aoti", lambda c: setattr(_io(c), "name", "image"), OK_FACTS,
     "input 'image' is not addressable in a torch_aoti model: the PyTorch backend names inputs INPUT__<index>, ARGS[<i>] or KWARGS[<name>]"),
    ("torch_aoti_names", "output", "torch_aoti", lambda c: setattr(_io(c, "output"), "name", "output__0"), OK_FACTS,
     "output 'output__0' is not addressable in a torch_aoti model: the PyTorch backend names outputs OUTPUT__<index> or RESULT[...]"),
    ("openvino", "gpu", "openvino", lambda c: setattr(c.instance_group[0], "kind", 1), OK_FACTS,
     "unable to load model 'm', Triton openVINO backend supports only CPU device"),
    ("openvino", "streams", "openvino", lambda c: c.parameters["NUM_STREAMS"].__setattr__("string_value", "many"), OK_FACTS,
     "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got many"),
    ("tensorrt_engine", "max_batch", "tensorrt_plan", None, _facts(engine_max_batch=4),
     "configuration specified max-batch 8 but TensorRT engine only supports max-batch 4"),
]


@pytest.fixture(scope="module")
def base_configs(tmp_path_factory) -> dict[str, Any]:
    out = {}
    for platform in PLATFORMS:
        config, *_ = config_of(tmp_path_factory.mktemp(platform), platform)
        out[platform] = config
    return out


@pytest.mark.parametrize("rule, case, platform, mutate, facts, words", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_rule_rejects_its_violation_in_tritons_words(base_configs, rule, case, platform, mutate, facts, words):
    config = type(base_configs[platform])()
    config.CopyFrom(base_configs[platform])
    assert violations(config, OK_FACTS) == []  # the unbroken config passes every rule
    if mutate is not None:  # else the artifact (facts) breaks the rule, not the config
        assert violations(config, facts) == []
        mutate(config)
    found = violations(config, facts)
    assert [(v.rule, v.message) for v in found] == [(rule, words)]
    with pytest.raises(ConfigRuleError) as err:
        rules.check(config, facts, "config.pbtxt of 'm'")
    message = str(err.value)
    assert f'"{words}"' in message and "\n" not in message and f"rejected by {found[0].source}" in message


# (rule, id, platform, mutate, facts, expected words): Triton loads these, or whether it does cannot be decided on this machine:
# a warning (logged by check), never a refusal.
WARN_CASES: list[tuple[str, str, str, Callable[[Any], Any], ArtifactFacts, str]] = [
    ("libtorch_names", "output", "pytorch_libtorch", lambda c: setattr(_io(c, "output"), "name", "logits"), OK_FACTS,
     "output 'logits' does not follow the <name>__<index> naming convention"),
    ("openvino", "no_padding", "openvino", lambda c: c.parameters.pop("ENABLE_BATCH_PADDING"), OK_FACTS,
     ("expected requests with batch size '8', got '<n>'... this error can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model "
     "configuration to 'YES' at a performance cost.")),
    ("openvino", "no_io_autocompletes", "openvino", lambda c: (c.ClearField("input"), c.ClearField("output"), c.parameters.pop("ENABLE_BATCH_PADDING")),
     OK_FACTS, ("expected requests with batch size '8', got '<n>'... this error can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in "
     "model configuration to 'YES' at a performance cost.")),
    ("instance_group", "gpu_count_unknown", "onnxruntime_onnx", lambda c: _gpu(c, 0, 3), _facts(gpu_count=None),
     "instance group m_0 of model m specifies invalid or unsupported gpu id 3"),
    ("instance_group", "no_gpu_here", "onnxruntime_onnx", lambda c: _gpu(c, 1), _facts(gpu_count=0),
     "instance group m_0 of model m specifies invalid or unsupported gpu id 1"),
    ("model_metrics", "older_triton", "onnxruntime_onnx", lambda c: _metrics(c), OK_FACTS,
     'Message type "inference.ModelConfig" has no field named "model_metrics"'),
]


@pytest.mark.parametrize("rule, case, platform, mutate, facts, words", WARN_CASES, ids=[f"{c[0]}-{c[1]}" for c in WARN_CASES])
def test_what_triton_loads_is_a_warning_never_a_refusal(base_configs, caplog, rule, case, platform, mutate, facts, words):
    config = type(base_configs[platform])()
    config.CopyFrom(base_configs[platform])
    assert rules.warnings(config, facts) == []
    mutate(config)
    assert violations(config, facts) == []
    found = rules.warnings(config, facts)
    assert [(v.rule, v.message) for v in found] == [(rule, words)] and found[0].when
    with caplog.at_level(logging.WARNING, logger="optimizer.triton.config.rules.check"):
        assert rules.check(config, facts, "config.pbtxt of 'm'") == found
    assert words in caplog.text and "config.pbtxt of 'm'" in caplog.text


# A config using each template-settable field correctly passes every rule (test_triton_core_agreement.py loads the ones 2.51 can).
FIXED: list[tuple[str, str, Callable[[Any], Any], ArtifactFacts]] = [
    ("sequence_controls", "onnxruntime_onnx", _sequence, OK_FACTS),
    ("sequence_controls_in_graph", "onnxruntime_onnx", _sequence,
     _facts(onnx_inputs={"image": [-1, 3, 8, 8], "START": [-1, 1], "CORRID": [-1, 1]})),
    ("sequence_oldest", "onnxruntime_onnx", lambda c: c.sequence_batching.oldest.preferred_batch_size.append(4), OK_FACTS),
    ("batch_input", "onnxruntime_onnx", _batch_input, _facts(onnx_inputs={"image": [-1, 3, 8, 8], "count": [-1, 1]})),
    ("batch_output", "onnxruntime_onnx", lambda c: c.batch_output.add(target_name=["output__0"], source_input=["image"]), OK_FACTS),
    ("every_graph_input", "onnxruntime_onnx", lambda c: c.input.add(name="mask", data_type=11, dims=[8]),
     _facts(onnx_inputs={"image": [-1, 3, 8, 8], "mask": [-1, 8]})),
    ("ensemble", "onnxruntime_onnx", _ensemble, OK_FACTS),
    ("ensemble_two_steps", "onnxruntime_onnx",
     lambda c: _ensemble(c, [("classifier", {"image": "image"}, {"output__0": "feature"}), ("head", {"x": "feature"}, {"y": "output__0"})]),
     OK_FACTS),
    ("gpus_of_this_machine", "onnxruntime_onnx", lambda c: _gpu(c, 0, 1), _facts(gpu_count=2)),
    ("model_metrics", "onnxruntime_onnx", _metrics, OK_FACTS),
    ("libtorch_indexed_outputs", "pytorch_libtorch", lambda c: c.output.add(name="output__1", data_type=11, dims=[2]), OK_FACTS),
    # core completes the backend from default_model_filename and a typed backend's platform (AutoCompleteBackendFields) before it validates
    ("default_file_names_the_backend", "onnxruntime_onnx", lambda c: (c.ClearField("platform"), setattr(c, "default_model_filename", "model.onnx")),
     OK_FACTS),
    ("default_file_with_any_platform", "openvino",
     lambda c: (c.ClearField("backend"), setattr(c, "platform", "openvino"), setattr(c, "default_model_filename", "model.xml")), OK_FACTS),
    ("tensorrt_backend_only", "tensorrt_plan",
     lambda c: (c.ClearField("platform"), setattr(c, "backend", "tensorrt"), c.input.add(name="shape", data_type=8, dims=[2], is_shape_tensor=True)),
     _facts(gpu_count=1)),
]


@pytest.mark.parametrize("case, platform, mutate, facts", FIXED, ids=[c[0] for c in FIXED])
def test_template_fields_used_correctly_pass(base_configs, case, platform, mutate, facts):
    config = type(base_configs[platform])()
    config.CopyFrom(base_configs[platform])
    mutate(config)
    assert violations(config, facts) == []
    assert [w.rule for w in rules.warnings(config, facts)] == (["model_metrics"] if case == "model_metrics" else [])


@pytest.mark.parametrize("graph, words", [
    ({"image": [-1, 3, 8, 8], "START": [-1, 1], "other": [-1, 1]}, "configuration specified sequence control 'CORRID', but model does not provide that input"),
    ({"image": [-1, 3, 8, 8], "START": [-1, 1], "CORRID": [-1, 2]},
     "unable to load model 'm', sequence control 'CORRID' in model has dims [2] but dims [1] is expected"),
    ({"image": [-1, 3, 8, 8], "START": [-1, 1]}, "configuration specified sequence control 'CORRID', but model does not provide that input"),
])
def test_onnx_sequence_controls_are_graph_inputs_of_one_value(base_configs, graph, words):
    """ONNX Runtime backend: each control the sequence batcher feeds is a graph input of dims [1] (after the batch axis), counted as an input."""
    config = type(base_configs["onnxruntime_onnx"])()
    config.CopyFrom(base_configs["onnxruntime_onnx"])
    _sequence(config)
    found = violations(config, _facts(onnx_inputs=graph))
    assert [(v.rule, v.source) for v in found][:1] == [("onnx_io", "ONNX Runtime backend")] and found[0].message == words
    assert violations(config, _facts(onnx_inputs={"image": [-1, 3, 8, 8], "START": [-1, 1], "CORRID": [-1, 1]})) == []
    if "other" not in graph and "[2]" not in words:  # one graph input short as well: the count says so too
        assert found[1].message == "unable to load model 'm', configuration expects 3 inputs, model provides 2"


def test_a_wrong_directory_name_is_quoted_after_what_validate_model_config_refuses(base_configs):
    # Triton's repository manager checks the directory name only once ValidateModelConfig has passed (server
    # qa/L0_model_config/autofill_noplatform/ensemble/ensemble_scheduling_no_set names its model ensemble_scheduling_not_set)
    config = type(base_configs["onnxruntime_onnx"])()
    config.CopyFrom(base_configs["onnxruntime_onnx"])
    config.name, config.max_batch_size = "other", -1
    config.ClearField("dynamic_batching")
    with pytest.raises(ConfigRuleError, match=r"rejected by Triton core: \"'max_batch_size' must be non-negative value for other\".*1 more: "
                       r"unexpected directory name 'm' for model 'other'"):
        rules.check(config, OK_FACTS, "config.pbtxt of 'm'")


def test_every_rule_has_a_breaking_case():
    assert {c[0] for c in CASES} | {c[0] for c in WARN_CASES} == set(RULES)


def test_model_metrics_parses_round_trips_and_typos_still_fail():
    """model_metrics (newer than the proto in tritonclient 2.51) parses; a typo inside it or next to it does not."""
    text = canonical(parse((GOLDEN / "onnxruntime_onnx.pbtxt").read_text()))
    block = 'model_metrics {\n  metric_control {\n    metric_identifier {\n      family: "nv_inference_first_response_histogram_ms"\n    }\n' \
            '    histogram_options {\n      buckets: [1.0, 10.0]\n    }\n  }\n}\n'
    config = parse(text + block)
    assert list(config.model_metrics.metric_control[0].histogram_options.buckets) == [1.0, 10.0]
    assert canonical(config) == text + block
    for typo in (block.replace("buckets", "bucket"), block.replace("model_metrics", "model_metric"), "max_batch_sise: 4\n"):
        with pytest.raises(TemplateError, match="has no field named"):
            parse(text + typo)


def test_dynamic_and_sequence_batching_together_do_not_parse():
    """One scheduling choice: Triton's parser refuses a second (proto oneof), so the template error comes before any rule."""
    text = canonical(parse((GOLDEN / "onnxruntime_onnx.pbtxt").read_text())) + "sequence_batching {\n}\n"
    with pytest.raises(TemplateError, match='another member of oneof "scheduling_choice"'):
        parse(text)


def test_gpu_count_comes_from_torch_or_nvidia_smi(monkeypatch, tmp_path: Path):
    import types

    fake_torch = types.SimpleNamespace(version=types.SimpleNamespace(cuda="12.4"), cuda=types.SimpleNamespace(device_count=lambda: 3))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    rules.local_gpu_count.cache_clear()
    try:
        assert rules.local_gpu_count() == 3
        fake_torch.version.cuda = None  # a CPU build of torch: ask nvidia-smi
        smi = tmp_path / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-b)'\n")
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        rules.local_gpu_count.cache_clear()
        assert rules.local_gpu_count() == 2
        monkeypatch.setenv("PATH", str(tmp_path / "none"))
        rules.local_gpu_count.cache_clear()
        assert rules.local_gpu_count() is None
    finally:
        rules.local_gpu_count.cache_clear()


def test_gpu_ids_are_counted_only_when_a_config_lists_gpus(base_configs):
    asked = []
    facts = _facts(gpu_count=lambda: asked.append(1) or 1)
    assert violations(base_configs["onnxruntime_onnx"], facts) == [] and asked == []
    config = type(base_configs["onnxruntime_onnx"])()
    config.CopyFrom(base_configs["onnxruntime_onnx"])
    _gpu(config, 1)
    with pytest.raises(ConfigRuleError, match=r"gpu id 1\"; fix: this machine has 1 GPU\(s\) \(ids 0\.\.0\)"):
        rules.check(config, facts)
    assert asked


def test_rule_error_stops_publishing_before_anything_is_written(tmp_path: Path):
    result = make_result(tmp_path, "tensorrt_plan", device="cuda:0", metadata={"engine_max_batch": 4})
    with pytest.raises(ConfigRuleError, match="TensorRT engine only supports max-batch 4"):
        render_config(result, PublishOptions(tmp_path / "repo", "m"), state())
    assert not (tmp_path / "repo").exists()


def test_onnx_facts_come_from_the_graph(tmp_path: Path):
    result = make_result(tmp_path, "onnxruntime_onnx", inputs=(tensor("ids", "int64", "1-128"),))
    facts = rules.facts_for(result.selected_candidate.artifact, "m")
    assert dict(facts.onnx_inputs) == {"ids": [-1, -1]} and dict(facts.onnx_outputs) == {"output__0": [-1, 10]}


# -- templates ---------------------------------------------------------------------------------------


def _spec(tmp: Path, platform: str = "onnxruntime_onnx"):
    return build_spec(golden_result(tmp, platform), "m")


def test_user_template_with_an_unknown_field_is_rejected_with_line_and_column(tmp_path: Path):
    user = tmp_path / "templates"
    user.mkdir()
    body = (packaged_template_dir() / "onnxruntime_onnx.pbtxt.j2").read_text()
    (user / "onnxruntime_onnx.pbtxt.j2").write_text(body.replace('{% include "partials/batching.pbtxt.j2" %}',
                                                                 '{% include "partials/batching.pbtxt.j2" %}\nmax_batch_sise: 4'))
    result = golden_result(tmp_path, "onnxruntime_onnx")
    with pytest.raises(TemplateError) as err:
        render_config(result, PublishOptions(tmp_path / "repo", "m", template_dir=user), state())
    text = render(build_spec(result, "m"), user)
    line = text.splitlines().index("max_batch_sise: 4") + 1
    message = str(err.value)
    assert f"at line {line}, column 1" in message and 'no field named "max_batch_sise"' in message
    assert f"{user / 'onnxruntime_onnx.pbtxt.j2'}:" in message and "\n" not in message
    assert not (tmp_path / "repo").exists()


def test_user_partial_overrides_the_packaged_one(tmp_path: Path):
    user = tmp_path / "templates" / "partials"
    user.mkdir(parents=True)
    (user / "instance_group.pbtxt.j2").write_text("instance_group { count: 3 kind: {{ instance_group.kind }} }\n")
    text = render(_spec(tmp_path), tmp_path / "templates")
    assert parse(text).instance_group[0].count == 3


def test_template_syntax_error_names_file_and_line(tmp_path: Path):
    user = tmp_path / "templates"
    user.mkdir()
    (user / "onnxruntime_onnx.pbtxt.j2").write_text('name: {{ name | q }}\n{% if platform %}\nplatform: "x"\n')
    with pytest.raises(TemplateError, match=r"onnxruntime_onnx\.pbtxt\.j2:\d+ failed to render"):
        render(_spec(tmp_path), user)


def test_template_using_an_unknown_variable_names_file_and_line(tmp_path: Path):
    user = tmp_path / "templates"
    user.mkdir()
    (user / "onnxruntime_onnx.pbtxt.j2").write_text('name: {{ name | q }}\nmax_batch_size: {{ max_batch }}\n')
    with pytest.raises(TemplateError, match=r"onnxruntime_onnx\.pbtxt\.j2:2 failed to render: 'max_batch' is undefined"):
        render(_spec(tmp_path), user)


def test_template_dir_that_does_not_exist_is_a_usage_error(tmp_path: Path):
    with pytest.raises(TemplateError, match="is not a directory"):
        render(_spec(tmp_path), tmp_path / "nope")


def test_parameter_values_are_escaped_for_text_proto(tmp_path: Path):
    result = make_result(tmp_path, "pytorch_libtorch", triton_settings={"parameters": {"PATH_LIKE": 'a "quoted"\\path'}})
    config = parse(render(build_spec(result, "m")))
    assert config.parameters["PATH_LIKE"].string_value == 'a "quoted"\\path'


@pytest.mark.slow
def test_templates_ship_inside_the_built_wheel(tmp_path: Path):
    """Build the wheel, import the package from it (not from the editable install) and render every platform."""
    src = tmp_path / "src"  # build from a copy: setuptools writes build/ and egg-info next to the sources
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                                             "aitune-reports", "model_repository", ".hypothesis"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
                       check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("aitune_export-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n for n in names if n.startswith("optimizer/model_repository_templates/") and n.endswith(".j2")}
    expected = {p.relative_to(ROOT / "model_repository_templates").as_posix() for p in (ROOT / "model_repository_templates").rglob("*.j2")}
    assert shipped == {f"optimizer/model_repository_templates/{e}" for e in expected}
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import optimizer, sys\n"
        "from pathlib import Path\n"
        f"assert Path(optimizer.__file__).is_relative_to({str(site)!r}), optimizer.__file__\n"
        "from optimizer.triton.config.model_config import packaged_template_dir, render, parse\n"
        f"assert packaged_template_dir().is_relative_to({str(site)!r})\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from tests.triton_records import make_result\n"
        "from optimizer.triton.config.spec import build_spec\n"
        "import tempfile\n"
        f"for p in {PLATFORMS!r}:\n"
        "    parse(render(build_spec(make_result(Path(tempfile.mkdtemp()), p), 'm')))\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", code, str(ROOT)], check=False, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("policy, field", [({"latest": 1}, "latest"), ({"specific": [2, 3]}, "specific"), ({"all": {}}, "all")])
def test_every_version_policy_renders(tmp_path: Path, policy: dict, field: str):
    result = golden_result(tmp_path, "onnxruntime_onnx")
    config = parse(render(build_spec(result, "m", version_policy=policy)))
    assert config.version_policy.WhichOneof("policy_choice") == field
    if field == "specific":
        assert list(config.version_policy.specific.versions) == [2, 3]


def test_torch_aoti_configs_address_tensors_by_position(tmp_path: Path):
    """The PyTorch backend reads torch_aoti tensors as INPUT__<i> / OUTPUT__<i>, whatever forward() calls them."""
    result = make_result(tmp_path, "torch_aoti", triton_settings=SETTINGS["torch_aoti"])  # forward names: image -> output__0
    text, files, _ = render_config(result, PublishOptions(tmp_path / "repo", "m", warmup=True), state())
    config = parse(text)
    assert [t.name for t in config.input] == ["INPUT__0"] and [t.name for t in config.output] == ["OUTPUT__0"]
    assert "warmup/INPUT__0.data" in files and all(w.inputs.keys() == {"INPUT__0"} for w in config.model_warmup)
