"""How the local tritonserver (2.51) serves what its core does not know: a translated private copy.

Triton 2.51's core refuses `platform: "torch_aoti"` (it arrived in 26.03) before any backend is
asked. Locally such a model is served from a private repository whose config names the PyTorch
backend without that platform and `default_model_filename: "model.pt2"`; the pytorch stand-in then
loads the AOTInductor package with `torch._inductor.aoti_load_package`, feeding INPUT__<i> and
returning OUTPUT__<i> as the native backend does. The user's repository is never changed, and every
number served this way is labelled stand-in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

UNKNOWN_TO_LOCAL_CORE = {"torch_aoti": ("pytorch", "model.pt2")}
"""Platform -> (the backend that serves it, its default file) for platforms Triton 2.51's core rejects."""


def needs_translation(config: Any) -> bool:
    """True when the local core would refuse this config's platform before asking a backend."""
    return config.platform in UNKNOWN_TO_LOCAL_CORE


def translation_note(config: Any) -> str:
    """What the local server serves instead, for the record and the report."""
    backend, filename = UNKNOWN_TO_LOCAL_CORE[config.platform]
    return (f"the local tritonserver 2.51 has no platform {config.platform!r} (Triton 26.03 added it); it was served from a private copy "
            f"whose config names backend {backend!r} and {filename}, run by the {backend} stand-in")


def local_config(config: Any) -> Any:
    """A copy of `config` the local core accepts: platform dropped, its backend and default file named."""
    backend, filename = UNKNOWN_TO_LOCAL_CORE[config.platform]
    local = type(config)()
    local.CopyFrom(config)
    local.ClearField("platform")
    local.backend = backend
    if not local.default_model_filename:
        local.default_model_filename = filename
    return local


def private_model(source: Path, repository: Path, name: str, config_text: str) -> Path:
    """repository/name: every entry of the model folder `source` linked (versions, warmup files), the given config written."""
    target = repository / name
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name != "config.pbtxt":
            link = target / entry.name
            if not link.is_symlink() and not link.exists():
                link.symlink_to(entry.resolve())
    tmp = target / ".config.pbtxt.tmp"
    tmp.write_text(config_text)
    os.replace(tmp, target / "config.pbtxt")
    return target
