"""--triton-release: the table of what each release ships, and the gate that refuses or skips what the release cannot load."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from optimizer.app.plan import plan_run
from optimizer.backend import backend_named
from optimizer.cli import main
from optimizer.errors import SettingsError
from optimizer.model.reference import resolve_signature
from optimizer.model.source import load_model
from optimizer.records.reference_set import ReferenceSet
from optimizer.records.triton_releases import DEFAULT_RELEASE, FACT_STATUSES, RELEASES, Fact, release_named, version_tuple
from optimizer.settings import ExportSettings, load_settings_file, settings_from
from optimizer.task.context import TuneContext
from optimizer.task.release_gate import ReleaseGate, Toolchain, local_toolchain
from optimizer.tune_strategy import MaxThroughputStrategy
from tests.conftest import ROOT, run_cli, tree_snapshot

HERE = Toolchain(torch="2.13.0+cpu", openvino="2026.2.0", tensorrt=None, onnx_ir=10)
"""A toolchain that matches 26.07 wherever the table can tell (tests pass their own, not this machine's)."""


def _gate(release: str, toolchain: Toolchain = HERE, **kw) -> ReleaseGate:
    return ReleaseGate(RELEASES[release], toolchain, **kw)


def _verdicts(gate: ReleaseGate, backend: str, **settings) -> dict[str, str]:
    return {c.fact: c.verdict for c in gate.checks(backend_named(backend, **settings))}


# -- the table ----------------------------------------------------------------------------------------------

VERSIONED = ("triton", "tensorrt", "onnxruntime", "max_opset", "max_ir", "openvino", "cuda", "python", "torch")
"""Row fields whose known values may only stay or rise from one release to the next."""


def _month(release: str) -> int:
    year, month = release.split(".")
    return int(year) * 12 + int(month)


def _version(value: object) -> tuple[int, ...]:
    return (int(value),) if isinstance(value, int) else version_tuple(str(value))


def test_releases_are_the_monthly_rows_in_order():
    """Invariants, not the table's values: a typo made in the table and in a test that copies it would pass both."""
    releases = list(RELEASES)
    assert all(re.fullmatch(r"\d\d\.(0[1-9]|1[0-2])", r) for r in releases), releases
    months = [_month(r) for r in releases]
    assert months == list(range(months[0], months[0] + len(months)))  # in order, one a month, none missing
    assert all(RELEASES[r].release == r for r in releases)


@pytest.mark.parametrize("field", VERSIONED)
def test_versions_only_move_forward(field: str):
    """A later release never ships an older server, runtime, opset or CUDA than an earlier one (compared to the precision both
    give: "11" after "11.0.0.114" is the same major); the server's version rises every release."""
    known = [(r.release, _version(getattr(r, field).value)) for r in RELEASES.values() if getattr(r, field).known]
    assert len(known) >= 2, field
    for (before, a), (after, b) in zip(known, known[1:]):
        n = min(len(a), len(b))
        assert b[:n] >= a[:n], f"{field}: {after} ships {b}, older than {before}'s {a}"
        if field == "triton":
            assert b > a, f"{after} has the server version of {before}"


def test_platforms_once_served_stay_served_and_unsupported_means_no_batching():
    for key in ("pytorch_libtorch", "torch_aoti"):
        states = [RELEASES[r].platform(key).supported.value for r in RELEASES]
        first = states.index(True)
        assert False not in states[first:], f"{key} disappears after {list(RELEASES)[first]} with no source saying so"
        assert all(r.platform(key).status in ("", "Beta", "unconfirmed") for r in RELEASES.values())
    lacking = [(r.release, r.torch_aoti) for r in RELEASES.values() if r.torch_aoti.supported.value is False]
    assert lacking  # torch_aoti came late: a platform the release lacks serves no batch and binds no names
    assert all(p.batching.value is False and p.io_naming == "" for _, p in lacking), lacking


def test_the_server_here_and_the_torch_here_are_rows_of_the_table():
    """Two facts from outside the table: the tritonserver the tests run (tritonclient's version, the one nvidia-pytriton
    bundles) is some release's server, and the default release's PyTorch backend has the torch minor this project pins."""
    import importlib.metadata

    here = importlib.metadata.version("tritonclient")
    assert here in {r.triton.value for r in RELEASES.values()}
    pinned = re.search(r"torch==(\d+\.\d+)", (ROOT / "scripts" / "bootstrap.sh").read_text())
    assert pinned and version_tuple(RELEASES[DEFAULT_RELEASE].torch.value)[:2] == version_tuple(pinned.group(1))


def test_every_fact_has_a_source_and_unconfirmed_means_no_value():
    for r in RELEASES.values():
        facts = [f for f in vars(r).values() if isinstance(f, Fact)]
        facts += [p.supported for p in (r.pytorch_libtorch, r.torch_aoti)] + [p.batching for p in (r.pytorch_libtorch, r.torch_aoti)]
        for f in facts:
            assert f.status in FACT_STATUSES and f.source, (r.release, f)
            assert (f.value is None) == (f.status == "unconfirmed"), (r.release, f)
        json.dumps(r.to_json())  # report.json carries the row


def test_default_release_is_known_and_is_the_settings_default():
    assert DEFAULT_RELEASE in RELEASES and ExportSettings().triton_release == DEFAULT_RELEASE


def test_an_unknown_release_is_refused_naming_the_known_ones(tmp_path: Path):
    with pytest.raises(SettingsError) as err:
        release_named("24.13")
    assert "24.13" in str(err.value) and "24.10" in str(err.value) and "26.11" in str(err.value)
    toml = tmp_path / "s.toml"
    toml.write_text("triton-release = 26.10\n")  # TOML reads a float: 26.1
    with pytest.raises(SettingsError, match='quote it: triton-release = "26.07"'):
        plan_run(settings_from(load_settings_file(toml)), publishing=False)
    r = CliRunner().invoke(main, ["export", "--triton-release", "99.01"])
    assert r.exit_code == 2 and "choose one of: 24.10" in r.output and len(r.output.strip().splitlines()) == 1


# -- the gate ---------------------------------------------------------------------------------------------

def test_platform_and_batching_of_torch_aoti():
    assert _verdicts(_gate("26.07"), "torch-aoti") == {"platform": "ok", "batching": "ok", "torch": "ok"}
    missing = _gate("24.10").refusal(backend_named("torch-aoti"))
    assert missing.verdict == "unsupported" and "has no torch_aoti platform" in missing.message() and "--triton-release 26.03" in missing.message()
    assert not missing.overridable and _gate("24.10", allow_mismatch=True).refusal(backend_named("torch-aoti")) is not None
    one = _gate("26.04").refusal(backend_named("torch-aoti"))
    assert one.fact == "batching" and "batch size 1 only" in one.problem and "--no-batching" in one.fix
    assert _gate("26.04", batching=False).refusal(backend_named("torch-aoti")).fact == "torch"  # 2.12 there, 2.13 here


def test_torch_for_pt2_compares_major_minor_and_names_the_docker_stage():
    ok = next(c for c in _gate("26.07").checks(backend_named("torch-aoti")) if c.fact == "torch")
    assert ok.verdict == "ok" and "not the same build" in ok.note
    bad = _gate("26.08").refusal(backend_named("torch-aoti"))
    assert bad.verdict == "mismatch" and HERE.torch in bad.problem and RELEASES["26.08"].torch.value in bad.problem
    assert "--build-arg RELEASE=26.08" in bad.fix and "pip install 'torch==2.14.*'" in bad.fix and "--triton-release 26.07" in bad.fix
    ngc = _gate("26.08", replace(HERE, torch="2.14.0a0+deadbeef", ngc_release="26.08"))  # inside NGC PyTorch 26.08
    assert _verdicts(ngc, "torch-aoti")["torch"] == "ok"
    unknown = _gate("26.05", batching=False).refusal(backend_named("torch-aoti"))
    assert unknown.verdict == "unknown" and "unconfirmed" in unknown.problem and unknown.overridable
    cuda = _gate("26.07", replace(HERE, torch="2.13.0+cu128"), device="cuda")
    assert _verdicts(cuda, "torch-aoti")["cuda"] == "mismatch"  # CUDA 12 kernels, a CUDA 13 server


def test_onnx_opset_and_ir_version():
    assert _verdicts(_gate("24.10"), "onnxruntime") == {"opset": "ok", "ir_version": "ok"}  # opset 20 <= 21, IR 10
    bf16 = _gate("25.01", precision="bf16").refusal(backend_named("onnxruntime-trt", precision="bf16"))
    assert bf16.fact == "opset" and "opset 22" in bf16.problem and "opset <= 21" in bf16.problem
    assert "--precision fp16 or fp32" in bf16.fix and "--triton-release 26.02" in bf16.fix
    file = _gate("26.07", onnx_model=(26, 13)).refusal(backend_named("onnxruntime"))
    assert "the ONNX model writes opset 26" in file.problem and "--triton-release 26.08" in file.fix
    assert _gate("26.08", onnx_model=(26, 13)).refusal(backend_named("onnxruntime")) is None
    assert _gate("25.01", onnx_model=(21, 11)).refusal(backend_named("onnxruntime")).fact == "ir_version"


def test_openvino_ir_must_not_be_newer_than_the_release():
    assert _gate("26.07").refusal(backend_named("openvino")) is None
    newer = _gate("26.07", replace(HERE, openvino="2026.4.1")).refusal(backend_named("openvino"))
    release = RELEASES["26.07"].openvino.value
    assert "OpenVINO 2026.4.1 here" in newer.problem and f"OpenVINO {release}" in newer.problem
    assert f"pip install 'openvino=={'.'.join(str(release).split('.')[:2])}.*'" in newer.fix
    patch = _gate("26.07", replace(HERE, openvino="2026.2.1")).refusal(backend_named("openvino"))
    assert patch is None, "a patch release of the release's major.minor writes the IR it reads (pyproject pins 2026.2.x)"
    older = next(iter(_gate("26.08").checks(backend_named("openvino"))))
    assert older.verdict == "ok" and "older IR" in older.note


def test_an_openvino_bf16_candidate_checks_that_the_release_takes_hint_bf16():
    bf16 = {c.fact: c for c in _gate("26.07").checks(backend_named("openvino", precision="bf16"))}
    assert bf16["HINT_BF16"].verdict == "ok" and bf16["HINT_BF16"].release == "yes"
    assert "a5ae9c9" in RELEASES["24.10"].openvino_hint_bf16.source, "dated by the backend commit that added it"
    assert "HINT_BF16" not in {c.fact for c in _gate("26.07").checks(backend_named("openvino"))}, "fp32 sets no precision parameter"
    assert RELEASES["26.07"].to_json()["openvino_hint_bf16"]["value"] is True


def test_tensorrt_major_minor_and_not_installed():
    assert _verdicts(_gate("24.12"), "tensorrt") == {"tensorrt": "unchecked"}  # not installed: the candidate is unavailable anyway
    shipped = RELEASES["24.12"].tensorrt.value
    assert _gate("24.12", replace(HERE, tensorrt=shipped)).refusal(backend_named("tensorrt")) is None
    bad = _gate("24.12", replace(HERE, tensorrt="10.8.0.43")).refusal(backend_named("tensorrt"))
    assert bad.verdict == "mismatch" and "TensorRT 10.8.0.43 here" in bad.problem and f"TensorRT {shipped}" in bad.problem
    assert "pip install 'tensorrt==10.7.*'" in bad.fix
    assert _verdicts(_gate("26.07", replace(HERE, tensorrt="11.1.0")), "tensorrt") == {"tensorrt": "unknown"}  # only "11" is known
    assert _verdicts(_gate("26.07", replace(HERE, tensorrt="10.16.1")), "tensorrt") == {"tensorrt": "mismatch"}
    assert _verdicts(_gate("26.07", replace(HERE, tensorrt="11.1.0", ngc_release="26.07")), "tensorrt") == {"tensorrt": "ok"}


def test_local_toolchain_reads_versions_without_importing_tensorrt():
    tc = local_toolchain()
    assert tc.torch and tc.torch[0].isdigit()


# -- export and inspect -------------------------------------------------------------------------------------

def test_an_explicit_backend_the_release_cannot_load_is_refused_in_one_line(in_tmp: Path):
    here = local_toolchain().torch or ""
    if here.startswith("2.14."):
        pytest.skip("the local torch is the one Triton 26.08 links")
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "torch-aoti", "--triton-release", "26.08", cwd=in_tmp)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert here in r.stderr and RELEASES["26.08"].torch.value in r.stderr and "--build-arg RELEASE=26.08" in r.stderr
    assert "--allow-version-mismatch" in r.stderr
    assert tree_snapshot(in_tmp) == {}  # refused before anything was built or written
    with pytest.raises(SettingsError, match="has no torch_aoti platform"):  # a platform the release lacks is never allowed
        plan_run(ExportSettings(backend=["torch-aoti"], triton_release="24.10", allow_version_mismatch=True))
    plan_run(ExportSettings(backend=["torch-aoti"], triton_release="26.08", allow_version_mismatch=True))  # a version mismatch is


def _tune_ctx(tmp_path: Path) -> TuneContext:
    model = load_model("optimizer.examples.cnn:build")
    sig = resolve_signature(model, [], {}, [], True)
    return TuneContext(model=model, signature=sig, reference=ReferenceSet("", "", [], ""), workdir=tmp_path)


def test_default_candidates_the_release_cannot_load_are_skipped_with_the_reason(tmp_path: Path):
    """Release 26.11 confirms little: the candidates whose facts are unconfirmed are skipped with the reason, while
    ONNX Runtime, whose opset limit only rises from release to release, passes on 26.08's confirmed floor."""
    gate = _gate("26.11")
    strategy = MaxThroughputStrategy(release_gate=gate)
    backends = strategy.candidate_backends(None)
    refused = strategy._release_refusals(backends, _tune_ctx(tmp_path))
    assert {c.status for c in refused.values()} == {"skipped"} and all(c.stage == "release" for c in refused.values())
    assert "whether Triton 26.11 serves pytorch_libtorch is unconfirmed" in refused["torchscript[cpu]"].reason
    assert "torch-aoti[cpu]" in refused and "openvino[cpu]" in refused
    assert "onnxruntime[cpu]" not in refused
    opset = next(c for c in gate.checks(next(b for b in backends if b.name == "onnxruntime")) if c.fact == "opset")
    assert opset.verdict == "ok" and "Triton 26.08 loads opset <=" in opset.note
    assert gate.to_json(backends)["facts"]["triton"]["value"] == "2.75.0"


def test_allow_version_mismatch_keeps_the_candidate_and_warns_when_it_is_published(tmp_path: Path):
    gate = _gate("26.07", replace(HERE, openvino="2026.4.1"), allow_mismatch=True)
    strategy = MaxThroughputStrategy(backends=["openvino"], release_gate=gate)
    ctx = _tune_ctx(tmp_path)
    assert strategy._release_refusals(strategy.candidate_backends(None), ctx) == {}
    from optimizer.records.candidate import Candidate

    warnings = strategy._mismatch_warnings(Candidate("openvino[cpu]", "openvino", "cpu", "passed"), strategy.candidate_backends(None), "cpu")
    assert len(warnings) == 1 and "--allow-version-mismatch" in warnings[0] and "OpenVINO 2026.4.1 here" in warnings[0]


def test_inspect_shows_the_release_and_why_a_candidate_will_not_run():
    r = CliRunner().invoke(main, ["inspect", "--triton-release", "24.10", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["triton_release"]["release"] == "24.10" and "Triton 24.10 (server 2.51.0)" in doc["triton_release"]["summary"]
    aoti = next(c for c in doc["candidates"] if c["backend"] == "torch-aoti")
    assert not aoti["will_run"] and "has no torch_aoti platform" in aoti["reason"]
    text = CliRunner().invoke(main, ["inspect"]).output
    assert f"triton      Triton {DEFAULT_RELEASE} (server" in text


@pytest.mark.slow
def test_allow_version_mismatch_publishes_with_the_warning_in_both_reports(in_tmp: Path):
    """Whether 26.11 still serves TorchScript is unconfirmed: refused without the flag, published with it, and both reports say so."""
    args = ("export", "tests.fixtures.models:mlp", "--backend", "torchscript", "--triton-release", "26.11",
            "--max-batch-size", "2", "--eager-gate", "disabled")
    with pytest.raises(SettingsError, match="whether Triton 26.11 serves pytorch_libtorch is unconfirmed"):  # refused before any build
        plan_run(ExportSettings(model="tests.fixtures.models:mlp", backend=["torchscript"], triton_release="26.11"))
    r = run_cli(*args, "--allow-version-mismatch", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    report = in_tmp / "aitune-reports" / "mlp"
    doc = json.loads((report / "report.json").read_text())
    block = doc["result"]["triton_release"]
    assert block["release"] == "26.11" and block["allow_version_mismatch"] and doc["settings"]["triton_release"] == "26.11"
    assert any("--allow-version-mismatch" in w and "unconfirmed" in w for w in doc["result"]["warnings"])
    md = (report / "report.md").read_text()
    assert "## Target: Triton 26.11" in md and "Warning: published torchscript although Triton 26.11 may not load it" in md
