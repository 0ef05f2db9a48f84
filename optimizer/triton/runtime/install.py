"""Where the real tritonserver 2.51 is installed (the nvidia-pytriton wheel) and the server home prepared from it.

A server home (bin/, backends/, caches/) is prepared once per version under the user's cache folder:
the wheel's binary and python backend, the python stub for this interpreter, and a stand-in
`backends/<name>/model.py` (Triton's "Python-based backends") for every native backend whose
`libtriton_<name>.so` is missing here, so unchanged `onnxruntime_onnx` / `pytorch_libtorch` configs load.
The home is built in a temporary folder and renamed into place, so no process sees half of one.
server.py runs a server from a home; this module starts nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.errors import ValidationError
from optimizer.machine import cache_root

log = logging.getLogger(__name__)

STANDIN_DIR = Path(__file__).parent / "standin_backends"
"""One folder per stand-in backend, named as Triton names the backend (onnxruntime, pytorch, openvino, ...)."""


class ToolMissing(ValidationError):
    """tritonserver or perf_analyzer is not installed where the project expects it."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel put the real server: the package folder, its shared libraries and its version."""

    package_dir: Path  # <site-packages>/pytriton/tritonserver
    libs_dir: Path  # <site-packages>/nvidia_pytriton.libs
    pytriton_version: str

    @property
    def stub(self) -> Path:
        """The python backend stub built for this interpreter's major.minor version."""
        return self.package_dir / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"


def find_triton() -> TritonInstall:
    """The tritonserver from the nvidia-pytriton wheel, or ToolMissing naming the install command."""
    try:
        version = importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        raise ToolMissing("tritonserver was not found (nvidia-pytriton is not installed); pip install 'aitune-export[triton]', or validate against a running server with --url HOST:PORT.") from None
    site = Path(sysconfig.get_paths()["purelib"])
    for root in [site, *(Path(p) for p in sys.path if p)]:
        package_dir = root / "pytriton" / "tritonserver"
        if (package_dir / "bin" / "tritonserver").is_file():
            break
    else:
        raise ToolMissing(f"nvidia-pytriton {version} is installed but pytriton/tritonserver/bin/tritonserver is missing; reinstall it: pip install --force-reinstall nvidia-pytriton=={version}.")
    install = TritonInstall(package_dir, package_dir.parent.parent / "nvidia_pytriton.libs", version)
    if not install.stub.is_file():
        raise ToolMissing(f"nvidia-pytriton {version} has no python backend stub for Python {sys.version_info[0]}.{sys.version_info[1]} ({install.stub}); use a Python it ships a stub for (3.8-3.13).")
    return install


def stand_in_backends() -> dict[str, Path]:
    """Backend name -> its stand-in model.py (every standin_backends/<name>/model.py)."""
    if not STANDIN_DIR.is_dir():
        return {}
    return {p.parent.name: p for p in sorted(STANDIN_DIR.glob("*/model.py"))}


@dataclass(frozen=True)
class ServerHome:
    """A prepared server tree: the binary, the backends Triton can load, and which of them are stand-ins."""

    root: Path
    version: str

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.root / "backends"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    def native_backends(self) -> set[str]:
        """Backends with a real shared library (libtriton_<name>.so)."""
        return {p.name for p in self.backends.iterdir() if (p / f"libtriton_{p.name}.so").is_file()}

    def stand_ins(self) -> set[str]:
        """Backends served by a stand-in model.py (no shared library)."""
        return {p.name for p in self.backends.iterdir() if (p / "model.py").is_file() and p.name not in self.native_backends()}


def homes_root(cache_dir: str | Path | None = None) -> Path:
    """Where server homes live: <the one cache root>/tritonserver (machine.cache_root; --cache-dir moves it)."""
    return cache_root(cache_dir) / "tritonserver"


def _home_key(install: TritonInstall) -> str:
    """Versions and stand-in sources: a new wheel, Python or stand-in gets a new home, never a patched one."""
    digest = hashlib.sha256()
    for name, path in stand_in_backends().items():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(str(install.package_dir).encode())
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return f"tritonserver-pytriton{install.pytriton_version}-py{py}-{digest.hexdigest()[:12]}"


def prepare_home(install: TritonInstall | None = None, root: Path | None = None) -> ServerHome:
    """The server home for this install, made on first use (built aside, then renamed into place atomically)."""
    install = install or find_triton()
    root = root or homes_root()
    home = ServerHome(root / _home_key(install), install.pytriton_version)
    if home.binary.is_file():
        return home
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-tritonserver-", dir=root))
    try:
        for part in ("bin", "backends", "caches"):
            shutil.copytree(install.package_dir / part, tmp / part, symlinks=True)
        shutil.copy2(install.stub, tmp / "backends" / "python" / "triton_python_backend_stub")
        for name, model_py in stand_in_backends().items():
            if not (tmp / "backends" / name / f"libtriton_{name}.so").is_file():
                (tmp / "backends" / name).mkdir(exist_ok=True)
                shutil.copy2(model_py, tmp / "backends" / name / "model.py")
        try:
            os.rename(tmp, home.root)
            log.info("prepared the tritonserver home %s", home.root)
        except OSError:
            if not home.binary.is_file():  # not "someone else was faster": a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


def server_environment(install: TritonInstall) -> dict[str, str]:
    """LD_LIBRARY_PATH for the copied binary and PATH with this interpreter's bin first (the stub takes python3 from PATH)."""
    env = dict(os.environ)
    libs = [str(install.libs_dir)]
    libpython = Path(sys.base_prefix) / "lib" / f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    if libpython.is_file():  # the stub links libpython without an RPATH: prefer this interpreter's own
        libs.append(str(libpython.parent))
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("PYTHONPATH", None)  # the stub is isolated anyway; keep the server's view explicit
    return env


def tritonserver_status() -> dict[str, Any]:
    """Whether the local tritonserver can start here, for `aitune-export backends` (finds files, starts nothing)."""
    try:
        install = find_triton()
    except ToolMissing as err:
        return {"name": "tritonserver", "found": False, "path": None, "reason": str(err)}
    stand_ins = sorted(stand_in_backends())
    home = homes_root() / _home_key(install)
    return {
        "name": "tritonserver",
        "found": True,
        "path": str(install.package_dir / "bin" / "tritonserver"),
        "reason": f"2.51 from nvidia-pytriton {install.pytriton_version}; stand-in backends: {', '.join(stand_ins) or 'none'}; "
                  + (f"server home {home}" if (home / "bin" / "tritonserver").is_file() else "server home is prepared on first use"),
    }
