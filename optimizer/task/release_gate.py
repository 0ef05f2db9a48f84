"""The release gate: can the target Triton release load what this machine would build? Decided before any build.

Each publishable backend is checked against its row of records/triton_releases.py: the platform
exists there (and batches, when the model does), and the local tool that writes the artifact matches
what the release loads it with: torch for model.pt2, the exporter's opset and IR version for
model.onnx, OpenVINO for the IR, TensorRT major.minor for a plan. A check is data (`ReleaseCheck`):
`export` refuses an explicit --backend that fails one, skips a default candidate with the reason, and
with --allow-version-mismatch goes on and records a warning; `inspect` shows the same checks.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from optimizer.backend.onnx_export import BF16_MIN_OPSET, DEFAULT_OPSET
from optimizer.records.triton_releases import RELEASES, Fact, TritonRelease, version_tuple

if TYPE_CHECKING:
    from optimizer.backend import Backend

VERDICTS = ("ok", "unchecked", "mismatch", "unknown", "unsupported")
"""ok: matches; unchecked: the sources give no rule (or the tool is not installed), noted only;
mismatch: the versions differ; unknown: the release's fact is unconfirmed; unsupported: the release
cannot serve it at all (no platform, no batching), which --allow-version-mismatch does not override."""

DOCKER_FIX = "export in the Docker stage of that release (docker build -f docker/Dockerfile --build-arg RELEASE={release})"


@dataclass(frozen=True)
class Toolchain:
    """The local tools that write artifacts, read from package metadata (nothing heavy is imported)."""

    torch: str | None  # torch.__version__, e.g. "2.13.0+cpu"; None: not installed
    openvino: str | None
    tensorrt: str | None  # None: not installed (its candidate is unavailable anyway)
    onnx_ir: int | None  # the IR version torch's ONNX exporter writes; None: unknown
    ngc_release: str | None = None  # NVIDIA_PYTORCH_VERSION: inside the NGC PyTorch image of that release


def local_toolchain() -> Toolchain:
    """This machine's toolchain."""
    return Toolchain(_dist_version("torch"), _dist_version("openvino"), _tensorrt_version(), _exporter_ir(),
                     os.environ.get("NVIDIA_PYTORCH_VERSION") or None)


@dataclass(frozen=True)
class ReleaseCheck:
    """One comparison of a candidate's artifact with the target release."""

    backend: str
    fact: str  # platform, batching, torch, cuda, opset, ir_version, openvino, tensorrt
    local: str  # what this machine writes
    release: str  # what the release loads, with its evidence ("(secondary)")
    verdict: str  # one of VERDICTS
    problem: str = ""  # one sentence naming both sides (empty when ok)
    fix: str = ""  # the remedy: a flag, a pin or the Docker stage
    note: str = ""  # a caveat on a check that passed

    @property
    def blocks(self) -> bool:
        return self.verdict in ("mismatch", "unknown", "unsupported")

    @property
    def overridable(self) -> bool:
        """--allow-version-mismatch may publish past it (a version can be wrong; a missing platform cannot load)."""
        return self.verdict in ("mismatch", "unknown")

    def message(self) -> str:
        return f"{self.backend}: {self.problem}; {self.fix}." if self.fix else f"{self.backend}: {self.problem}."

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReleaseGate:
    """The target release, the local toolchain and the run's facts that decide what the release can load."""

    release: TritonRelease
    toolchain: Toolchain
    precision: str = "fp32"
    batching: bool = True  # axis 0 is the batch axis (--batching)
    device: str = "cpu"
    onnx_model: tuple[int, int] | None = None  # (opset, IR version) of an ONNX file given as MODEL
    allow_mismatch: bool = False

    def checks(self, backend: Backend) -> list[ReleaseCheck]:
        """Every check for one backend's artifact (none for the eager baseline)."""
        if not backend.publishable or backend.triton_platform is None:
            return []
        return [*_platform_checks(self, backend), *_CHECKS.get(backend.triton_platform, _none)(self, backend)]

    def refusal(self, backend: Backend) -> ReleaseCheck | None:
        """The first check that keeps this backend from being published, after --allow-version-mismatch."""
        return next((c for c in self.checks(backend) if c.blocks and not (self.allow_mismatch and c.overridable)), None)

    def check_named(self, names: Sequence[str]) -> None:
        """Each --backend the user named, refused now when the release cannot load it: one line naming both versions and the fix."""
        from optimizer.backend import backend_named
        from optimizer.errors import SettingsError

        precision = self.precision if self.precision != "auto" else "fp32"  # auto's other precisions are checked as candidates
        for name in names:
            backend = backend_named(name).for_run(precision)
            if self.onnx_model is not None and "onnx" not in backend.consumes:
                continue  # it cannot build from an ONNX model at all; screening says so
            check = self.refusal(backend)
            if check is not None:
                raise SettingsError(f"--triton-release {self.release.release}: {check.message()}")

    def overridden(self, backend: Backend) -> list[ReleaseCheck]:
        """The checks --allow-version-mismatch let through (each becomes a warning when this backend is published)."""
        return [c for c in self.checks(backend) if c.blocks and self.allow_mismatch and c.overridable]

    def to_json(self, backends: Sequence[Backend] = ()) -> dict[str, Any]:
        """The release's facts (with sources), the local toolchain and every check of `backends`: report.json's block."""
        return {
            "release": self.release.release,
            "summary": self.release.summary(),
            "allow_version_mismatch": self.allow_mismatch,
            "toolchain": asdict(self.toolchain),
            "checks": [c.to_json() for b in backends for c in self.checks(b)],
            "facts": self.release.to_json(),
        }


# -- the checks, one function per Triton platform ------------------------------------------------------

def _none(gate: ReleaseGate, backend: Backend) -> list[ReleaseCheck]:
    return []


def _platform_checks(gate: ReleaseGate, backend: Backend) -> list[ReleaseCheck]:
    """The PyTorch backend's platforms: does the release serve it at all, and batch it."""
    key, r = backend.triton_platform or "", gate.release
    status = r.platform(key)
    if status is None:
        return []
    out = [_fact_check(backend.name, "platform", key, status.supported, r.release,
                       lambda rel: rel.platform(key).supported.value is True,  # type: ignore[union-attr]
                       f"Triton {r.release} has no {key} platform", f"whether Triton {r.release} serves {key} is unconfirmed",
                       "another --backend")]
    if gate.batching and status.supported.value is True:
        out.append(_fact_check(backend.name, "batching", "batch sizes > 1", status.batching, r.release,
                               lambda rel: rel.platform(key).batching.value is True,  # type: ignore[union-attr]
                               f"Triton {r.release}'s {key} serves batch size 1 only", f"whether Triton {r.release}'s {key} batches is unconfirmed",
                               "--no-batching for a model that does not batch"))
    return out


def _fact_check(backend: str, fact: str, local: str, value: Fact, release: str, passes: Callable[[TritonRelease], bool],
                absent: str, unknown: str, other_fix: str) -> ReleaseCheck:
    """A yes/no fact of the release: True passes, False is unsupported, None is unknown."""
    shown = value.shown()
    if value.value is True:
        note = "" if value.status == "confirmed" else f"{fact} is {value.status} evidence ({value.source})"
        return ReleaseCheck(backend, fact, local, shown, "ok", note=note)
    later = _nearest_release(passes, release)
    to = f"--triton-release {later}" if later else "another --triton-release"
    if value.value is False:
        return ReleaseCheck(backend, fact, local, shown, "unsupported", f"{absent} ({value.source})", f"use {to}, or {other_fix}")
    return ReleaseCheck(backend, fact, local, shown, "unknown", f"{unknown} ({value.source})",
                        f"use {to}, or --allow-version-mismatch to publish anyway")


def _torch_checks(gate: ReleaseGate, backend: Backend) -> list[ReleaseCheck]:
    """model.pt2: compiled by the torch the release's PyTorch backend links (same major.minor; CUDA major on GPU)."""
    local, r = gate.toolchain.torch, gate.release
    if local is None:  # availability reports the missing torch
        return []
    docker = DOCKER_FIX.format(release=r.release)
    out = []
    if gate.toolchain.ngc_release and r.libtorch_image.value == f"pytorch:{gate.toolchain.ngc_release}":
        out.append(ReleaseCheck(backend.name, "torch", local, f"NGC pytorch:{gate.toolchain.ngc_release}", "ok",
                                note=f"compiled in NGC PyTorch {gate.toolchain.ngc_release}, the image Triton {r.release}'s PyTorch backend is built against"))
    elif not r.torch.known:
        out.append(ReleaseCheck(backend.name, "torch", local, "unconfirmed", "unknown",
                                f"model.pt2 is compiled by torch {local} here, and the torch of Triton {r.release}'s PyTorch backend is "
                                f"unconfirmed ({r.torch.source})", f"{docker}, or --allow-version-mismatch to publish anyway"))
    elif version_tuple(local)[:2] != version_tuple(r.torch.value)[:2]:
        mm = ".".join(map(str, version_tuple(r.torch.value)[:2]))
        same = _nearest_release(lambda rel: rel.torch.known and version_tuple(rel.torch.value)[:2] == version_tuple(local)[:2]
                                and rel.torch_aoti.supported.value is True, r.release)
        other = f", --triton-release {same} (torch {'.'.join(map(str, version_tuple(local)[:2]))})" if same else ""
        out.append(ReleaseCheck(backend.name, "torch", local, r.torch.shown(), "mismatch",
                                f"model.pt2 is compiled by torch {local} here but Triton {r.release}'s PyTorch backend links torch {r.torch.shown()}",
                                f"{docker}, pip install 'torch=={mm}.*'{other}, or --allow-version-mismatch to publish anyway"))
    else:
        note = ""
        if local != r.torch.value:
            note = (f"same torch {'.'.join(map(str, version_tuple(local)[:2]))} as Triton {r.release}'s PyTorch backend "
                    f"({r.torch.shown()}), not the same build; AOTInductor promises no compatibility across builds: {docker} for the release's own torch")
        out.append(ReleaseCheck(backend.name, "torch", local, r.torch.shown(), "ok", note=note))
    cuda_here = _torch_cuda_major(local)
    if gate.device.startswith("cuda") and cuda_here is not None and r.cuda.known:
        cuda_there = version_tuple(r.cuda.value)[:1]
        if cuda_there and cuda_there[0] != cuda_here:
            out.append(ReleaseCheck(backend.name, "cuda", f"CUDA {cuda_here}", r.cuda.shown(), "mismatch",
                                    f"model.pt2 carries CUDA {cuda_here} kernels (torch {local}) but Triton {r.release} runs CUDA {r.cuda.shown()}",
                                    f"{docker}, or --allow-version-mismatch to publish anyway"))
    return out


def _torchscript_checks(gate: ReleaseGate, backend: Backend) -> list[ReleaseCheck]:
    """model.pt: the reference gives no rule for a TorchScript file saved by a newer torch; noted, not refused."""
    local, r = gate.toolchain.torch, gate.release
    if local is None:
        return []
    return [ReleaseCheck(backend.name, "torch", local, r.torch.shown(), "unchecked",
                         note="no source states whether a TorchScript model.pt saved by one torch loads in another's libtorch")]


def _onnx_checks(gate: ReleaseGate, backend: Backend) -> list[ReleaseCheck]:
    """model.onnx: its opset and IR version within what the release's ONNX Runtime loads."""
    r = gate.release
    if gate.onnx_model is not None:
        opset, ir, who, fix = gate.onnx_model[0], gate.onnx_model[1], "the ONNX model", "re-export the model at a lower opset"
    else:
        opset = int(backend.settings.get("opset", DEFAULT_OPSET))
        bf16 = backend.settings.get("precision") == "bf16" and opset < BF16_MIN_OPSET
        opset = max(opset, BF16_MIN_OPSET) if bf16 else opset
        ir, who, fix = gate.toolchain.onnx_ir, "torch's ONNX exporter", "--precision fp16 or fp32" if bf16 else ""
        who += " (for --precision bf16)" if bf16 else ""
    ort = f"ONNX Runtime {r.onnxruntime.shown()}"
    return [
        _limit_check(backend.name, "opset", opset, r.max_opset, r.release, lambda rel: rel.max_opset, who, f"{ort} loads opset <= ", fix),
        _limit_check(backend.name, "ir_version", ir, r.max_ir, r.release, lambda rel: rel.max_ir, who, f"{ort} loads IR <= ", ""),
    ]


def _limit_check(backend: str, fact: str, value: int | None, limit: Fact, release: str, limit_of: Callable[[TritonRelease], Fact],
                 who: str, theirs: str, fix: str) -> ReleaseCheck:
    """`value` (what `who` writes) must not exceed the release's `limit` (an opset, an IR version)."""
    label = "IR version" if fact == "ir_version" else fact
    ours = f"{who} writes {label} {value}"
    if value is None:
        return ReleaseCheck(backend, fact, "unknown", limit.shown(), "unchecked", note=f"the {label} {who} writes is not known here")
    if not limit.known:
        floor = _earlier_floor(limit_of, release)
        if floor is not None and value <= int(floor[1].value):  # ONNX Runtime only moves forward from release to release
            return ReleaseCheck(backend, fact, str(value), f">= {floor[1].value} (derived)", "ok",
                                note=f"Triton {release}'s limit is unconfirmed; Triton {floor[0]} loads {label} <= {floor[1].value} "
                                     f"({floor[1].source}), and no later release has shipped an older ONNX Runtime")
        known = _nearest_release(lambda rel: limit_of(rel).known and value <= int(limit_of(rel).value), release)
        return ReleaseCheck(backend, fact, str(value), "unconfirmed", "unknown", f"{ours}; Triton {release}'s limit is unconfirmed ({limit.source})",
                            f"use --triton-release {known} (confirmed), or --allow-version-mismatch to publish anyway")
    if value <= int(limit.value):
        note = "" if limit.status == "confirmed" else f"the limit is {limit.status} ({limit.source})"
        return ReleaseCheck(backend, fact, str(value), limit.shown(), "ok", note=note)
    later = _nearest_release(lambda rel: limit_of(rel).known and value <= int(limit_of(rel).value), release)
    fixes = [f for f in (fix, f"--triton-release {later}" if later else "", "--allow-version-mismatch to publish anyway") if f]
    return ReleaseCheck(backend, fact, str(value), limit.shown(), "mismatch", f"{ours} but Triton {release}'s {theirs}{limit.shown()}", ", ".join(fixes))


def _openvino_checks(gate: ReleaseGate, backend: Backend) -> list[ReleaseCheck]:
    """The IR: written by an OpenVINO no newer than the release's (older runtimes do not read newer IR)."""
    local, r = gate.toolchain.openvino, gate.release
    if local is None:
        return []
    if not r.openvino.known:
        known = _nearest_release(lambda rel: rel.openvino.known, r.release)
        return [ReleaseCheck(backend.name, "openvino", local, "unconfirmed", "unknown",
                             f"the IR is written by OpenVINO {local} here, and Triton {r.release}'s OpenVINO is unconfirmed ({r.openvino.source})",
                             f"use --triton-release {known} (confirmed), or --allow-version-mismatch to publish anyway")]
    # major.minor: a patch release reads and writes the same IR (26.07 ships 2026.2.0; pip's 2026.2 is 2026.2.1)
    here, there = version_tuple(local)[:2], version_tuple(r.openvino.value)[:2]
    if here > there:
        pin = ".".join(map(str, there))
        return [ReleaseCheck(backend.name, "openvino", local, r.openvino.shown(), "mismatch",
                             f"the IR is written by OpenVINO {local} here but Triton {r.release} reads it with OpenVINO {r.openvino.shown()} "
                             "(an older runtime may not load a newer IR)",
                             f"pip install 'openvino=={pin}.*', or --allow-version-mismatch to publish anyway")]
    note = "" if here == there else "a newer runtime reads an older IR (Intel KB 000091835); the same version is preferred"
    out = [ReleaseCheck(backend.name, "openvino", local, r.openvino.shown(), "ok", note=note)]
    if backend.settings.get("precision") == "bf16":  # the config's HINT_BF16 must mean something to the release's backend
        out.append(_fact_check(backend.name, "HINT_BF16", "HINT_BF16: YES", r.openvino_hint_bf16, r.release,
                               lambda rel: rel.openvino_hint_bf16.value is True, f"Triton {r.release}'s openvino backend has no HINT_BF16",
                               f"whether Triton {r.release}'s openvino backend takes HINT_BF16 is unconfirmed", "--precision fp32"))
    return out


def _tensorrt_checks(gate: ReleaseGate, backend: Backend) -> list[ReleaseCheck]:
    """A plan: built by the TensorRT major.minor of the release (engines load only on the version that built them)."""
    local, r = gate.toolchain.tensorrt, gate.release
    if local is None:
        return [ReleaseCheck(backend.name, "tensorrt", "not installed", r.tensorrt.shown(), "unchecked",
                             note="TensorRT is not installed here, so this candidate is unavailable")]
    fix = (f"build the engine on a GPU runner in the export-env image of {r.release} (docker/README.md), "
           f"pip install 'tensorrt=={'.'.join(map(str, version_tuple(r.tensorrt.value)[:2]))}.*'" if r.tensorrt.known else
           f"build the engine on a GPU runner in the export-env image of {r.release} (docker/README.md)")
    here, there = version_tuple(local)[:2], version_tuple(r.tensorrt.value)[:2]
    same_image = gate.toolchain.ngc_release == r.release
    if not r.tensorrt.known or (len(there) < 2 and there == here[:1]):
        if same_image:
            return [ReleaseCheck(backend.name, "tensorrt", local, r.tensorrt.shown(), "ok",
                                 note=f"built in NGC {r.release}; docker/check_release.py compares the exact versions when the server stage is built")]
        return [ReleaseCheck(backend.name, "tensorrt", local, r.tensorrt.shown(), "unknown",
                             f"the plan is built by TensorRT {local} here, and Triton {r.release}'s TensorRT is {r.tensorrt.shown()} ({r.tensorrt.source})",
                             f"{fix}, or --allow-version-mismatch to publish anyway")]
    if here[: len(there)] != there:
        return [ReleaseCheck(backend.name, "tensorrt", local, r.tensorrt.shown(), "mismatch",
                             f"the plan is built by TensorRT {local} here but Triton {r.release} loads it with TensorRT {r.tensorrt.shown()}",
                             f"{fix}, or --allow-version-mismatch to publish anyway")]
    note = "" if local == r.tensorrt.value else (f"same TensorRT major.minor, full versions differ ({local} here, {r.tensorrt.shown()} there); "
                                                 "TensorRT promises an engine only to the exact version that built it")
    return [ReleaseCheck(backend.name, "tensorrt", local, r.tensorrt.shown(), "ok", note=note)]


_CHECKS: dict[str, Callable[[ReleaseGate, Any], list[ReleaseCheck]]] = {
    "torch_aoti": _torch_checks,
    "pytorch_libtorch": _torchscript_checks,
    "onnxruntime_onnx": _onnx_checks,
    "openvino": _openvino_checks,
    "tensorrt_plan": _tensorrt_checks,
}
"""Triton platform key (records/triton_platforms.py) -> what its artifact must match in the release."""


# -- helpers ---------------------------------------------------------------------------------------------

def _nearest_release(passes: Callable[[TritonRelease], bool], target: str) -> str | None:
    """The release to suggest instead of `target`: the first later one for which `passes` holds, else the last earlier one."""
    good = [r.release for r in RELEASES.values() if passes(r)]
    return next((r for r in good if r > target), good[-1] if good else None)


def _earlier_floor(limit_of: Callable[[TritonRelease], Fact], target: str) -> tuple[str, Fact] | None:
    """The latest release before `target` whose limit is known: a floor for a limit that only rises (an ONNX opset)."""
    known = [(r.release, limit_of(r)) for r in RELEASES.values() if r.release < target and limit_of(r).known]
    return known[-1] if known else None


def _dist_version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tensorrt_version() -> str | None:
    """TensorRT's version without importing it (its import loads the CUDA libraries); None when it is not installed."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        return None
    for dist in ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu13-bindings", "tensorrt-cu12-bindings"):
        version = _dist_version(dist)
        if version:
            return version
    return os.environ.get("TENSORRT_VERSION") or "unknown"


def _exporter_ir() -> int | None:
    """The IR version torch's dynamo ONNX exporter stamps (torch 2.13: 10); None when torch cannot say."""
    try:
        from torch.onnx._internal.exporter._constants import ONNX_IR_VERSION
    except ImportError:  # no torch, a torch without the dynamo exporter, or one that moved the constant
        return None
    return int(ONNX_IR_VERSION)


def _torch_cuda_major(version: str) -> int | None:
    """12 for "2.13.0+cu128", 13 for "+cu130"; None for CPU builds and NGC builds (their tag is a commit)."""
    m = re.search(r"\+cu(\d+)", version)
    return int(m.group(1)[:-1]) if m and len(m.group(1)) >= 3 else None


def onnx_model_versions(path: Path) -> tuple[int, int] | None:
    """(highest ai.onnx opset, IR version) of an .onnx MODEL, read without its weights; None when it is not one."""
    if path.suffix != ".onnx" or not path.is_file():
        return None
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # a broken file is the model loader's to report, with its own message
        return None
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return opset, int(proto.ir_version)
