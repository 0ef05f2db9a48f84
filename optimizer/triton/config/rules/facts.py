"""The facts beside a config that rules need: the ONNX graph's tensors, the TensorRT engine's profiles, the versions, the GPUs."""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from optimizer.errors import ConfigRuleError
from optimizer.records.artifact import Artifact
from optimizer.triton.config.rules.base import ArtifactFacts

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def local_gpu_count() -> int | None:
    """This machine's GPUs: torch's count when torch was built with CUDA, else nvidia-smi's, else None (unknown)."""
    try:
        import torch

        if torch.version.cuda:
            return torch.cuda.device_count()  # honours CUDA_VISIBLE_DEVICES, as Triton does
    except Exception as err:  # noqa: BLE001 - no torch or a broken CUDA runtime: try nvidia-smi
        log.debug("torch cannot count GPUs: %s", err)
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            r = subprocess.run([exe, "-L"], check=False, capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.debug("nvidia-smi failed: %s", err)
            return None
        if r.returncode == 0:
            return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    return None


def facts_for(artifact: Artifact, directory_name: str, versions: tuple[int, ...] | None = None,
              warmup_files: Mapping[str, int] | None = None,
              gpu_count: int | Callable[[], int | None] | None = local_gpu_count) -> ArtifactFacts:
    """What the artifact says: ONNX graph names and shapes, the TensorRT engine's profile max batch and profile count;
    and the GPUs the config is checked against (this machine's, counted only when a config lists `gpus`)."""
    onnx_in = onnx_out = None
    if artifact.files and artifact.files[0].endswith(".onnx") and artifact.path.is_file():
        onnx_in, onnx_out = _onnx_facts(artifact)
    meta = artifact.metadata
    return ArtifactFacts(
        directory_name=directory_name,
        onnx_inputs=onnx_in,
        onnx_outputs=onnx_out,
        engine_max_batch=meta.get("engine_max_batch"),
        engine_profile_count=meta.get("engine_profile_count"),
        versions=versions,
        warmup_files=warmup_files,
        gpu_count=gpu_count,
    )


def _onnx_facts(artifact: Artifact) -> tuple[Any, Any]:
    try:
        from optimizer.model.onnx_graph import onnx_io_shapes

        return onnx_io_shapes(artifact.path)
    except ImportError as err:
        log.warning("onnx is not installed (%s): the ONNX names and shapes in the config are not checked against the graph", err)
        return None, None
    except Exception as err:  # a file onnx cannot read: the ONNX Runtime backend would fail to load it too
        raise ConfigRuleError(f"{artifact.path} is not an ONNX model onnx can read ({type(err).__name__}: {err}); re-run the export.") from err
