"""OpenVINO (Triton backend `openvino`, model.xml + model.bin): the dynamo ONNX export read and saved as FP32 IR.

The runner compiles with exactly the properties the published config carries, so what is checked
and measured here is what Triton's openvino backend will run. That includes OpenVINO's default
inference precision: bf16 on CPUs that support it. The backend has no parameter to ask for f32,
so this runner does not ask for it either, and the correctness check sees the bf16 error.

At --precision bf16 the config carries the backend's HINT_BF16 parameter (INFERENCE_PRECISION_HINT
bf16 here); at int8 the IR is quantized post-training by NNCF (`nncf.quantize`, static, calibrated on
the run's real feeds), and the CPU plugin runs its INT8 kernels as the native backend does.
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
from optimizer.errors import BackendError
from optimizer.machine import cpu_cores, native_bf16
from optimizer.model.samples import Feed, ShapePoint, generate_feed, load_feeds
from optimizer.model.signature import Signature
from optimizer.records.artifact import Artifact

if TYPE_CHECKING:
    from optimizer.model.loaded_model import LoadedModel

log = logging.getLogger(__name__)

PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT")
"""PERFORMANCE_HINT values both OpenVINO and Triton's openvino backend accept (the backend also takes CUMULATIVE_THROUGHPUT, for multi-device)."""

DEVICE = "CPU"
"""Triton's openvino backend runs on the CPU plugin only (instance kind KIND_CPU)."""

def runtime_properties(performance_hint: str) -> dict[str, str]:
    """compile_model properties, spelled as Triton's openvino backend parameters (the config carries the same dict).

    One stream and the LATENCY hint match how a Triton instance calls the model: one synchronous
    request at a time; more streams would only idle. Threads are the cores this process may use.
    """
    return {"INFERENCE_NUM_THREADS": str(cpu_cores()), "NUM_STREAMS": "1", "PERFORMANCE_HINT": performance_hint}


class OpenVinoBackend(Backend):
    """Exports ONNX (or takes an ONNX source), converts it to OpenVINO IR (FP32 weights, or NNCF INT8) and runs it on the CPU plugin."""

    name = "openvino"
    triton_platform = "openvino"
    devices = frozenset({"cpu"})
    consumes = frozenset({"torch", "onnx"})
    distributed_ok = False
    workflow = frozenset({"aot", "jit"})
    default_settings = {"opset": DEFAULT_OPSET, "performance_hint": "LATENCY"}
    precisions = MappingProxyType({"cpu": frozenset({"fp32", "bf16", "int8"})})
    computes_bf16_by_default = True

    def properties(self) -> dict[str, str]:
        """compile_model properties of this backend's settings (= the Triton config's parameters, less batch padding)."""
        props = runtime_properties(self.settings["performance_hint"])
        if self.settings["precision"] == "bf16":
            props["INFERENCE_PRECISION_HINT"] = "bf16"  # what the backend's HINT_BF16=YES sets
        return props

    def _availability(self, device: str) -> Availability:
        try:
            import openvino as ov
        except Exception as err:  # installed is not the same as importable
            return Availability(False, f"openvino cannot be imported: {err}")
        if self.settings["precision"] == "int8":
            try:
                import nncf  # noqa: F401
            except Exception as err:
                return Availability(False, f"INT8 needs NNCF, which cannot be imported: {err} (pip install 'aitune-export[openvino]').")
        if self.settings["performance_hint"] not in PERFORMANCE_HINTS:
            return Availability(False, f"performance_hint {self.settings['performance_hint']!r} is not one of {', '.join(PERFORMANCE_HINTS)}.")
        have = ov.Core().available_devices
        return Availability(DEVICE in have, "" if DEVICE in have else f"OpenVINO has no CPU plugin here (has: {', '.join(have) or 'none'}).")

    def build(self, model: LoadedModel, signature: Signature, workdir: Path, batch_range: tuple[int, int], device: str) -> Artifact:
        import openvino as ov

        workdir.mkdir(parents=True, exist_ok=True)
        onnx_dir = workdir / "onnx"  # intermediate, removed once the IR is written
        meta = export_onnx(model, signature, onnx_dir / "model.onnx", batch_range[1], self.settings["opset"])
        core = ov.Core()
        try:
            ir = core.read_model(str(onnx_dir / "model.onnx"))
        except Exception as err:
            raise BackendError(f"OpenVINO could not read the exported ONNX: {_first_line(err)}") from err
        _name_tensors(ir, signature)
        _check_dynamic_axes(ir, signature)
        wanted = self.settings["precision"]
        quantized = {}
        if wanted == "int8":
            ir, quantized = _quantize_nncf(ir, self.settings["calibration"])
        xml = workdir / "model.xml"
        ov.save_model(ir, str(xml), compress_to_fp16=False)  # the default FP16 weight compression breaks FP32 parity
        shutil.rmtree(onnx_dir, ignore_errors=True)
        precision = _precision_name(core.compile_model(str(xml), DEVICE, self.properties()).get_property("INFERENCE_PRECISION_HINT"))
        note = ""
        # bf16 on this CPU after a short shape returns NaN for a long one (OpenVINO 2026.2/2026.4); longest first is fine:
        # the runner and the published config (model_warmup) run the max shape before anything else
        warmup = {"warmup": "max_shape"} if wanted != "fp32" and precision == "bf16" and signature.is_dynamic else {}
        if wanted == "bf16" and not native_bf16():
            note = "bf16 is emulated on this CPU (no AVX512-BF16 or AMX): expect it to be slower than fp32"
        elif wanted == "fp32" and precision != "f32":
            note = (f"OpenVINO computes in {precision} on this CPU (its default where the CPU supports {precision}); "
                    f"Triton's openvino backend has no parameter to request f32, so the check runs in {precision} too")
            log.warning("%s | %s", self.name, note)
        return Artifact(
            backend=self.name,
            device=device,
            directory=str(workdir),
            files=["model.xml", "model.bin"],  # model.xml first: publish names files[0] after the platform's model file
            signature=signature.to_json(),
            triton_platform=self.triton_platform,
            metadata={
                "exporter": f"{meta['exporter']} + openvino.save_model(compress_to_fp16=False)",
                "opset": meta["opset"],
                "weights": "int8" if wanted == "int8" else "f32",
                **({"precision": wanted} if wanted != "fp32" else {}),
                "inference_precision": precision,
                **quantized,
                **warmup,
                "numerics_note": note,
                "runtime_properties": self.properties(),
                **self.versions(),
            },
            batch_range=batch_range,
        )

    def load(self, artifact: Artifact, device: str, model: LoadedModel | None = None) -> Runner:
        return OpenVinoRunner(artifact, self.properties(), warm_max_shape=artifact.metadata.get("warmup") == "max_shape")

    def triton_settings(self, artifact: Artifact) -> dict[str, Any]:
        params = runtime_properties(self.settings["performance_hint"])
        if self.settings["precision"] == "bf16":
            params["HINT_BF16"] = "YES"  # the backend's only precision parameter: INFERENCE_PRECISION_HINT bf16
        if Signature.from_json(artifact.signature).batching:
            # The backend fixes the batch dimension at max_batch_size (ov::set_batch) and rejects any other
            # total batch ("expected requests with batch size ...") unless it may pad the batch.
            params["ENABLE_BATCH_PADDING"] = "YES"
        return {"parameters": params}

    def versions(self) -> dict[str, str]:
        import openvino as ov

        return {"openvino": ov.__version__.split("-")[0]}


class OpenVinoRunner(Runner):
    """One compiled model and one infer request, with the properties the Triton config carries."""

    def __init__(self, artifact: Artifact, properties: dict[str, str], warm_max_shape: bool = False) -> None:
        super().__init__(Signature.from_json(artifact.signature))
        self._warm_max_shape = warm_max_shape  # as the published config's model_warmup: the max shape runs first
        self._path = artifact.path
        self._properties = properties
        self._compiled: Any = None
        self._request: Any = None
        self._outputs: list[Any] = []

    def _activate(self) -> None:
        import openvino as ov

        try:
            self._compiled = ov.Core().compile_model(str(self._path), DEVICE, self._properties)
        except Exception as err:
            raise BackendError(f"OpenVINO could not compile {self._path.name}: {_first_line(err)}") from err
        self._request = self._compiled.create_infer_request()
        self._outputs = [self._compiled.output(name) for name in self.signature.output_names]
        if self._warm_max_shape:
            self._request.infer(generate_feed(self.signature, ShapePoint(1 if self.signature.batching else 0, "max"), seed=11))

    def _deactivate(self) -> None:
        self._request = self._compiled = None
        self._outputs = []

    def _run(self, feed: Feed) -> list[np.ndarray]:
        result = self._request.infer(feed, share_inputs=True)  # outputs are copied (share_outputs=False)
        return [result[port] for port in self._outputs]


def _name_tensors(ir: Any, signature: Signature) -> None:
    """Give every IR input and output exactly its signature name (Triton's backend matches get_any_name())."""
    if len(ir.inputs) != len(signature.inputs) or len(ir.outputs) != len(signature.outputs):
        raise BackendError(
            f"the OpenVINO model has {len(ir.inputs)} inputs and {len(ir.outputs)} outputs, "
            f"the signature {len(signature.inputs)} and {len(signature.outputs)}."
        )
    for port, spec in zip(ir.inputs, signature.inputs):
        if spec.name not in port.get_names():
            raise BackendError(f"OpenVINO input {sorted(port.get_names())} is not {spec.name!r}; inputs must keep the forward() names.")
        port.get_tensor().set_names({spec.name})
    for port, spec in zip(ir.outputs, signature.outputs):
        port.get_tensor().set_names({spec.name})


def _check_dynamic_axes(ir: Any, signature: Signature) -> None:
    """Every axis the signature says varies (and the batch axis) must be dynamic in the IR: a baked size fails here, not in Triton."""
    offset = 1 if signature.batching else 0
    for port, spec in zip(ir.inputs, signature.inputs):
        shape = port.get_partial_shape()
        varying = ([0] if signature.batching else []) + [i + offset for i in spec.dynamic_axes]
        baked = [i for i in varying if i < len(shape) and shape[i].is_static]
        if baked:
            raise BackendError(f"OpenVINO input {spec.name!r} has shape {shape}; axes {baked} should be dynamic but are fixed.")


def _quantize_nncf(ir: Any, calibration: str) -> tuple[Any, dict[str, Any]]:
    """The IR quantized to INT8 by NNCF's post-training static quantization, calibrated on every real feed
    in `calibration`; transformers (a Softmax in the graph) get NNCF's transformer scheme."""
    import nncf

    feeds = load_feeds(Path(calibration))
    transformer = any(op.get_type_name() == "Softmax" for op in ir.get_ops())
    kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    try:
        quantized = nncf.quantize(ir, nncf.Dataset(feeds), subset_size=len(feeds), **kwargs)
    except Exception as err:
        raise BackendError(f"NNCF could not quantize the IR: {_first_line(err)}") from err
    return quantized, {"quantizer": f"nncf.quantize (static, {len(feeds)} calibration feeds{', transformer' if transformer else ''})",
                       "nncf": nncf.__version__}


def _precision_name(value: Any) -> str:
    """OpenVINO's element type as its short name ("f32", "bf16")."""
    return value.to_string() if hasattr(value, "to_string") else str(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    lines = [l for l in text.splitlines() if l.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}".rstrip(": ")
