"""Triton's own config cases (server qa/L0_model_config) through our rules: what Triton refuses is refused in its words, what it loads passes.

Only the config lines each case needs are copied; the comment above each group names its upstream folder. The L0
test greps the server log for the `expected` text, so a case agrees when our first refusal and Triton's text contain
one another (Triton may go on, e.g. ". GPUs with at least the minimum required CUDA compute compatibility ...").
"""

from __future__ import annotations

import pytest

from optimizer.errors import ConfigRuleError
from optimizer.triton.config import rules
from optimizer.triton.config.model_config import parse
from optimizer.triton.config.rules import ArtifactFacts, violations

IO = 'input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }]\noutput [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
DATA = ('input [{ name: "data" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 1, 28, 28 ] }]\n'
        'output [{ name: "prob" data_type: TYPE_FP32 dims: [ 10, 1, 1 ] }]\n')
ONNX_GRAPH = {"onnx_inputs": {"INPUT0": [-1, 16], "INPUT1": [-1, 16]}, "onnx_outputs": {"OUTPUT0": [-1, 16], "OUTPUT1": [-1, 16]}}
ONNX_IO = ('input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }]\n'
           'output [{ name: "OUTPUT0" data_type: TYPE_INT8 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT8 dims: [ 16 ] }]\n')
TRT_IO = ('platform: "tensorrt_plan"\nmax_batch_size: 8\n'
          'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }]\n'
          'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }]\n')
ENSEMBLE_STEP = ('platform: "ensemble"\nensemble_scheduling { step [{ model_name: "model_a" model_version: -1 '
                 'input_map { key: "model_a_input" value: "data" } output_map { key: "model_a_output" value: "prob" } }] }\n')

# noautofill_platform/<case>: the L0 test replaces the platform with each of these and expects the same refusal
TRIALS = ("tensorrt_plan", "onnxruntime_onnx", "pytorch_libtorch")
NOAUTOFILL = {
    "negative_max_batch_size": ("max_batch_size: -2\n" + DATA, "'max_batch_size' must be non-negative value for negative_max_batch_size"),
    "missing_datatype": ('max_batch_size: 4\ninput [{ name: "input" dims: [ 2, -1 ] }]\noutput [{ name: "output" data_type: TYPE_FP32 dims: [ 1 ] }]\n',
                         "model input 'input' must specify 'data_type'"),
    "zerodims_output1": ('max_batch_size: 8\ninput [{ name: "input" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
                         'output [{ name: "output" data_type: TYPE_FP32 dims: [ 0 ] }]\n',
                         "model output 'output' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for zerodims_output1"),
    "reshape_nobatch_empty0": ('max_batch_size: 0\ninput [{ name: "input" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }]\n'
                               'output [{ name: "output" data_type: TYPE_FP32 dims: [ 1 ] }]\n',
                               "model input 'input' cannot have empty reshape for non-batching model as scalar tensors are not supported "
                               "for reshape_nobatch_empty0"),
    "reshape_variable4": ('max_batch_size: 4\ninput [{ name: "input" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ 2, -1, -1 ] } }]\n'
                          'output [{ name: "output" data_type: TYPE_FP32 dims: [ 1 ] }]\n',
                          "model input 'input' has different number of variable-size dimensions for dims and reshape for reshape_variable4"),
    "default_priority_level1": ("max_batch_size: 8\ndynamic_batching { priority_levels: 3 default_priority_level: 5 }\n" + IO,
                                "default priority level must be in range [1, 3] for default_priority_level1"),
    "preserve_ordering1": ("max_batch_size: 8\ndynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY "
                           "default_timeout_microseconds: 1000 } }\n" + IO,
                           "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for preserve_ordering1"),
    "control_tensor_multiple": ('max_batch_size: 8\nsequence_batching { control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START '
                                'int32_false_true: [ 0, 1 ] }] }, { name: "START" control [{ kind: CONTROL_SEQUENCE_READY '
                                'int32_false_true: [ 0, 1 ] }] }] }\n' + IO,
                                "sequence batching control tensor 'START' is specified for multiple control kinds for control_tensor_multiple"),
    "batch_output_duplicated_target": ('input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] }]\n'
                                       'output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] }]\n'
                                       'batch_output [{ target_name: ["OUTPUT", "OUTPUT"] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" }]\n',
                                       "target output name 'OUTPUT' can only be specified once"),
    "invalid_cpu": ("max_batch_size: 8\n" + DATA + "instance_group [{ kind: KIND_CPU gpus: [ 0 ] }]\n",
                    "instance group invalid_cpu_0 of model invalid_cpu has kind KIND_CPU but specifies one or more GPU"),
    "negative_gpu": ("max_batch_size: 1\n" + DATA + "instance_group [{ gpus: [ 0 ] }]\ninstance_group [{ kind: KIND_GPU gpus: [ -1 ] }]\n",
                     "instance group negative_gpu_1 of model negative_gpu specifies invalid or unsupported gpu id -1. GPUs with at least the "
                     "minimum required CUDA compute compatibility"),
    "ensemble_scheduling_set": ("max_batch_size: 8\n" + ENSEMBLE_STEP.split("\n", 1)[1] + DATA,
                                "ensemble scheduling cannot be set for model 'ensemble_scheduling_set' whose platform is not ensemble"),
}

# (upstream folder, model directory, config text, facts beyond the directory, Triton's words; None: Triton loads it)
CASES: list[tuple[str, str, str, dict, str | None]] = [
    *[(f"noautofill_platform/{case} [{trial}]", case, f'name: "{case}"\nplatform: "{trial}"\n{text}', {"gpu_count": 1}, words)
      for case, (text, words) in NOAUTOFILL.items() for trial in TRIALS],
    # special_cases/invalid_platform (run with --disable-auto-complete-config: the file name still names the backend)
    ("special_cases/invalid_platform", "invalid_platform",
     'name: "invalid_platform"\nplatform: "onnxruntim"\ndefault_model_filename: "model.onnx"\nmax_batch_size: 8\n' + TRT_IO.split("\n", 2)[2],
     {}, "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime"),
    # custom_parameters/tensorrt/{invalid,valid}/*: qa_model_repository's plan_float32_float32_float32 config + partial.pbtxt
    ("custom_parameters/tensorrt/invalid/allocation_strategy_invalid_value", "allocation_strategy_invalid_value",
     'name: "allocation_strategy_invalid_value"\n' + TRT_IO + 'parameters: { key: "execution_context_allocation_strategy" value: { string_value: "UNKNOWN" } }',
     {}, "Invalid value for 'execution_context_allocation_strategy': 'UNKNOWN' for model instance 'allocation_strategy_invalid_value'"),
    *[(f"custom_parameters/tensorrt/valid/allocation_strategy_value_{i}", f"allocation_strategy_value_{i}",
       f'name: "allocation_strategy_value_{i}"\n' + TRT_IO + f'parameters: {{ key: "execution_context_allocation_strategy" value: {{ string_value: "{v}" }} }}',
       {}, None) for i, v in ((1, "STATIC"), (2, "ON_PROFILE_CHANGE"))],
    # autofill_noplatform/onnx/*: the name and platform are what Triton fills in; the graph is the folder's 1/model.onnx
    ("autofill_noplatform/onnx/unknown_input", "unknown_input",
     'name: "unknown_input"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 1\n' + ONNX_IO.replace('"INPUT1"', '"INPUT_UNKNOWN"'), ONNX_GRAPH,
     "unexpected inference input 'INPUT_UNKNOWN', allowed inputs are: INPUT0, INPUT1"),
    ("autofill_noplatform/onnx/bad_output_dims", "bad_output_dims",
     'name: "bad_output_dims"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 1\n' + ONNX_IO.replace("TYPE_INT8 dims: [ 16 ] }]", "TYPE_INT8 dims: [ 1 ] }]"),
     ONNX_GRAPH, "model 'bad_output_dims', tensor 'OUTPUT1': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
     "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making complete "
     "shape [-1,1])"),
    # autofill_noplatform/ensemble/*: the model's name is not its folder's in the first two; Triton quotes the ensemble fault
    ("autofill_noplatform/ensemble/ensemble_scheduling_no_set", "ensemble_scheduling_no_set",
     'name: "ensemble_scheduling_not_set"\nmax_batch_size: 8\nplatform: "ensemble"\n' + DATA, {},
     "ensemble scheduling must be set for ensemble ensemble_scheduling_not_set whose platform is ensemble"),
    ("autofill_noplatform/ensemble/model_warm_up_set", "model_warm_up_set",
     'name: "model_warmup_set"\nmax_batch_size: 8\n' + ENSEMBLE_STEP + DATA + "model_warmup [{}]\n", {},
     "model_warmup can not be specified for ensemble 'model_warmup_set'"),
    ("autofill_noplatform/ensemble/has_backend", "has_backend",
     'name: "has_backend"\nmax_batch_size: 8\nbackend: "onnxruntime"\nplatform: "ensemble"\n' + DATA, {},
     "Ensemble model 'has_backend' must have platform type 'ensemble' and empty backend type"),
    # autofill_noplatform_success/*/expected: configs as Triton completed and loaded them (CUDA_VISIBLE_DEVICES=0)
    ("autofill_noplatform_success/onnx/cpu_instance", "cpu_instance",
     'name: "cpu_instance"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput { name: "INPUT0" data_type: TYPE_FP16 dims: -1 dims: -1 }\n'
     'output { name: "OUTPUT0" data_type: TYPE_FP16 dims: -1 dims: -1 }\ninstance_group { name: "cpu_instance" count: 2 kind: KIND_CPU }\n'
     'default_model_filename: "model.onnx"\nbackend: "onnxruntime"\n', {}, None),
    ("autofill_noplatform_success/tensorrt/no_config_shape_tensor", "no_config_shape_tensor",
     'name: "no_config_shape_tensor"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'
     'input { name: "INPUT0" data_type: TYPE_INT32 dims: 2 is_shape_tensor: true }\ninput { name: "DUMMY_INPUT0" data_type: TYPE_FP32 dims: -1 dims: -1 }\n'
     'output { name: "DUMMY_OUTPUT0" data_type: TYPE_FP32 dims: -1 dims: -1 }\noutput { name: "OUTPUT0" data_type: TYPE_INT64 dims: 2 is_shape_tensor: true }\n'
     'instance_group { name: "no_config_shape_tensor" count: 1 gpus: 0 kind: KIND_GPU }\ndefault_model_filename: "model.plan"\nbackend: "tensorrt"\n',
     {"gpu_count": 1}, None),
    ("autofill_noplatform_success/tensorrt/multi_prof_max_bs", "multi_prof_max_bs",
     'name: "multi_prof_max_bs"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\ninput { name: "INPUT0" data_type: TYPE_FP32 dims: -1 }\n'
     'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: -1 }\n'
     + "".join(f'instance_group {{ name: "multi_prof_max_bs_{i}" count: 1 gpus: 0 kind: KIND_GPU profile: "{i}" }}\n' for i in range(3))
     + 'backend: "tensorrt"\n', {"gpu_count": 1}, None),
    ("autofill_noplatform_success/pytorch/no_name_platform", "no_name_platform",
     'name: "no_name_platform"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\ninput { name: "INPUT__0" data_type: TYPE_INT32 dims: 16 }\n'
     'output { name: "OUTPUT__0" data_type: TYPE_INT32 dims: 16 }\ninstance_group { name: "no_name_platform" count: 1 gpus: 0 kind: KIND_GPU }\n'
     'backend: "pytorch"\n', {"gpu_count": 1}, None),
    ("autofill_noplatform_success/openvino/partial_config", "partial_config",
     'name: "partial_config"\nmax_batch_size: 8\ninput { name: "INPUT1" data_type: TYPE_INT8 dims: 16 }\n'
     'output { name: "OUTPUT0" data_type: TYPE_INT8 dims: 16 label_filename: "output0_labels.txt" }\n'
     'instance_group { name: "partial_config" count: 1 kind: KIND_CPU }\ndefault_model_filename: "model.xml"\nbackend: "openvino"\n', {}, None),
]


@pytest.mark.parametrize("case, directory, text, facts, words", CASES, ids=[c[0] for c in CASES])
def test_tritons_own_config_cases_get_tritons_verdict(case, directory, text, facts, words):
    config, facts = parse(text), ArtifactFacts(directory_name=directory, versions=(1,), **facts)
    found = violations(config, facts)
    if words is None:
        assert found == [], f"{case}: Triton loads it, we refuse: {found[0].message}"
        return
    assert found, f"{case}: Triton refuses it ({words}), our rules let it through"
    with pytest.raises(ConfigRuleError) as err:
        rules.check(config, facts)
    first = found[0].message
    assert first in words or words in first, f"{case}: Triton says {words!r}, we quote {first!r}"
    assert first in str(err.value)
