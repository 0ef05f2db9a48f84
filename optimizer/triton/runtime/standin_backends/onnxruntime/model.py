"""Stand-in for Triton's native onnxruntime backend, run by the python backend ("Python-based backends").

The real C++ backend is not installable outside NVIDIA's container. Triton runs this file for every
model whose config resolves to backend "onnxruntime" (platform "onnxruntime_onnx") when
backends/onnxruntime/ holds model.py and no libtriton_onnxruntime.so, so the UNCHANGED native config
is served. Like the native backend it runs the requests of one dynamic batch as one session call and
honours the config's thread and graph-level settings. Numerics come from pip onnxruntime, not from
the C++ backend: results served by it are labelled "stand-in backend".

Runs inside Triton's python stub (an isolated interpreter: only the venv's packages, no PYTHONPATH).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL_FILENAME = "model.onnx"  # the python backend reports default_model_filename as model.py: never read it
DEFAULT_MAX_BATCH_SIZE = 4  # the native backend's --backend-config=onnxruntime,default-max-batch-size default
_ORT_TO_TRITON = {"tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64", "tensor(float16)": "TYPE_FP16",
                  "tensor(int64)": "TYPE_INT64", "tensor(int32)": "TYPE_INT32", "tensor(int16)": "TYPE_INT16",
                  "tensor(int8)": "TYPE_INT8", "tensor(uint8)": "TYPE_UINT8", "tensor(uint16)": "TYPE_UINT16",
                  "tensor(uint32)": "TYPE_UINT32", "tensor(uint64)": "TYPE_UINT64", "tensor(bool)": "TYPE_BOOL",
                  "tensor(string)": "TYPE_STRING"}
# Triton's onnxruntime backend: optimization.graph.level unset/0 = all, -1 = basic, 1 = extended, 2 = none
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}


def _version_dir_from_cmdline():
    # auto_complete_config gets no paths; the stub runs as: triton_python_backend_stub <model>/<version>/model.py ...
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    return os.path.dirname(argv[1].decode())


def _parameter(cfg, key, default=None):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _model_path(args, cfg):
    name = cfg.get("default_model_filename") or MODEL_FILENAME
    if name.endswith(".py"):
        name = MODEL_FILENAME
    return os.path.join(args["model_repository"], args["model_version"], name)


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """The native backend's auto-complete: nothing when the config has inputs and outputs; else the max batch first
        (DEFAULT_MAX_BATCH_SIZE and a dynamic batcher when every tensor's first axis is variable and none was set), then
        the missing tensors, a scalar as dims [1] (with an empty reshape when the model batches)."""
        cfg = auto_complete_model_config.as_dict()
        if cfg.get("input") and cfg.get("output"):
            return auto_complete_model_config
        import onnxruntime as ort

        sess = ort.InferenceSession(os.path.join(_version_dir_from_cmdline(), MODEL_FILENAME), providers=["CPUExecutionProvider"])
        tensors = [*sess.get_inputs(), *sess.get_outputs()]
        max_batch = int(cfg.get("max_batch_size", 0) or 0)
        if all(t.shape and not isinstance(t.shape[0], int) for t in tensors):
            if max_batch == 0:
                max_batch = DEFAULT_MAX_BATCH_SIZE
                auto_complete_model_config.set_max_batch_size(max_batch)
                pb_utils.Logger.log_warn(f"autofilled max_batch_size to {max_batch} for model '{cfg.get('name')}' since batching is "
                                         "supported but no max_batch_size is specified in model configuration")
            if max_batch > 1 and not cfg.get("sequence_batching") and not cfg.get("dynamic_batching"):
                auto_complete_model_config.set_dynamic_batching()
        elif max_batch != 0:
            raise pb_utils.TritonModelException(f"autofill failed for model '{cfg.get('name')}': model does not support batching "
                                                "while non-zero max_batch_size is specified")

        def tensor(t):
            d = [x if isinstance(x, int) else -1 for x in t.shape][1 if max_batch > 0 else 0:]
            spec = {"name": t.name, "data_type": _ORT_TO_TRITON[t.type], "dims": d or [1]}
            if not d and max_batch > 0:
                spec["reshape"] = {"shape": []}
            return spec

        if not cfg.get("input"):
            for i in sess.get_inputs():
                auto_complete_model_config.add_input(tensor(i))
        if not cfg.get("output"):
            for o in sess.get_outputs():
                auto_complete_model_config.add_output(tensor(o))
        return auto_complete_model_config

    def initialize(self, args):
        import onnxruntime as ort

        cfg = json.loads(args["model_config"])
        opts = ort.SessionOptions()
        intra = int(_parameter(cfg, "intra_op_thread_count", 0))
        inter = int(_parameter(cfg, "inter_op_thread_count", 0))
        if intra > 0:
            opts.intra_op_num_threads = intra
        if inter > 0:
            opts.inter_op_num_threads = inter
        if _parameter(cfg, "execution_mode", "0") == "1":
            opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        level = int(cfg.get("optimization", {}).get("graph", {}).get("level", 0) or 0)
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _GRAPH_LEVELS.get(level, "ORT_ENABLE_ALL"))
        self.session = ort.InferenceSession(_model_path(args, cfg), opts, providers=["CPUExecutionProvider"])
        self.batching = cfg.get("max_batch_size", 0) > 0
        # overridable initializers (graph inputs with a default) can be request inputs, as in the native backend
        _check_io(args["model_name"], cfg, [*self.session.get_inputs(), *self.session.get_overridable_initializers()], "input", self.batching)
        _check_io(args["model_name"], cfg, self.session.get_outputs(), "output", self.batching)
        self.inputs = [i["name"] for i in cfg["input"]]
        self.optional = {i["name"] for i in cfg["input"] if i.get("optional")}
        specs = {o["name"]: o for o in cfg["output"]}
        self.scalars = {t.name: _config_dims(specs[t.name]) or [1] for t in self.session.get_outputs() if not t.shape and t.name in specs}
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in cfg["output"]]
        pb_utils.Logger.log_info(
            f"stand-in onnxruntime backend: {_model_path(args, cfg)} onnxruntime {ort.__version__} "
            f"intra_op_threads={intra or 'default'} inter_op_threads={inter or 'default'}"
        )

    def execute(self, requests):
        feeds = [self._feed(r) for r in requests]
        try:
            results = _run_batched(self._run, feeds, self.batching)
        except Exception as err:  # one bad batch fails its requests, not the model
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime stand-in: {err}")) for _ in requests]
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(n, _text_out(np.ascontiguousarray(v).astype(dt, copy=False))) for (n, dt), v in zip(self.outputs, outs)])
            for outs in results
        ]

    def _feed(self, request):
        """The request's inputs by name; an optional input it leaves out is left to the graph's default."""
        feed = {}
        for n in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, n)
            if tensor is None and n in self.optional:
                continue
            feed[n] = _text_in(tensor.as_numpy())
        return feed

    def _run(self, feed):
        outs = self.session.run([n for n, _ in self.outputs], feed)
        # a scalar model output answers in the config's dims (all 1), as the native backend does
        return [np.reshape(v, self.scalars[n]) if n in self.scalars else v for (n, _), v in zip(self.outputs, outs)]


def _text_in(array):
    """A TYPE_STRING input arrives as an object array of bytes; ORT's string tensors take str (bytes would be stored as
    their repr, "b'...'"), where the native backend hands ORT the bytes themselves: UTF-8 text passes unchanged."""
    if array.dtype != np.object_ or not array.size:
        return array
    return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)


def _text_out(array):
    """ORT answers a string tensor with str objects; Triton's BYTES are bytes."""
    if array.dtype != np.object_ or not array.size:
        return array
    return np.vectorize(lambda v: v.encode("utf-8") if isinstance(v, str) else v, otypes=[object])(array)


def _config_dims(spec):
    """A config tensor's shape as the model sees it: its reshape when it has one, else its dims (no batch axis)."""
    return [int(d) for d in (spec.get("reshape", {}) or {}).get("shape", spec["dims"])]


def _check_io(model, cfg, model_tensors, kind, batching):
    """Refuse to load a config the model contradicts, as the native backend does: names, dtypes, rank, fixed dims."""
    have = {t.name: t for t in model_tensors}
    for spec in cfg.get(kind, []):
        name = spec["name"]
        if spec.get("optional") and batching:
            raise pb_utils.TritonModelException(
                f"unable to load model '{model}', optional input '{name}' is not supported for models that support batching")
        if name not in have:
            raise pb_utils.TritonModelException(
                f"unexpected inference {kind} '{name}', allowed {kind}s are: {', '.join(sorted(have))}")
        tensor = have[name]
        wanted = _ORT_TO_TRITON.get(tensor.type, tensor.type)
        if spec["data_type"] != wanted:
            raise pb_utils.TritonModelException(
                f"unable to load model '{model}', configuration expects datatype {spec['data_type']} for {kind} '{name}', model provides {wanted}")
        model_shape = [d if isinstance(d, int) else -1 for d in tensor.shape]
        dims = _config_dims(spec)
        if not model_shape:  # a scalar in the model: the config may only say 1s
            if any(d != 1 for d in dims):
                raise pb_utils.TritonModelException(
                    f"unable to load model '{model}', scalar tensor '{name}', should only provide 1 in the model configuration when the "
                    f"model doesn't support batching. Model configuration provided: {dims}.")
            continue
        config_shape = ([-1] if batching else []) + dims
        if batching and (not model_shape or model_shape[0] != -1):
            raise pb_utils.TritonModelException(
                f"model '{model}', tensor '{name}': for the model to support batching the shape should have at least 1 dimension "
                f"and the first dimension must be variable-size, but the model provides shape {model_shape}")
        mismatch = len(model_shape) != len(config_shape) or any(
            m >= 0 and c >= 0 and m != c for m, c in zip(model_shape, config_shape))
        if mismatch:
            how = ("an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making complete shape"
                   if batching else "shape")
            raise pb_utils.TritonModelException(
                f"model '{model}', tensor '{name}': the model expects {len(model_shape)} dimensions (shape {model_shape}) "
                f"but the model configuration specifies {len(config_shape)} dimensions ({how} {config_shape})")


def _run_batched(run, feeds, batching):
    """Run the requests Triton's dynamic batcher gathered as one call, as the native backend does, and split the outputs."""
    if not batching or len(feeds) == 1:
        return [run(f) for f in feeds]
    groups = {}
    for i, feed in enumerate(feeds):  # only requests with the same per-sample shapes can be concatenated
        key = tuple((n, a.shape[1:]) for n, a in sorted(feed.items()))
        groups.setdefault(key, []).append(i)
    results = [None] * len(feeds)
    for members in groups.values():
        sizes = [next(iter(feeds[i].values())).shape[0] for i in members]
        merged = {n: np.concatenate([feeds[i][n] for i in members]) for n in feeds[members[0]]}
        outs = run(merged)
        start = 0
        for i, size in zip(members, sizes):
            results[i] = [o[start:start + size] for o in outs]
            start += size
    return results
