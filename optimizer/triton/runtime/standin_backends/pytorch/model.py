"""Stand-in for Triton's native pytorch (libtorch) backend, run by the python backend ("Python-based backends").

The real C++ backend is not installable outside NVIDIA's container. Triton runs this file for every
model whose config resolves to backend "pytorch" (platform "pytorch_libtorch") when backends/pytorch/
holds model.py and no libtriton_pytorch.so, so the UNCHANGED native config is served. Like the
native backend it loads the TorchScript model.pt (or, for a torch_aoti model served locally through
triton/runtime/local_serving.py, the AOTInductor model.pt2), feeds inputs by forward() argument name or by the
`<name>__<index>` convention (else in config order), maps outputs `<name>__<index>` to the returned
tuple, runs one dynamic batch as one call and honours INFERENCE_MODE, DISABLE_OPTIMIZED_EXECUTION and
the thread-count parameters. Numerics come from pip torch, not from libtorch in Triton: results
served by it are labelled "stand-in backend".

Runs inside Triton's python stub (an isolated interpreter: only the venv's packages, no PYTHONPATH).
"""

import json
import os
import re

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL_FILENAME = "model.pt"  # the python backend reports default_model_filename as model.py: never read it
AOTI_FILENAME = "model.pt2"
_INDEXED = re.compile(r"^.+__(\d+)$")


def _parameter(cfg, key, default=None):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _model_path(args, cfg):
    version_dir = os.path.join(args["model_repository"], args["model_version"])
    name = cfg.get("default_model_filename") or MODEL_FILENAME
    if name.endswith(".py"):  # not ours: the native default, else the AOTInductor package when only that is there
        name = MODEL_FILENAME if os.path.exists(os.path.join(version_dir, MODEL_FILENAME)) else AOTI_FILENAME
        name = name if os.path.exists(os.path.join(version_dir, name)) else MODEL_FILENAME
    return os.path.join(version_dir, name)


def _positions(names, argument_names):
    """Where each config tensor goes: by forward() argument name, by the __<index> suffix, else config order."""
    if argument_names and all(n in argument_names for n in names):
        return [argument_names.index(n) for n in names]
    indexed = [_INDEXED.match(n) for n in names]
    if all(indexed):
        return [int(m.group(1)) for m in indexed]
    return list(range(len(names)))


class TritonPythonModel:
    def initialize(self, args):
        import torch

        cfg = json.loads(args["model_config"])
        intra = int(_parameter(cfg, "INTRA_OP_THREAD_COUNT", 0))
        inter = int(_parameter(cfg, "INTER_OP_THREAD_COUNT", 0))
        if intra > 0:
            torch.set_num_threads(intra)
        if inter > 0:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError:  # only allowed before the first inter-op parallel work
                pass
        if _parameter(cfg, "DISABLE_OPTIMIZED_EXECUTION", "false").lower() == "true":
            torch._C._set_graph_executor_optimize(False)
        self.inference_mode = _parameter(cfg, "INFERENCE_MODE", "true").lower() == "true"
        path = _model_path(args, cfg)
        if path.endswith(".pt2"):  # an AOTInductor package (platform torch_aoti): tensors go by position, INPUT__<i>
            from torch._inductor import aoti_load_package

            self.model = aoti_load_package(path)
            arguments = []
        else:
            self.model = torch.jit.load(path, map_location="cpu").eval()
            try:
                arguments = [a.name for a in self.model.forward.schema.arguments][1:]  # drop self
            except (AttributeError, RuntimeError):
                arguments = []
        self.batching = cfg.get("max_batch_size", 0) > 0
        self.inputs = [i["name"] for i in cfg["input"]]
        self.input_positions = _positions(self.inputs, arguments)
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in cfg["output"]]
        self.output_positions = _positions([n for n, _ in self.outputs], [])
        pb_utils.Logger.log_info(
            f"stand-in pytorch backend: {path} torch {torch.__version__} threads={torch.get_num_threads()} "
            f"inference_mode={self.inference_mode}"
        )

    def execute(self, requests):
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        try:
            results = _run_batched(self._run, feeds, self.batching)
        except Exception as err:  # one bad batch fails its requests, not the model
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(f"pytorch stand-in: {err}")) for _ in requests]
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(n, np.ascontiguousarray(v).astype(dt, copy=False)) for (n, dt), v in zip(self.outputs, outs)])
            for outs in results
        ]

    def _run(self, feed):
        import torch

        args = [None] * len(self.inputs)
        for name, position in zip(self.inputs, self.input_positions):
            args[position] = torch.from_numpy(np.ascontiguousarray(feed[name]))
        with torch.inference_mode() if self.inference_mode else torch.no_grad():
            result = self.model(*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        result = list(result)
        return [result[p].detach().cpu().numpy() for p in self.output_positions]


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
