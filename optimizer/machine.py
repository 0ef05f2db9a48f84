"""Facts about the machine the run happens on, and the one cache root.

Measurements are only comparable on the same CPU model and core count, and every cache (builds,
measurements, the TensorRT timing cache, the local tritonserver's home) lives under one root that
`--cache-dir` or one environment variable moves.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Mapping

CACHE_DIR_ENV = "AITUNE_EXPORT_CACHE_DIR"
"""Moves the cache root when --cache-dir is not given (then $XDG_CACHE_HOME/aitune-export, then ~/.cache/aitune-export)."""

NGC_VERSION_VARIABLES = ("NVIDIA_PYTORCH_VERSION", "NVIDIA_TRITON_SERVER_VERSION", "TENSORRT_VERSION", "CUDA_VERSION", "PYTORCH_VERSION")
"""Set by NVIDIA's container images; recorded so a server image can refuse artifacts from another release."""


def available_cores() -> tuple[int, ...]:
    """The CPU cores this process may run on (the affinity mask, not the machine's total), in order."""
    return tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else tuple(range(os.cpu_count() or 1))


def cpu_cores() -> int:
    """How many CPU cores this process may run on: runtimes size their thread pools from this."""
    return len(available_cores())


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of CPUs that compute bf16 natively (AVX512-BF16, AMX); without them bf16 is emulated."""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware: --precision auto adds bf16 candidates only then."""
    return bool(cpu_flags() & set(BF16_CPU_FLAGS))


def machine_fingerprint() -> str:
    """Measurements are only comparable on the same CPU model, core count and host."""
    return f"{platform.node()}|{cpu_model()}|{cpu_cores()}|{platform.machine()}"


def cache_root(explicit: str | Path | None = None) -> Path:
    """The one cache root: `explicit` (--cache-dir), else $AITUNE_EXPORT_CACHE_DIR, else $XDG_CACHE_HOME/aitune-export,
    else ~/.cache/aitune-export. Builds, measurements, TensorRT timing caches and the server home live below it."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aitune-export"


def environment(libraries: Mapping[str, str]) -> dict[str, object]:
    """Where measurements were taken: this machine, Python, and the `libraries` the candidates used."""
    from optimizer._version import __version__

    return {
        "aitune_export": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpu_cores": cpu_cores(),
        "libraries": dict(libraries),
        "ngc": {k: os.environ[k] for k in NGC_VERSION_VARIABLES if k in os.environ},
    }
