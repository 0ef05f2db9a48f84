"""model_warmup: samples that match the inputs and the batch limit, and data files that hold a whole sample (Triton core)."""

from __future__ import annotations

from typing import Any

from optimizer.model.dtypes import triton_itemsize
from optimizer.triton.config.rules.base import CORE, OURS, WILDCARD, ArtifactFacts, RuleViolation, element_count, shape_text


def warmup(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """Core: warmup samples match the inputs' names, shapes, types and batch limit, and their data files exist."""
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
                                             f"Expected {shape_text(full + expected)}, got {shape_text(batch + got)}",
                                             f"warmup dims follow the config dims {shape_text(expected)} (not the reshape {shape_text(want)})"))
                if value.data_type != t.data_type:
                    dt = model_config_pb2.DataType.Name
                    out.append(RuleViolation("warmup", CORE, f"inference input '{key}' data-type is '{dt(value.data_type)[5:]}', but model "
                                             f"'{config.name}' expects '{dt(t.data_type)[5:]}'", "use the input's data_type"))
            else:
                out.append(RuleViolation("warmup", OURS, f"warmup '{w.name}' feeds '{key}', which is not an input of model '{config.name}'",
                                         f"the inputs are {', '.join(inputs)}"))
            if case == "input_data_file" and facts.warmup_files is not None:
                size = facts.warmup_files.get(value.input_data_file)
                need = element_count(value.dims) * _dtype_size(value.data_type)
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
