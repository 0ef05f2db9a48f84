"""CUDA device facts shared by the GPU backends: which GPU a device string names, whether torch can use
it, and the GPU's compute capability (which a TensorRT engine and its timing cache are tied to).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from optimizer.backend.base import Availability
from optimizer.errors import SettingsError
from optimizer.vocab import Device


def torch_cuda_availability(device: str) -> Availability:
    """Whether torch can run on `device` (a CUDA build, a visible GPU with that index)."""
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + (" (a CPU-only build)" if torch.version.cuda is None else f" (CUDA {torch.version.cuda})")
        return Availability(False, f"torch reports no CUDA device (torch.cuda.is_available() is False; {build}).")
    index = Device.of(device).cuda_index
    count = torch.cuda.device_count()
    if index >= count:
        return Availability(False, f"{device} does not exist: torch sees {count} GPU(s) (cuda:0..cuda:{count - 1}).")
    return Availability(True, f"{torch.cuda.get_device_name(index)}")


def compute_capability(index: int) -> str | None:
    """"9.0" for an H100/H200, from torch when it sees the GPU, else from nvidia-smi; None when neither can tell."""
    try:
        import torch

        if torch.cuda.is_available() and index < torch.cuda.device_count():
            major, minor = torch.cuda.get_device_capability(index)
            return f"{major}.{minor}"
    except Exception:  # torch missing or broken: try the driver's tool
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", str(index)],
            capture_output=True, text=True, timeout=20, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    return text if re.fullmatch(r"\d+\.\d+", text) else None


def check_gpu(device: Device) -> None:
    """--device cuda on a machine with no GPU at all fails now, not after every candidate was tried."""
    seen = torch_cuda_availability(str(device))
    if seen.ok:
        return
    driver = Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/gpus").is_dir()
    if not driver or "does not exist" in seen.reason:
        where = "" if "does not exist" in seen.reason else " and no NVIDIA driver is loaded"
        raise SettingsError(f"--device {device}: {seen.reason.rstrip('.')}{where}; use --device cpu, or run on a machine with that GPU.")
