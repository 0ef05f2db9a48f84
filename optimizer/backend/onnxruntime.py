"""ONNX Runtime (`onnxruntime_onnx`, model.onnx): dynamo export, CPU or CUDA execution provider.

At --precision int8 (CPU) the fp32 graph is quantized post-training by `onnxruntime.quantization.quantize_static`
in the QDQ format (per-channel INT8 weights, UINT8 activations), calibrated on the run's real feeds; ONNX Runtime,
in-process and in Triton's onnxruntime backend alike, fuses the QDQ pairs into INT8 kernels.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from optimizer.backend.base import Availability, Backend, Runner
from optimizer.backend.onnx_export import DEFAULT_OPSET, export_onnx
from optimizer.errors import BackendError, first_line
from optimizer.machine import cpu_cores
from optimizer.model.onnx_graph import onnx_io_names
from optimizer.model.samples import Feed
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel

log = logging.getLogger(__name__)

_PROVIDER_FOR = MappingProxyType({"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"})

# Triton's onnxruntime backend spells graph levels its own way (onnxruntime_backend README):
# unset = all optimizations, -1 = basic, 1 = basic + extended, 2 = none.
_TRITON_GRAPH_LEVEL = MappingProxyType({"all": None, "basic": -1, "extended": 1, "disabled": 2})


class OnnxRuntimeBackend(Backend):
    """Exports model.onnx (opset >= 18, dynamic axes kept dynamic) and runs it under ONNX Runtime."""

    name = "onnxruntime"
    triton_platform = "onnxruntime_onnx"
    devices = frozenset({"cpu", "cuda"})
    consumes = frozenset({"torch", "onnx"})
    distributed_ok = False
    workflow = frozenset({"aot", "jit"})
    default_settings = {"opset": DEFAULT_OPSET, "graph_level": "all"}
    precisions = MappingProxyType({"cpu": frozenset({"fp32", "int8"}), "cuda": frozenset({"fp32", "fp16"})})

    def _availability(self, device: str) -> Availability:
        try:
            import onnxruntime as ort
        except Exception as err:  # installed is not the same as importable
            return Availability(False, f"onnxruntime cannot be imported: {err}")
        if self.settings["graph_level"] not in _TRITON_GRAPH_LEVEL:
            return Availability(False, f"graph_level {self.settings['graph_level']!r} is not one of {', '.join(_TRITON_GRAPH_LEVEL)}.")
        wanted, have = _PROVIDER_FOR[Device.of(device).kind], ort.get_available_providers()
        ok = wanted in have
        fix = " (pip install onnxruntime-gpu in place of onnxruntime)" if Device.of(device).kind == "cuda" else ""
        return Availability(ok, "" if ok else f"{wanted} is not in this onnxruntime build (has: {', '.join(have)}){fix}.")

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        path = workdir / "model.onnx"
        if self.settings["precision"] == "int8":
            fp32 = workdir / "fp32" / "model.onnx"  # intermediate, removed once the QDQ model is written
            meta = export_onnx(model, signature, fp32, batch_range[1], self.settings["opset"])
            meta.update(quantize_qdq(fp32, path, self.settings["calibration"]), files=[path.name], precision="int8")
            shutil.rmtree(fp32.parent, ignore_errors=True)
        else:
            meta = export_onnx(model, signature, path, batch_range[1], self.settings["opset"], precision=self.settings["precision"])
        inputs, outputs = onnx_io_names(path)
        if inputs != signature.input_names or outputs != signature.output_names:
            raise BackendError(
                f"the exported graph names inputs {inputs} and outputs {outputs}, "
                f"expected {signature.input_names} and {signature.output_names}."
            )
        return Artifact(
            backend=self.name,
            device=device,
            directory=str(workdir),
            files=meta.pop("files"),
            signature=signature.to_json(),
            triton_platform=self.triton_platform,
            metadata={**meta, "graph_level": self.settings["graph_level"], "provider": _PROVIDER_FOR[Device.of(device).kind], **self.versions()},
            batch_range=batch_range,
        )

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        return OnnxRuntimeRunner(artifact, device, self.settings["graph_level"], self.providers(artifact, device))

    def providers(self, artifact: Artifact, device: str) -> list[Any]:
        """The session's execution providers, the one that must run the graph first."""
        return default_providers(device)

    def triton_settings(self, artifact: Artifact) -> dict[str, Any]:
        params = {"execution_mode": "0", "inter_op_thread_count": "1"}
        if Device.of(artifact.device).kind == "cpu":
            params["intra_op_thread_count"] = str(cpu_cores())
        return {"parameters": params, "graph_level": _TRITON_GRAPH_LEVEL[self.settings["graph_level"]]}

    def versions(self) -> dict[str, str]:
        import onnxruntime as ort

        return {"onnxruntime": ort.__version__}


def quantize_qdq(source: Path, target: Path, calibration: str) -> dict[str, Any]:
    """Write `target`: `source` quantized to INT8 QDQ by ONNX Runtime's static quantizer, calibrated (MinMax) on every
    real feed in `calibration`; the graph is shape-inferred first (quant_pre_process), as ONNX Runtime recommends."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from optimizer.model.samples import load_feeds

    feeds = load_feeds(Path(calibration))

    class Feeds(CalibrationDataReader):
        """The calibration feeds, one at a time."""

        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    prepared = source.with_name("prepared.onnx")
    try:
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    except Exception as err:  # the optimizer step fails on some graphs; quantize the export as it is
        log.info("quant_pre_process failed (%s); quantizing the exported graph as it is", first_line(err))
        prepared = source
    try:
        quantize_static(str(prepared), str(target), Feeds(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    except Exception as err:
        raise BackendError(f"onnxruntime.quantization could not quantize the graph: {first_line(err)}") from err
    return {"quantizer": f"onnxruntime.quantization.quantize_static (QDQ, per-channel, {len(feeds)} calibration feeds)"}


def default_providers(device: str) -> list[Any]:
    """CPU alone on a CPU device; CUDA (then CPU for the nodes CUDA lacks) on a GPU."""
    if Device.of(device).kind == "cpu":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"device_id": Device.of(device).cuda_index}), "CPUExecutionProvider"]


class OnnxRuntimeRunner(Runner):
    """One InferenceSession with the same threads and graph level that the Triton config will carry."""

    _LEVELS = MappingProxyType({"all": "ORT_ENABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "disabled": "ORT_DISABLE_ALL"})

    def __init__(self, artifact: Artifact, device: str, graph_level: str, providers: list[Any] | None = None) -> None:
        super().__init__(Signature.from_json(artifact.signature))
        self._path = artifact.path
        self._device = device
        self._graph_level = graph_level
        self._providers = providers or default_providers(device)
        self._session: Any = None

    def _activate(self) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self._LEVELS[self._graph_level])
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.inter_op_num_threads = 1
        if Device.of(self._device).kind == "cpu":
            opts.intra_op_num_threads = cpu_cores()
        try:
            self._session = ort.InferenceSession(str(self._path), opts, providers=self._providers)
        except Exception as err:
            raise BackendError(f"onnxruntime could not load {self._path.name}: {str(err).splitlines()[0]}") from err
        wanted = self._providers[0] if isinstance(self._providers[0], str) else self._providers[0][0]
        got = self._session.get_providers()
        if wanted not in got:
            # ONNX Runtime falls back to the next provider with only a warning; measuring that would misreport
            raise BackendError(f"onnxruntime did not enable {wanted} (the session runs on {', '.join(got)}); its libraries "
                               "(CUDA, cuDNN, TensorRT) must be loadable here; see the log for ONNX Runtime's warning.")
        self._outputs = self.signature.output_names

    def _deactivate(self) -> None:
        self._session = None

    def _run(self, feed: Feed) -> list[np.ndarray]:
        return self._session.run(self._outputs, feed)
