"""Stand-in for Triton's native openvino backend, run by the python backend ("Python-based backends").

The real C++ backend is not installable outside NVIDIA's container. Triton runs this file for every
model whose config says backend "openvino" when backends/openvino/ holds model.py and no
libtriton_openvino.so, so the UNCHANGED native config is served. It does what the native backend
(openvino_backend, src/openvino.cc) does, so a config that fails there fails here:
- reads model.xml, names inputs and outputs by get_any_name(), converts I/O to the config's dtypes;
- with max_batch_size > 0, fixes the batch dimension at max_batch_size (layout "N...", set_batch),
  runs all requests of one dynamic batch as one inference, and answers a total batch other than
  max_batch_size with the backend's error unless ENABLE_BATCH_PADDING is YES (then it pads);
- compiles on the CPU plugin with the typed parameters INFERENCE_NUM_THREADS,
  COMPILATION_NUM_THREADS, HINT_BF16, NUM_STREAMS and PERFORMANCE_HINT, and nothing else
  (no precision hint: OpenVINO's default, bf16 on CPUs that support it, as in the native backend);
- supports KIND_CPU instances only.
Numerics come from pip openvino, not from the container's build: results served by it are
labelled "stand-in backend".

Runs inside Triton's python stub (an isolated interpreter: only the venv's packages, no PYTHONPATH).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL_FILENAME = "model.xml"  # the python backend reports default_model_filename as model.py: never read that
DEVICE = "CPU"
_TRITON_TO_OV = {"TYPE_FP32": "f32", "TYPE_FP16": "f16", "TYPE_FP64": "f64", "TYPE_BF16": "bf16", "TYPE_INT64": "i64",
                 "TYPE_INT32": "i32", "TYPE_INT16": "i16", "TYPE_INT8": "i8", "TYPE_UINT8": "u8", "TYPE_BOOL": "boolean"}
_BOOL_PARAMETERS = ("SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING", "RESHAPE_IO_LAYERS")


def _parameters(cfg):
    return {key: (value or {}).get("string_value", "") for key, value in (cfg.get("parameters") or {}).items()}


def device_properties(params):
    """The native backend's typed parameters -> compile properties, with its validation and its error wording."""
    props = {}
    for key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS", "HINT_BF16", "NUM_STREAMS", "PERFORMANCE_HINT"):
        value = params.get(key, "").lower()
        if not value:
            continue
        if key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
            if not value.isdigit():
                raise ValueError(f"expected the parameter '{key}' to be a non-negative number, got {value}")
            props[key] = int(value)
        elif key == "HINT_BF16":
            if value != "yes":
                raise ValueError(f"expected the parameter '{key}' to be YES, got {value}")
            props["INFERENCE_PRECISION_HINT"] = "bf16"
        elif key == "NUM_STREAMS":
            if value not in ("auto", "numa") and not value.isdigit():
                raise ValueError(f"expected the parameter '{key}' to be either AUTO/NUMA/<int_value>, got {value}")
            props[key] = value.upper()
        else:
            if value not in ("latency", "throughput", "cumulative_throughput"):
                raise ValueError(f"expected the parameter '{key}' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got {value}")
            props[key] = value.upper()
    return props


def _model_path(args, cfg):
    name = cfg.get("default_model_filename") or MODEL_FILENAME
    if name.endswith(".py"):
        name = MODEL_FILENAME
    return os.path.join(args["model_repository"], args["model_version"], name)


def _dims(spec):
    reshape = spec.get("reshape")
    return [int(d) for d in (reshape["shape"] if reshape and "shape" in reshape else spec["dims"])]


class TritonPythonModel:
    def initialize(self, args):
        import openvino as ov
        from openvino.preprocess import PrePostProcessor

        cfg = json.loads(args["model_config"])
        self.name = args["model_name"]
        if args.get("model_instance_kind", "CPU") != "CPU":
            raise pb_utils.TritonModelException(f"unable to load model '{self.name}', Triton openVINO backend supports only CPU device")
        params = _parameters(cfg)
        self.flags = {key: params.get(key, "").lower() == "yes" for key in _BOOL_PARAMETERS}
        try:
            props = device_properties(params)
        except ValueError as err:
            raise pb_utils.TritonModelException(str(err)) from None
        self.max_batch_size = int(cfg.get("max_batch_size", 0))
        core = ov.Core()
        path = _model_path(args, cfg)
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(f"unable to find '{path}' for model '{self.name}'")
        model = core.read_model(path)
        inputs = {p.get_any_name(): p for p in model.inputs}
        outputs = {p.get_any_name(): p for p in model.outputs}
        if len(model.inputs) != len(cfg.get("input", [])):
            raise pb_utils.TritonModelException(
                f"unable to load model '{self.name}', configuration expects {len(cfg.get('input', []))} inputs, model provides {len(model.inputs)}")
        ppp = PrePostProcessor(model)
        for kind, specs, ports, side in (("input", cfg["input"], inputs, ppp.input), ("output", cfg["output"], outputs, ppp.output)):
            for spec in specs:
                name = spec["name"]
                if name not in ports:
                    raise pb_utils.TritonModelException(
                        f"unexpected inference {kind} '{name}', allowed {kind}s are: {', '.join(sorted(ports))}")
                if spec["data_type"] not in _TRITON_TO_OV:
                    raise pb_utils.TritonModelException(f"unsupported datatype {spec['data_type']} for {kind} '{name}' for model '{self.name}'")
                _check_dims(self.name, name, ports[name].get_partial_shape(), _dims(spec), self.max_batch_size)
                tensor = side(name).tensor().set_element_type(getattr(ov.Type, _TRITON_TO_OV[spec["data_type"]]))
                if kind == "input" and self.max_batch_size:
                    tensor.set_layout(ov.Layout("N..."))
        model = ppp.build()
        if self.max_batch_size:
            ov.set_batch(model, self.max_batch_size)  # as the native backend: the batch is fixed at max_batch_size
        core.set_property(DEVICE, props)
        auto_batching = bool(self.max_batch_size) and not self.flags["SKIP_OV_DYNAMIC_BATCHSIZE"]
        self.compiled = core.compile_model(model, DEVICE, {"ALLOW_AUTO_BATCHING": auto_batching})
        self.request = self.compiled.create_infer_request()
        self.inputs = [spec["name"] for spec in cfg["input"]]
        self.outputs = [(spec["name"], pb_utils.triton_string_to_numpy(spec["data_type"])) for spec in cfg["output"]]
        self.ports = [self.compiled.output(name) for name, _ in self.outputs]
        pb_utils.Logger.log_info(
            f"stand-in openvino backend: {path} openvino {ov.__version__} properties {props} "
            f"precision {self.compiled.get_property('INFERENCE_PRECISION_HINT')} max_batch_size {self.max_batch_size} "
            f"batch padding {'on' if self.flags['ENABLE_BATCH_PADDING'] else 'off'}"
        )

    def execute(self, requests):
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        try:
            results = self.run_requests(feeds)
        except Exception as err:  # one bad batch fails its requests, not the model
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err))) for _ in requests]
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(n, np.ascontiguousarray(v).astype(dt, copy=False)) for (n, dt), v in zip(self.outputs, outs)])
            for outs in results
        ]

    def run_requests(self, feeds):
        """The outputs of each request's feed; one inference per execute when batching, as the native backend."""
        if not self.max_batch_size:
            return [self._infer(feed) for feed in feeds]
        sizes = [feed[self.inputs[0]].shape[0] for feed in feeds]
        total = sum(sizes)
        if total > self.max_batch_size:
            raise ValueError(f"batch size {total} for '{self.name}', max allowed is {self.max_batch_size}")
        pad = self.max_batch_size - total
        if pad and not self.flags["ENABLE_BATCH_PADDING"]:
            raise ValueError(
                f"expected requests with batch size '{self.max_batch_size}', got '{total}'... this error can be avoided by "
                "setting 'ENABLE_BATCH_PADDING' parameter in model configuration to 'YES' at a performance cost.")
        merged = {}
        for name in self.inputs:
            parts = [feed[name] for feed in feeds]
            if pad:
                parts.append(np.zeros((pad, *parts[0].shape[1:]), dtype=parts[0].dtype))
            merged[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        outs = self._infer(merged)
        results, start = [], 0
        for size in sizes:
            results.append([o[start:start + size] for o in outs])
            start += size
        return results

    def _infer(self, feed):
        result = self.request.infer(feed)
        return [result[port] for port in self.ports]


def _check_dims(model, tensor, shape, dims, max_batch_size):
    """The model's shape must be able to take the config's dims (plus the batch axis when batching)."""
    want = ([-1] if max_batch_size else []) + dims
    have = [d.get_length() if d.is_static else -1 for d in shape] if shape.rank.is_static else None
    if have is None:
        return
    mismatch = len(have) != len(want) or any(h >= 0 and w >= 0 and h != w for h, w in zip(have[1:] if max_batch_size else have, dims))
    if mismatch:
        raise pb_utils.TritonModelException(
            f"model '{model}', tensor '{tensor}': the model expects {len(have)} dimensions (shape {have}) "
            f"but the model configuration specifies {len(want)} dimensions (shape {want})")
