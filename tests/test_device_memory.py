"""Out-of-memory during the batch search reads as "this batch does not fit" on the CPU and on a GPU alike,
and nothing else does."""

from __future__ import annotations

import pytest

from optimizer.errors import BackendError
from optimizer.task.device_memory import is_allocation_failure, release_device_memory


def test_torch_cuda_out_of_memory_is_an_allocation_failure():
    import torch

    err = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB")
    assert is_allocation_failure(err)


@pytest.mark.parametrize("message", [
    # Polygraphy's TrtRunner on cudaErrorMemoryAllocation
    "CUDA Error: 2. To figure out what this means, refer to https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html",
    # torch on the CPU
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 536870912 bytes.",
    # ONNX Runtime's CUDA and CPU arenas
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory ; GPU=0 ; hostname=x ; expr=cudaMalloc(&p, size);",
    "bfc_arena.cc:360 AllocateRawInternal Failed to allocate memory for requested buffer of size 536870912",
    # cuDNN / cuBLAS workspaces
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
])
def test_runtime_messages_of_a_failed_allocation(message):
    assert is_allocation_failure(RuntimeError(message))


def test_a_wrapped_oom_is_still_an_oom():
    try:
        try:
            raise RuntimeError("CUDA Error: 2. To figure out what this means ...")
        except RuntimeError as inner:
            raise BackendError("TensorRT inference failed: execute_async_v3() failed") from inner
    except BackendError as outer:
        assert is_allocation_failure(outer)


@pytest.mark.parametrize("message", [
    "CUDA Error: 700. an illegal memory access was encountered",
    "CUDA Error: 21",
    "input 'x' is float32[2, 3], the artifact expects float32 of rank 4",
    "execute_async_v3() failed. Please see the logging output above for details.",
])
def test_other_failures_are_not_memory(message):
    assert not is_allocation_failure(RuntimeError(message))


def test_releasing_memory_without_a_gpu_is_harmless():
    release_device_memory("cpu")
    release_device_memory("cuda:0")  # torch never initialized CUDA here: nothing to release, nothing raised
