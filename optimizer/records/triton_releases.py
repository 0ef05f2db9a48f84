"""The one table of what each Triton release ships, every fact with its public source (release notes, the server's
build.py and compatibility matrix, GitHub releases; the legend is above RELEASES).

`--triton-release` picks a row; the release gate (task/release_gate.py) compares the local toolchain
with it, and the report records the facts it used. A fact is never guessed: one the sources do not
give has value None and status "unconfirmed"; a value seen only in third-party quotes of the NGC
image is kept with status "secondary", and one worked out from other facts with status "derived".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from optimizer.errors import SettingsError
from optimizer.settings import DEFAULT_TRITON_RELEASE

FACT_STATUSES = ("confirmed", "derived", "secondary", "unconfirmed")
"""confirmed: NVIDIA or project source; derived: worked out from confirmed facts (the source says how);
secondary: third-party quotes of the NGC image; unconfirmed: no usable source (value None)."""

DEFAULT_RELEASE = DEFAULT_TRITON_RELEASE
"""What `--triton-release` defaults to (declared with the option in settings.py): the `ARG RELEASE` of docker/Dockerfile."""


@dataclass(frozen=True)
class Fact:
    """One cell of the table: its value (None when unconfirmed), where it comes from, and how sure that is."""

    value: Any
    source: str
    status: str = "confirmed"

    @property
    def known(self) -> bool:
        return self.value is not None

    def shown(self) -> str:
        """The value as a report shows it, with its status when it is not confirmed."""
        if self.value is None:
            return "unconfirmed"
        text = "yes" if self.value is True else "no" if self.value is False else str(self.value)
        return text if self.status == "confirmed" else f"{text} ({self.status})"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "status": self.status, "source": self.source}


@dataclass(frozen=True)
class PlatformStatus:
    """How the release's PyTorch backend serves one platform (`pytorch_libtorch`, `torch_aoti`)."""

    supported: Fact  # True / False / None
    status: str  # "Beta", "" or "unconfirmed": the backend README's label
    io_naming: str  # how the backend binds config tensor names ("" when unsupported)
    batching: Fact  # batch sizes above 1 served (True / False / None)

    def to_json(self) -> dict[str, Any]:
        return {"supported": self.supported.to_json(), "status": self.status, "io_naming": self.io_naming, "batching": self.batching.to_json()}


@dataclass(frozen=True)
class TritonRelease:
    """What `nvcr.io/nvidia/tritonserver:<release>-py3` ships, each field a Fact with its source."""

    release: str  # "YY.MM"
    triton: Fact  # server version, "2.71.0"
    tensorrt: Fact  # TensorRT of the image; a bare major ("11") when only that is known
    onnxruntime: Fact
    max_opset: Fact  # highest ai.onnx opset its ONNX Runtime loads (the proven value; the gate uses it)
    max_ir: Fact  # highest ONNX IR version its ONNX Runtime loads
    openvino: Fact
    cuda: Fact
    python: Fact
    libtorch_image: Fact  # the NGC PyTorch image the pytorch backend is built against
    torch: Fact  # torch.__version__ of that image: what loads model.pt / model.pt2
    pytorch_libtorch: PlatformStatus
    torch_aoti: PlatformStatus

    @property
    def openvino_hint_bf16(self) -> Fact:
        """Whether the release's openvino backend takes HINT_BF16, an openvino bf16 candidate's only precision switch."""
        return OPENVINO_HINT_BF16

    def platform(self, key: str) -> PlatformStatus | None:
        """The PyTorch backend's status for `key`; None for platforms served by their own backends (ORT, OpenVINO, TensorRT)."""
        return {"pytorch_libtorch": self.pytorch_libtorch, "torch_aoti": self.torch_aoti}.get(key)

    def summary(self) -> str:
        """One line for `inspect` and report.md."""
        p = self.torch_aoti
        aoti = {True: f"torch_aoti (batching {p.batching.shown()})", False: "no torch_aoti"}.get(p.supported.value, "torch_aoti unconfirmed")
        return (f"Triton {self.release} (server {self.triton.shown()}): TensorRT {self.tensorrt.shown()}, ONNX Runtime "
                f"{self.onnxruntime.shown()} (opset <= {self.max_opset.shown()}, IR <= {self.max_ir.shown()}), OpenVINO "
                f"{self.openvino.shown()}, PyTorch backend torch {self.torch.shown()}, {aoti}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"release": self.release}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Fact, PlatformStatus)):
                out[f.name] = value.to_json()
        out["openvino_hint_bf16"] = self.openvino_hint_bf16.to_json()
        return out


def release_named(text: Any) -> TritonRelease:
    """The row for `--triton-release`; anything else is refused naming the releases the table knows."""
    if not isinstance(text, str):  # TOML reads 26.10 as the float 26.1
        raise SettingsError(f"--triton-release {text!r} must be text like \"{DEFAULT_RELEASE}\"; in a settings file, quote it: "
                            f"triton-release = \"{DEFAULT_RELEASE}\".")
    if text not in RELEASES:
        raise SettingsError(f"--triton-release {text!r} is not a release this tool knows; choose one of: {', '.join(RELEASES)} "
                            f"(default {DEFAULT_RELEASE}, the release docker/Dockerfile builds on).")
    return RELEASES[text]


def version_tuple(text: str | None) -> tuple[int, ...]:
    """The leading numbers of a version: "2.13.0a0+9186a08b2c" -> (2, 13, 0); "11" -> (11,); "" -> ()."""
    m = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


# -- the table ---------------------------------------------------------------------------------------
# Sources: [B] build.py of the server's rYY.MM branch, [C] the server's docs/introduction/compatibility.md @ r26.08,
# [RN] the NVIDIA release notes, [GH] GitHub releases, [P] the Python basis, (s) secondary quotes.

_S = "secondary (s): third-party quotes of the NGC image; confirm inside the image"
_QA21 = "Triton QA exported opset 21 for this release (gen_qa_model_repository, onnx 1.16.1)"


OPENVINO_HINT_BF16 = Fact(True, "openvino_backend a5ae9c9 (2022-08-19, \"Migrate OV to 2022.1\") added the HINT_BF16 parameter "
                               "(ov::hint::inference_precision bf16); its newest source (db19304) still parses it; every release "
                               "in this table is later")
"""One fact for every row: the parameter predates the table's first release (24.10)."""


def _b(release: str, what: str) -> str:
    return f"server build.py {what}, r{release} [B]"


def _u(source: str = "no source found") -> Fact:
    return Fact(None, source, "unconfirmed")


def _s(value: Any, what: str = "") -> Fact:
    return Fact(value, f"{_S}{'; ' + what if what else ''}", "secondary")


def _d(value: Any, how: str) -> Fact:
    return Fact(value, how, "derived")


_TORCHSCRIPT = ("forward() argument names, else <name>__<i> positions, else config order; outputs <name>__<i> "
                "(pytorch_backend src/libtorch.cc)")
_AOTI_LIKE_TS = "as TorchScript: forward() names or <name>__<i> (pytorch_backend r26.04 src/pt2/model_instance_state.cc)"
_AOTI_CALL_SPEC = ("from the PT2 call spec: INPUT__<i>/OUTPUT__<i>, or ARGS[..]/KWARGS[..]/RESULT[..] "
                   "(pytorch_backend commit e07df29e, README r26.05)")


def _libtorch(release: str) -> PlatformStatus:
    if release >= "26.09":
        return PlatformStatus(_u("the sources cover the server through r26.08; no source says TorchScript was removed"),
                              "unconfirmed", _TORCHSCRIPT, _u())
    src = "pytorch_backend src/libtorch.cc (r26.05); server qa/L0_libtorch_* (r26.08); the release table's platforms column"
    return PlatformStatus(Fact(True, src), "", _TORCHSCRIPT, Fact(True, src))


def _aoti(release: str) -> PlatformStatus:
    if release <= "26.02":
        return PlatformStatus(Fact(False, "pytorch_backend r26.02 (af7425e0) has no src/pt2; torch_aoti first ships in 26.03"),
                              "", "", Fact(False, "no torch_aoti platform"))
    no_batch = Fact(False, "pytorch_backend README r26.05 (55bbe27f): batch sizes greater than 1 and sequence batching are unavailable")
    if release in ("26.03", "26.04"):
        return PlatformStatus(Fact(True, "pytorch_backend commit 688df563 (tip of r26.03); README r26.04 (8ffd6b20): "
                                   "\"AOT Inductor Support (Beta)\""), "Beta", _AOTI_LIKE_TS, no_batch)
    if release == "26.05":
        return PlatformStatus(Fact(True, "pytorch_backend README r26.05 (55bbe27f)"), "Beta", _AOTI_CALL_SPEC, no_batch)
    if release == "26.06":
        return PlatformStatus(Fact(True, "server qa/L0_torch_aoti on r26.06"), "unconfirmed", _AOTI_CALL_SPEC,
                              _d(True, "server commit e5f5faf7 on r26.06 (\"Enable PyTorch2 Batching Tests\"): QA serves max_batch_size 8 "
                                       "and dynamic batching; the backend README for 26.06 is not in the sources"))
    if release == "26.07":
        return PlatformStatus(Fact(True, "release 2.71.0 notes [GH]"), "unconfirmed", _AOTI_CALL_SPEC,
                              Fact(True, "release 2.71.0 notes [GH]: \"PyTorch backend: Enabled PyTorch 2 batching\""))
    if release == "26.10":
        return PlatformStatus(_u("no source covers 26.10"), "unconfirmed", _AOTI_CALL_SPEC, _u("no source covers 26.10"))
    src = {"26.08": "the release table (r26.08 platforms: torch_aoti, pytorch_libtorch)",
           "26.09": "release 2.73.0 notes [GH]: \"added a guard to the AOTI package loader\"",
           "26.11": "release 2.75.0 notes [GH]: \"PyTorch backend: Added AOTI BF16 input/output support\""}[release]
    return PlatformStatus(Fact(True, src), "unconfirmed", _AOTI_CALL_SPEC,
                          _d(True, "enabled in 26.07 (release 2.71.0 notes); no later source says it was removed"))


def _opset(release: str, ort: str) -> Fact:
    if release <= "25.02":
        return Fact(21, f"ORT docs/reference/compatibility.md @ 109c0baa: ONNX Runtime {ort} loads opset 21")
    if release <= "26.01":
        bound = 22 if ort == "1.21.0" else 23
        return Fact(21, f"{_QA21}; the ONNX that ONNX Runtime {ort} bundles allows at most {bound} (derived, unproven), so 21 is the gate")
    if release <= "26.06":
        return Fact(25, "ORT 1.24.1 release notes: ONNX upgraded to 1.20.1; Triton QA 26.02-26.06 exports opset 25")
    if release == "26.07":
        return Fact(25, "Triton QA for 26.07 exports opset 25 (26 unconfirmed for ONNX Runtime 1.27.0)")
    if release == "26.08":
        return Fact(26, "server r26.08 gen_qa_model_repository ONNX_OPSET=26: ONNX Runtime 1.28.0 pins onnx 1.22.0, opset 27 fails to load")
    return _u("ONNX Runtime of this release is unconfirmed")


def _ir(release: str, ort: str) -> Fact:
    if release <= "25.02":
        return Fact(10, f"ORT docs/reference/compatibility.md @ 109c0baa: ONNX Runtime {ort} loads IR 10")
    if release <= "25.07":
        return _d(10, f"ONNX Runtime {ort} bundles ONNX <= 1.17 (IR 10): ORT issue #23162, PR #24945 (ONNX 1.18 is part of 1.23)")
    if release <= "26.01":
        return _d(11, f"ONNX Runtime {ort} bundles ONNX 1.18.0 (ORT PR #24945), IR 11 (onnx docs/Versioning.md)")
    if release <= "26.08":
        return _d(13, f"ONNX Runtime {ort} bundles ONNX >= 1.20.1 (ORT 1.24.1 release notes, PR #27601, #28754), IR 13 (onnx docs/Versioning.md)")
    return _u("ONNX Runtime of this release is unconfirmed")


def _row(release: str, triton: Any, tensorrt: Any, ort: str | None, openvino: str | None, cuda: Any, python: Any,
         libtorch_image: Any, torch: Any) -> TritonRelease:
    """One row; plain values take the column's usual source, Facts carry their own."""

    def fact(value: Any, source: str) -> Fact:
        return value if isinstance(value, Fact) else (_u(f"not in the sources; this column comes from {source}") if value is None else Fact(value, source))

    return TritonRelease(
        release=release,
        triton=fact(triton, _b(release, "release_version")),
        tensorrt=fact(tensorrt, f"TensorRT in tritonserver:{release}-py3"),
        onnxruntime=fact(ort, f"{_b(release, 'ort_version')}; compatibility.md ORT table [C]"),
        max_opset=_opset(release, ort or ""),
        max_ir=_ir(release, ort or ""),
        openvino=fact(openvino, _b(release, "standalone_openvino_version")),
        cuda=fact(cuda, f"Triton release notes {release} [RN]: \"Release {release} is based on CUDA ...\""),
        python=fact(python, "[P]: build.py switched its apt repository to ubuntu2404 in r24.11; compatibility.md vllm rows give the Python"),
        libtorch_image=fact(libtorch_image, _b(release, "upstream_container_version (pytorch_cmake_args)")),
        torch=fact(torch, f"compatibility.md trtllm table [C], Torch column of .nv{release}"),
        pytorch_libtorch=_libtorch(release),
        torch_aoti=_aoti(release),
    )


_P = _d("3.12", "[P]: build.py switched its apt repository to ubuntu2404 in r24.11; compatibility.md vllm rows give 3.12.3")
_NOTE4 = "pytorch backend libtorch uncertain (the image may be built on another upstream container than build.py's default); read torch.__version__ inside the image"

RELEASES: MappingProxyType[str, TritonRelease] = MappingProxyType({r.release: r for r in (
    _row("24.10", "2.51.0", None, "1.19.2", "2024.4.0", "12.6.2", _d("3.10", "[P]: compatibility.md vllm row 3.10.12; Ubuntu 22.04 apt repository in build.py r24.10"), "pytorch:24.10", "2.5.0a0+e000cf0ad9"),
    _row("24.11", "2.52.0", None, "1.19.2", "2024.4.0", _u("the vllm-python-py3 image of 24.11 has CUDA 12.6.3.001 [C]; the main image is not listed"), _P, "pytorch:24.11", "2.6.0a0+df5bbc09d1"),
    _row("24.12", "2.53.0", Fact("10.7.0.23", "release notes r24.12 docs/introduction/release_notes.md [RN24.12]"),
         Fact("1.20.1", "server build.py ort_version, r24.12 [B]; compatibility.md [C] (the 24.12 release notes say 1.19.2, against both)"),
         Fact("2024.5.0", "server build.py standalone_openvino_version, r24.12 [B] (the 24.12 release notes say 2024.40.0, against build.py)"),
         Fact("12.6.3", "release notes r24.12 [RN24.12]"), Fact("3.12", "release notes r24.12: Ubuntu 24.04 including Python 3.12"),
         "pytorch:24.12", _s("2.6.0a0+df5bbc09d1")),
    _row("25.01", "2.54.0", Fact("10.8.0.43", "release notes r25.01 docs/introduction/release_notes.md [RN25.01]"), "1.20.1", "2024.5.0",
         "12.8.0.038", Fact("3.12", "release notes r25.01: Ubuntu 24.04 including Python 3.12"), "pytorch:25.01", "2.6.0a0+ecf3bae40a"),
    _row("25.02", "2.55.0", None, "1.20.1", "2025.0.0", "12.8.0.38", _P, "pytorch:25.02", _s("2.7.0a0+ecf3bae40a")),
    _row("25.03", "2.56.0", None, "1.21.0", "2025.0.0", "12.8.1.012", _P, "pytorch:25.03", "2.7.0a0+7c8ec84dab"),
    _row("25.04", "2.57.0", None, "1.21.0", "2025.0.0", "12.9.0", _P, "pytorch:25.04", "2.7.0a0+79aa17489c"),
    _row("25.05", "2.58.0", None, "1.22.0", "2025.1.0", _u("the vllm-python-py3 image of 25.05 has CUDA 12.9.0.043 [C]; the main image is not listed"), _P, "pytorch:25.05", "2.8.0a0+5228986c39"),
    _row("25.06", "2.59.0", _s("10.11.0.33"), "1.22.0", "2025.1.0", "12.9.1.010", _P, "pytorch:25.06", "2.8.0a0+5228986c39"),
    _row("25.07", "2.59.1", None, "1.22.0", "2025.1.0", _u("no 25.07 release-notes page"), _P, "pytorch:25.07", None),
    _row("25.08", "2.60.0", None, "1.23.0", "2025.2.0", "13.0.0.044", _P, "pytorch:25.08", _s("2.8.0a0+34c6371d24")),
    _row("25.09", "2.61.0", None, "1.23.0", "2025.3.0", _s("13.0.1", "NGC 25.09 stack"), _P, "pytorch:25.09", _s("2.9.0a0+50eac811a6")),
    _row("25.10", "2.62.0", None, "1.23.1", "2025.3.0", "13.0.2.006", _P, "pytorch:25.10", "2.9.0a0+145a3a7bda"),
    _row("25.11", "2.63.0", _s("10.14.1.48"), "1.23.2", "2025.3.0", None, _P, "pytorch:25.11", _s("2.10.0a0+b558c986e8")),
    _row("25.12", "2.64.0", _s("10.14.1"), "1.23.2", "2025.4.0", "13.1.0.36", _P, "pytorch:25.12", "2.10.0a0+b4e4ee81d3"),
    _row("26.01", "2.65.0", None, "1.23.2", "2025.4.1", _s("13.1", "NGC 26.01 stack"), _P, "pytorch:26.01", _s("2.10.0a0+a36e1d39eb")),
    _row("26.02", "2.66.0", None, "1.24.1", "2025.4.1", "13.1.1", _P, "pytorch:26.02", _s("2.11.0a0+eb65b36914")),
    _row("26.03", "2.67.0", None, "1.24.2", "2026.0.0", _s("13.2", "NGC 26.03 stack"), _P, "pytorch:26.03", _s("2.11.0a0+a6c236b9fd")),
    _row("26.04", "2.68.0", _s("10.16.1"), "1.24.4", "2026.1.0", "13.2.1", _P, "pytorch:26.04", _s("2.12.0a0+0291f960b6")),
    _row("26.05", "2.69.0", _s("10.16.1", "weak"), "1.24.4", "2026.1.0", "13.2.1", _P,
         _d("pytorch:26.04", "build.py r26.05 upstream_container_version default (uncertain: the image may be built on another upstream container)"),
         _u(f"2.12.0a0+0291f960b6 or 2.12.0a0+5aff3928d8: {_NOTE4}")),
    _row("26.06", "2.70.0", _s("11.0.0.114", "TensorRT 11 from 26.06: server commit d898a0fe"), "1.24.4", "2026.2.0", "13.3.0", _P,
         _d("pytorch:26.05", "build.py r26.06 upstream_container_version default (uncertain: the image may be built on another upstream container)"),
         _u(f"2.12.0a0+5aff3928d8 or 2.13.0a0+8145d630e8: {_NOTE4}")),
    _row("26.07", "2.71.0", _d("11", "TensorRT 11 from 26.06 (server commit d898a0fe; ORT 1.27 is the first to support TensorRT 11); "
                                     "the exact 26.07 build is unconfirmed"),
         "1.27.0", "2026.2.0", "13.3.1", _P, "pytorch:26.07", _s("2.13.0a0+9186a08b2c")),
    _row("26.08", "2.72.0", _s("11.2.1.2"), "1.28.0", "2026.3.0", "13.4.1", _P, "pytorch:26.08", _s("2.14.0a0+4fdf77b940")),
    _row("26.09", Fact("2.73.0", "GitHub release v2.73.0 [GH]"), _s("11.3.0.99"), None, None, "13.4.1",
         _u("no r26.09 branch in the sources"), _u("no r26.09 branch in the sources"),
         _u("the libtorch image of 26.09 is unconfirmed (NGC PyTorch 26.09: 2.14.0a0+b2c75dd062, secondary)")),
    _row("26.10", _d("2.74.0", "by sequence between v2.73.0 and v2.75.0; no v2.74.0 release page in the sources"), None, None, None,
         "13.4.3.001", _u(), _u(), _u()),
    _row("26.11", Fact("2.75.0", "GitHub release v2.75.0 [GH]"), None, None, None, None, _u(), _u(), _u()),
)})
"""Release "YY.MM" -> what it ships; in release order (24.10 ... 26.11)."""
