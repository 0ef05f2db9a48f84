"""Out-of-memory during the max-batch search, on the CPU and on a GPU: recognize it and start each probe clean.

A probe that does not fit must read as "this batch does not fit" (the search then refines below it),
never as a broken candidate. Every runtime says it differently: Python's MemoryError, torch's
`torch.cuda.OutOfMemoryError` and CPU allocator message, ONNX Runtime's `Fail` (not a RuntimeError)
from its arena, cuDNN/cuBLAS allocation statuses, and Polygraphy's "CUDA Error: 2"
(cudaErrorMemoryAllocation) from the TensorRT runner. Between probes the caching allocators are
emptied, so a probe is not refused for memory an earlier, larger one left cached.
"""

from __future__ import annotations

import gc
import re
import sys

from optimizer.vocab import Device

_MARKERS = (
    "out of memory",  # torch CUDA, CUDA runtime ("CUDA error: out of memory"), TensorRT's log
    "allocate",  # torch CPU allocator, ONNX Runtime's arena, OpenVINO
    "bad_alloc",
    "cannot allocate",
    "alloc_failed",  # CUDNN_STATUS_ALLOC_FAILED, CUBLAS_STATUS_ALLOC_FAILED
    "cudaerrormemoryallocation",
)
_POLYGRAPHY_CUDA_OOM = re.compile(r"CUDA Error: 2\b")


def is_allocation_failure(err: BaseException) -> bool:
    """True when `err` (or an exception it was raised from) says an allocation failed."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, MemoryError) or _is_torch_oom(err):
            return True
        text = str(err)
        if _POLYGRAPHY_CUDA_OOM.search(text) or any(k in text.lower() for k in _MARKERS):
            return True
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return False


def _is_torch_oom(err: BaseException) -> bool:
    torch = sys.modules.get("torch")  # never import torch just to ask
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return isinstance(oom, type) and isinstance(err, oom)


def release_device_memory(device: str) -> None:
    """Drop garbage and, on a GPU, hand torch's cached blocks back to the driver (before each probe)."""
    gc.collect()
    if not Device.of(device).is_cuda:
        return
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
