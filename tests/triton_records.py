"""Small TuneResult / Artifact records for the Triton tests: fake profiles, no tuning, no model building."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from optimizer.model.dtypes import dtype_from_name
from optimizer.model.samples import save_feeds
from optimizer.model.signature import Signature, TensorSpec, parse_axis
from optimizer.records.artifact import Artifact
from optimizer.records.candidate import Candidate
from optimizer.records.measurements import BatchProfile, MaxBatchDecision
from optimizer.records.reference_set import ReferenceSet
from optimizer.records.tune_result import TuneResult

BACKEND_OF = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "torchscript", "torch_aoti": "torch-aoti",
              "tensorrt_plan": "tensorrt", "openvino": "openvino"}
FILES_OF = {"onnxruntime_onnx": ["model.onnx"], "pytorch_libtorch": ["model.pt"], "torch_aoti": ["model.pt2"],
            "tensorrt_plan": ["model.plan"], "openvino": ["model.xml", "model.bin"]}


def tensor(name: str, dtype: str, dims: str) -> TensorSpec:
    """NAME, dtype name, per-sample dims like "3x64x64", "1-128" or "" (scalar)."""
    return TensorSpec(name, dtype_from_name(dtype), tuple(parse_axis(d) for d in dims.split("x")) if dims else ())


def profile(batch: int, p50_ms: float, throughput: float | None = None) -> BatchProfile:
    """A measured batch: p90/p95/p99 a little above p50, throughput batch / p50 unless given."""
    tp = throughput if throughput is not None else batch / (p50_ms / 1000)
    return BatchProfile(batch, p50_ms, p50_ms * 1.1, p50_ms * 1.2, p50_ms * 1.3, p50_ms, tp, 50, 3, True, 0.02, 0.0)


def decision(max_batch: int, knee: int, profiles: list[BatchProfile], decided_by: str = "saturation") -> MaxBatchDecision:
    """A search's result whose throughput peak (the preferred size) is `knee`."""
    best = max(profiles, key=lambda p: p.throughput).batch_size
    return MaxBatchDecision(profiles, max_batch, knee, best, decided_by, peak=knee, largest_fit=max_batch, search_stop=decided_by)


def write_onnx_interface(path: Path, sig: Signature, batch_dim: int | str = "batch") -> None:
    """An ONNX file that declares the signature's inputs and outputs (no nodes): all the config rules read."""
    import onnx
    from onnx import helper

    def value(t: TensorSpec):
        dims = [f"{t.name}_d{i}" if a.dynamic else a.min for i, a in enumerate(t.axes)]
        return helper.make_tensor_value_info(t.name, t.dtype.onnx_elem_type, ([batch_dim] if sig.batching else []) + dims)

    graph = helper.make_graph([], "interface", [value(t) for t in sig.inputs], [value(t) for t in sig.outputs])
    onnx.save(helper.make_model(graph), str(path))


DEFAULT_PROFILES = [profile(1, 1.0), profile(2, 1.2), profile(4, 1.6), profile(8, 3.0)]


def make_result(
    tmp: Path,
    platform: str = "onnxruntime_onnx",
    inputs: tuple[TensorSpec, ...] = (tensor("image", "float32", "3x8x8"),),
    outputs: tuple[TensorSpec, ...] = (tensor("output__0", "float32", "10"),),
    batching: bool = True,
    max_batch: int = 8,
    knee: int = 4,
    profiles: list[BatchProfile] | None = None,
    device: str = "cpu",
    triton_settings: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    latency_budget_ms: float | None = None,
    percentile: int = 95,
    files: list[str] | None = None,
    write_files: bool = True,
) -> TuneResult:
    """A finished run whose selected candidate is an artifact of `platform` with fake files under tmp/artifact."""
    sig = Signature(tuple(inputs), tuple(outputs), batching)
    art_dir = tmp / "artifact"
    files = files or FILES_OF[platform]
    if write_files:
        art_dir.mkdir(parents=True, exist_ok=True)
        for f in files:
            (art_dir / f).write_bytes(f"fake {f}".encode())
        if platform == "onnxruntime_onnx":
            write_onnx_interface(art_dir / files[0], sig)
    artifact = Artifact(BACKEND_OF[platform], device, str(art_dir), files, sig.to_json(), platform,
                        triton_settings=dict(triton_settings or {}), metadata=dict(metadata or {}))
    profs = profiles if profiles is not None else [p for p in DEFAULT_PROFILES if p.batch_size <= max(max_batch, 1)]
    dec = decision(max_batch if batching else 0, knee if batching else 1, profs)
    name = f"{BACKEND_OF[platform]}[{device}]"
    cand = Candidate(name, BACKEND_OF[platform], device, status="passed", artifact=artifact, decision=dec)
    ref_dir = tmp / "samples"
    ref_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    feed = {t.name: (rng.standard_normal(t.shape(1 if batching else None, "max")).astype(t.dtype.numpy) if t.dtype.is_float
                     else rng.integers(0, 5, size=t.shape(1 if batching else None, "max")).astype(t.dtype.numpy)) for t in inputs}
    save_feeds(ref_dir / "profile_feed.npz", [feed])
    ref = ReferenceSet(str(ref_dir / "samples.npz"), str(ref_dir / "reference_outputs.npz"), [], str(ref_dir / "profile_feed.npz"))
    return TuneResult("model", {"kind": "test"}, sig.to_json(), device, "max-throughput", "aot", [cand], None, name,
                      max_batch if batching else 0, "test", ref, latency_budget_ms=latency_budget_ms, percentile=percentile)
