"""AOTInductor (torch-aoti) and OpenVINO: built, checked against eager at every dynamic-axis extreme and two
batch sizes, and published, through `aitune-export export` and through the backend API.

An AOTInductor compile is slow (C++ code generation and g++), so each model is compiled exactly once: by
one CLI run per model (module-scoped, both candidates), whose artifacts the API-level tests then load,
check and publish again. OpenVINO builds are cheap and are also built in-process through the API.

OpenVINO's runtime behaviour depends on the CPU: it computes in bf16 by default where the CPU supports
bf16, and Triton's openvino backend cannot ask for f32. The runner (and so the pipeline's check) uses
exactly what Triton will run, so on a bf16 CPU the pipeline rejects OpenVINO for an fp32 model; the
tests below assert the behaviour for the CPU they run on. The IR file itself is checked in f32, in a
fresh compiled model per shape, which is deterministic on every CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from optimizer.backend import BACKENDS, backend_named
from optimizer.backend.torch_aoti import CACHE_DIRNAME, CACHE_ENV, inductor_cache_dir
from optimizer.cli import main
from optimizer.model.reference import resolve_signature, run_reference
from optimizer.model.samples import ShapePoint, correctness_points, generate_feed, tile_feed
from optimizer.model.signature import Signature, parse_input_spec
from optimizer.model.source import load_model
from optimizer.records.artifact import Artifact
from optimizer.task.correctness import DEFAULT_TOLERANCES, compare_outputs
from optimizer.triton.config import rules
from optimizer.triton.config.model_config import canonical, parse
from optimizer.tune_strategy import default_backends
from tests.conftest import run_cli

CNN = "optimizer.examples.cnn:build"
TRANSFORMER = "optimizer.examples.transformer:build"
TRANSFORMER_ARGS = ("--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999")
LEAN = ("--max-batch-size", "4", "--eager-gate", "disabled", "--precision", "fp32")
"""--precision fp32: these tests are about OpenVINO's fp32 candidate (auto would build its bf16 one on a bf16 CPU)."""
OV_ANY_VERSION = ("--allow-version-mismatch",)
"""The pip openvino here may be newer than --triton-release's (then an explicit --backend openvino is refused); these
tests are about OpenVINO itself, not the release gate (tests/test_triton_releases.py)."""


def _load(spec: str):
    model = load_model(spec)
    if spec == TRANSFORMER:
        return model, resolve_signature(model, [parse_input_spec("input_ids:int64:1-128")], {"input_ids": (0, 999)})
    return model, resolve_signature(model)


def _points(sig: Signature) -> list[ShapePoint]:
    """Batch 1 and 3 at the min and max of every dynamic axis (the pipeline's own correctness points)."""
    points = correctness_points(sig)
    assert {p.batch for p in points} == {1, 3}
    return points


def _ov_default_precision() -> str:
    import openvino as ov

    return ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()


# -- fast checks: registry, defaults, availability, config rules -------------------------------------------


def test_both_backends_are_registered_and_in_the_aot_defaults_in_order():
    assert {"openvino", "torch-aoti"} <= set(BACKENDS)
    assert default_backends.aot(False) == ["torchscript", "onnxruntime", "openvino", "torch-aoti"]
    assert "openvino" not in default_backends.aot(True) and "torch-aoti" not in default_backends.aot(True)
    assert BACKENDS["torch-aoti"].triton_platform == "torch_aoti" and BACKENDS["openvino"]().model_filename == "model.xml"


def test_backends_command_lists_them_with_their_availability():
    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(main, ["backends", "--json"]).output)["backends"]}
    assert rows["openvino"]["available"] and rows["openvino"]["platform"] == "openvino"
    assert rows["torch-aoti"]["available"] and rows["torch-aoti"]["platform"] == "torch_aoti"
    cuda = {r["name"]: r for r in json.loads(CliRunner().invoke(main, ["backends", "--json", "--device", "cuda"]).output)["backends"]}
    assert not cuda["openvino"]["available"] and "runs on cpu" in cuda["openvino"]["reason"]


def test_torch_aoti_is_unavailable_without_a_cxx_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    av = backend_named("torch-aoti").availability("cpu", quick=True)
    assert not av and "/nonexistent/g++" in av.reason and "set CXX" in av.reason


def test_inductor_cache_goes_to_the_run_unless_the_user_chose_one(tmp_path, monkeypatch):
    workdir = tmp_path / "candidates" / "torch-aoti_cpu" / "artifact"
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert inductor_cache_dir(workdir) == (workdir.parent / CACHE_DIRNAME, "run")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert inductor_cache_dir(workdir) == (tmp_path / "mine", "environment")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(CACHE_ENV, default_cache_dir())  # what Inductor writes there itself on first use
    assert inductor_cache_dir(workdir)[1] == "run"


LOAD_PACKAGE = """import sys, numpy as np, torch, torch._inductor
runner = torch._inductor.aoti_load_package(sys.argv[1])
outs = runner(torch.from_numpy(np.load(sys.argv[2])))
np.savez(sys.argv[3], *[o.numpy() for o in (outs if isinstance(outs, (list, tuple)) else [outs])])
"""


@pytest.mark.slow
def test_a_torch_aoti_package_loads_where_the_models_output_type_is_unknown(tmp_path):
    """Hugging Face models return a ModelOutput, a type transformers registers with torch's pytree. A package exported with
    it in its output spec cannot be loaded where transformers is not imported (the measuring process, Triton): every such
    torch-aoti candidate failed to measure. A fresh process that never imports the model's module loads this one."""
    import subprocess
    import sys

    model = load_model("tests.fixtures.models:returns_pair_output")
    sig = resolve_signature(model)
    assert sig.output_names == ["output__0", "output__1"]
    art = backend_named("torch-aoti").build(model, sig, tmp_path / "aoti", (1, 4), "cpu")
    feed = generate_feed(sig, ShapePoint(3, "max"), seed=0)
    np.save(tmp_path / "x.npy", feed["x"])
    r = subprocess.run([sys.executable, "-c", LOAD_PACKAGE, str(art.path), str(tmp_path / "x.npy"), str(tmp_path / "outs.npz")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = np.load(tmp_path / "outs.npz")
    for i, want in enumerate(run_reference(model, sig.input_names, feed)):
        np.testing.assert_allclose(got[f"arr_{i}"], want, rtol=1e-5, atol=1e-6)


OV_CONFIG = """
name: "m"
backend: "openvino"
max_batch_size: 4
input { name: "x" data_type: TYPE_FP32 dims: [ 8 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }
instance_group { count: 1 kind: KIND_CPU }
parameters { key: "INFERENCE_NUM_THREADS" value { string_value: "2" } }
parameters { key: "NUM_STREAMS" value { string_value: "1" } }
parameters { key: "PERFORMANCE_HINT" value { string_value: "LATENCY" } }
parameters { key: "ENABLE_BATCH_PADDING" value { string_value: "YES" } }
"""


@pytest.mark.parametrize(
    "change, message",
    [
        (("kind: KIND_CPU", "kind: KIND_GPU"), "supports only CPU device"),
        (("string_value: \"1\"", "string_value: \"many\""), "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got many"),
        (("string_value: \"LATENCY\"", "string_value: \"FAST\""), "parameter PERFORMANCE_HINT is 'FAST'; the openvino backend accepts LATENCY, THROUGHPUT, CUMULATIVE_THROUGHPUT"),
        (("string_value: \"2\"", "string_value: \"two\""), "failed to convert INFERENCE_NUM_THREADS 'two' to integral number"),
    ],
)
def test_openvino_rules_quote_the_backend(change, message):
    config = parse(OV_CONFIG)
    assert rules.violations(config, rules.ArtifactFacts(directory_name="m")) == []
    bad = parse(OV_CONFIG.replace(*change))
    found = [v.message for v in rules.violations(bad, rules.ArtifactFacts(directory_name="m"))]
    assert any(message in m for m in found), found


def test_openvino_request_time_failures_are_warnings_and_outputs_may_come_from_model_xml():
    """Without batch padding the backend loads the model and fails requests of another batch size: a warning, not a
    refusal; and it fills inputs and outputs from model.xml, so a config without outputs loads."""
    facts = rules.ArtifactFacts(directory_name="m")
    unpadded = parse(OV_CONFIG.replace("ENABLE_BATCH_PADDING\" value { string_value: \"YES\"", "ENABLE_BATCH_PADDING\" value { string_value: \"NO\""))
    assert rules.violations(unpadded, facts) == []
    assert any("expected requests with batch size '4'" in w.message for w in rules.warnings(unpadded, facts))
    no_outputs = parse(OV_CONFIG.replace("output { name: \"y\" data_type: TYPE_FP32 dims: [ 2 ] }", ""))
    assert rules.violations(no_outputs, facts) == []


# -- one CLI run per model (the only AOTInductor compiles), and in-process OpenVINO builds ------------------


def _report(cwd: Path, name: str) -> dict:
    return json.loads((cwd / "aitune-reports" / name / "report.json").read_text())["result"]


def _candidate(result: dict, backend: str) -> dict:
    return next(c for c in result["candidates"] if c["backend"] == backend)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """model spec -> (run directory, completed process, report result) of
    `aitune-export export SPEC --backend torch-aoti --backend openvino --strategy first-wins --max-batch-size 4`."""
    runs: dict[str, tuple] = {}

    def get(spec: str):
        if spec not in runs:
            cwd = tmp_path_factory.mktemp("run")
            extra = TRANSFORMER_ARGS if spec == TRANSFORMER else ()
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv(CACHE_ENV, raising=False)  # so the run picks its own cache location
                r = run_cli("export", spec, *extra, "--backend", "torch-aoti", "--backend", "openvino", "--strategy", "first-wins",
                            *LEAN, *OV_ANY_VERSION, cwd=cwd)
            runs[spec] = (cwd, r, _report(cwd, default_name(spec)) if r.returncode == 0 else None)
        return runs[spec]

    return get


def default_name(spec: str) -> str:
    return spec.split(":")[0].rsplit(".", 1)[-1]


@pytest.fixture(scope="module")
def builds(tmp_path_factory, cli_runs):
    """(backend, model spec) -> (LoadedModel, Signature, Artifact): OpenVINO built here through the API,
    AOTInductor taken from the model's CLI run (its only compile)."""
    made: dict[tuple[str, str], tuple] = {}

    def get(backend: str, spec: str):
        if (backend, spec) not in made:
            model, sig = _load(spec)
            if backend == "torch-aoti":
                cwd, r, result = cli_runs(spec)
                assert r.returncode == 0, r.stderr
                art = Artifact.from_json(_candidate(result, backend)["artifact"])
                art.directory = str(cwd / art.directory)  # the report's paths are relative to where the CLI ran
            else:
                workdir = tmp_path_factory.mktemp(f"{backend}-{default_name(spec)}") / "artifact"
                art = backend_named(backend).build(model, sig, workdir, (1, 4), "cpu")
            made[(backend, spec)] = (model, sig, art)
        return made[(backend, spec)]

    return get


def _check_runner(backend: str, model, sig: Signature, art: Artifact) -> None:
    with backend_named(backend).load(art, "cpu", model) as runner:
        for i, point in enumerate(_points(sig)):
            feed = generate_feed(sig, point, seed=40 + i)
            case = compare_outputs(point.label, sig.output_names, [o.dtype.name for o in sig.outputs],
                                   runner.infer(feed), run_reference(model, sig.input_names, feed))
            assert case.passed, (point.label, case.outputs)


def _published_matches_eager(spec: str, model_dir: Path, cand: dict) -> None:
    art = Artifact.from_json(cand["artifact"])
    art.directory = str(model_dir / "1")
    model, sig = _load(spec)
    _check_runner(art.backend, model, sig, art)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [CNN, TRANSFORMER])
def test_cli_exports_torch_aoti_and_checks_openvino(cli_runs, spec):
    cwd, r, result = cli_runs(spec)
    assert r.returncode == 0, r.stderr
    name = default_name(spec)
    model_dir = cwd / "model_repository" / f"{name}__positional"  # behind the ensemble `name` that keeps the forward names
    front = parse((cwd / "model_repository" / name / "config.pbtxt").read_text())
    assert front.platform == "ensemble" and front.ensemble_scheduling.step[0].model_name == f"{name}__positional"
    config = parse((model_dir / "config.pbtxt").read_text())
    assert config.platform == "torch_aoti" and sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.pt2"]
    assert 1 <= config.max_batch_size <= 4 and config.instance_group[0].kind == 2  # KIND_CPU
    if spec == TRANSFORMER:  # the dynamic sequence axis is -1 in the config, the int64 ids TYPE_INT64
        assert list(config.input[0].dims) == [-1] and config.input[0].data_type == 9
    labels = {p.label for p in _points(_load(spec)[1])}
    aoti, ov = _candidate(result, "torch-aoti"), _candidate(result, "openvino")
    assert aoti["status"] == "passed" and result["selected"] == aoti["name"]
    meta = aoti["artifact"]["metadata"]
    work = (cwd / "aitune-reports" / name / "work").resolve()
    cache = (cwd / meta["inductor_cache"]).resolve()  # relative to where the CLI ran, like every path in the report
    assert meta["compile_s"] > 0 and meta["inductor_cache_from"] == "run" and work in cache.parents and any(cache.iterdir())
    _published_matches_eager(spec, model_dir, aoti)
    for cand in (aoti, ov):  # both were checked at batch 1 and 3, at the min and max of every dynamic axis
        assert {c["point"] for c in cand["correctness"]["cases"]} == labels
    assert ov["artifact"]["files"] == ["model.xml", "model.bin"]
    if ov["status"] != "passed":  # the reason says where and by how much (and why, when the CPU computes in bf16)
        assert ov["stage"] == "correctness" and any(p in ov["reason"] for p in labels)
        assert ("computes in" in ov["reason"]) == (_ov_default_precision() != "f32")


@pytest.mark.slow
@pytest.mark.parametrize("spec", [CNN, TRANSFORMER])
def test_torch_aoti_artifact_matches_eager_at_every_axis_extreme(builds, spec):
    model, sig, art = builds("torch-aoti", spec)
    assert art.files == ["model.pt2"] and art.path.stat().st_size > 0
    _check_runner("torch-aoti", model, sig, art)


def test_inductor_cache_is_set_only_around_the_compile(tmp_path, monkeypatch):
    from optimizer.backend.torch_aoti import inductor_cache

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "before"))
    with inductor_cache(tmp_path / "during"):
        assert os.environ[CACHE_ENV] == str(tmp_path / "during") and (tmp_path / "during").is_dir()
    assert os.environ[CACHE_ENV] == str(tmp_path / "before")


@pytest.mark.slow
@pytest.mark.parametrize("spec", [CNN, TRANSFORMER])
def test_openvino_ir_is_an_fp32_copy_of_the_model(builds, spec):
    import openvino as ov

    model, sig, art = builds("openvino", spec)
    assert art.files == ["model.xml", "model.bin"] and not (Path(art.directory) / "onnx").exists()
    core = ov.Core()
    ir = core.read_model(str(art.path))
    assert [p.get_names() for p in ir.inputs] == [{n} for n in sig.input_names]
    assert [p.get_names() for p in ir.outputs] == [{n} for n in sig.output_names]
    for port, spec_ in zip(ir.inputs, sig.inputs):  # batch and every declared dynamic axis stay dynamic
        shape = port.get_partial_shape()
        assert shape[0].is_dynamic and all(shape[i + 1].is_dynamic for i in spec_.dynamic_axes)
    weights = [op for op in ir.get_ops() if op.get_type_name() == "Constant" and op.get_output_element_type(0).is_real()]
    assert weights and all(op.get_output_element_type(0).to_string() == "f32" for op in weights)
    for i, point in enumerate(_points(sig)):
        # f32 and a fresh compiled model per shape: checks the file itself on any CPU (the runtime's own
        # precision and shape caches are the runner's business, tested below)
        compiled = core.compile_model(str(art.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        feed = generate_feed(sig, point, seed=60 + i)
        outs = compiled.create_infer_request().infer(feed)
        case = compare_outputs(point.label, sig.output_names, [o.dtype.name for o in sig.outputs],
                               [outs[compiled.output(n)] for n in sig.output_names], run_reference(model, sig.input_names, feed))
        assert case.passed, (point.label, case.outputs)


@pytest.mark.slow
def test_openvino_runner_runs_what_triton_will_run(builds):
    model, sig, art = builds("openvino", CNN)
    params = backend_named("openvino").triton_settings(art)["parameters"]
    assert params["ENABLE_BATCH_PADDING"] == "YES" and params["NUM_STREAMS"] == "1" and params["PERFORMANCE_HINT"] == "LATENCY"
    precision = _ov_default_precision()
    assert art.metadata["inference_precision"] == precision and art.metadata["weights"] == "f32"
    assert bool(art.metadata["numerics_note"]) == (precision != "f32")
    with backend_named("openvino").load(art, "cpu", model) as runner:
        compiled = runner._compiled
        for key in ("INFERENCE_NUM_THREADS", "NUM_STREAMS"):
            assert str(compiled.get_property(key)) == params[key]
        assert compiled.get_property("INFERENCE_PRECISION_HINT").to_string() == precision
        feed = generate_feed(sig, ShapePoint(3, "max"), seed=1)
        ref = run_reference(model, sig.input_names, feed)
        tol = DEFAULT_TOLERANCES["float32" if precision == "f32" else "bfloat16"]
        case = compare_outputs("batch=3", sig.output_names, ["float32"], runner.infer(feed), ref, {"": tol})
        assert case.passed, case.outputs


def _result_for(art: Artifact, sig: Signature, tmp: Path):
    """A TuneResult around an API-built artifact, with a real (short) measurement at batch 1..4."""
    from optimizer.records.candidate import Candidate
    from optimizer.records.measurements import BatchPolicy
    from optimizer.records.reference_set import ReferenceSet
    from optimizer.records.tune_result import TuneResult
    from optimizer.task.find_max_batch_size import find_max_batch_size
    from optimizer.task.profiling import ProfileSettings, measure

    backend = backend_named(art.backend)
    art.triton_settings = backend.triton_settings(art)
    base = tile_feed(generate_feed(sig, ShapePoint(1, "max"), seed=3), 1)
    quick = ProfileSettings(warmup_runs=1, window_s=0.03, stable_windows=2, time_cap_s=0.5)
    with backend.load(art, "cpu") as runner:
        decision = find_max_batch_size(
            lambda b: measure(lambda: runner.run_unchecked(tile_feed(base, b)), b, quick), BatchPolicy(max_batch_size=4), True)
    cand = Candidate(backend.candidate_name("cpu"), art.backend, "cpu", "passed", artifact=art, decision=decision)
    ref = ReferenceSet(str(tmp / "none.npz"), str(tmp / "none.npz"), [], str(tmp / "none.npz"))
    return TuneResult("m", {"kind": "callable", "spec": "-"}, sig.to_json(), "cpu", "one-backend", "aot", [cand], None,
                      cand.name, decision.max_batch_size, "API test", ref)


@pytest.mark.slow
def test_one_client_script_answers_for_the_aoti_and_the_onnxruntime_export(cli_runs, tmp_path):
    """The client contract (issue 26): one unchanged tritonclient script (input `image`, output `output__0`, model `cnn`)
    answers like eager whichever backend the CNN was exported with; torch-aoti's export is the one the tests above made."""
    from tests.test_client_contract import client_answers, cnn_input_and_eager_output

    cwd, r, result = cli_runs(CNN)
    assert r.returncode == 0 and result["selected"] == "torch-aoti[cpu]", r.stderr
    onnx = run_cli("export", CNN, "--backend", "onnxruntime", *LEAN, "--repository", str(tmp_path / "repo"), "--report-dir",
                   str(tmp_path / "report"), cwd=tmp_path)
    assert onnx.returncode == 0, onnx.stderr
    x, expected = cnn_input_and_eager_output()
    for repo, work in ((cwd / "model_repository", tmp_path / "aoti"), (tmp_path / "repo", tmp_path / "onnx")):
        work.mkdir()
        np.testing.assert_allclose(client_answers(repo, work, x), expected, rtol=1e-4, atol=1e-4)
    assert sorted(p.name for p in (cwd / "model_repository").iterdir()) == ["cnn", "cnn__positional"]
    assert [p.name for p in (tmp_path / "repo").iterdir()] == ["cnn"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch-aoti", "openvino"])
@pytest.mark.parametrize("spec", [CNN, TRANSFORMER])
def test_api_publish_writes_a_config_triton_accepts(builds, backend, spec, tmp_path):
    from optimizer.triton.repository.publish import PublishOptions, publish

    model, sig, art = builds(backend, spec)
    published = publish(_result_for(art, sig, tmp_path), PublishOptions(tmp_path / "repo", "m", io_names="positional"))
    version_dir = published.model_dir / "1"
    config = parse((published.model_dir / "config.pbtxt").read_text())
    assert rules.violations(config, rules.ArtifactFacts(directory_name="m")) == []
    if backend == "torch-aoti":  # the PyTorch backend addresses torch_aoti tensors by position
        assert [t.name for t in config.input] == [f"INPUT__{i}" for i in range(len(sig.inputs))]
        assert [t.name for t in config.output] == [f"OUTPUT__{i}" for i in range(len(sig.outputs))]
    else:
        assert [t.name for t in config.input] == sig.input_names and [t.name for t in config.output] == sig.output_names
    assert list(config.input[0].dims) == sig.inputs[0].triton_dims and config.instance_group[0].kind == 2  # KIND_CPU
    params = {k: v.string_value for k, v in config.parameters.items()}
    if backend == "openvino":
        assert config.backend == "openvino" and not config.platform
        assert sorted(p.name for p in version_dir.iterdir()) == ["model.bin", "model.xml"]
        assert params == backend_named("openvino").triton_settings(art)["parameters"]
    else:
        assert config.platform == "torch_aoti" and sorted(p.name for p in version_dir.iterdir()) == ["model.pt2"]
        assert params["INFERENCE_MODE"] == "true" and int(params["INTRA_OP_THREAD_COUNT"]) >= 1
    # the published files (not the build directory) load and answer like eager
    copy = Artifact.from_json(art.to_json())
    copy.directory = str(version_dir)
    if backend == "torch-aoti":
        _check_runner(backend, model, sig, copy)
    else:
        import openvino as ov

        compiled = ov.Core().compile_model(str(copy.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        feed = generate_feed(sig, ShapePoint(3, "max"), seed=9)
        outs = compiled.create_infer_request().infer(feed)
        case = compare_outputs("batch=3", sig.output_names, ["float32"], [outs[compiled.output(n)] for n in sig.output_names],
                               run_reference(model, sig.input_names, feed))
        assert case.passed, case.outputs


# -- OpenVINO and failure handling through `aitune-export export` ------------------------------------------


@pytest.mark.slow
def test_cli_exports_openvino_for_the_cnn_when_this_cpu_computes_in_f32(in_tmp):
    r = run_cli("export", CNN, "--backend", "openvino", *LEAN, *OV_ANY_VERSION, cwd=in_tmp)
    cand = _candidate(_report(in_tmp, "cnn"), "openvino")
    assert {c["point"] for c in cand["correctness"]["cases"]} == {p.label for p in _points(_load(CNN)[1])}
    model_dir = in_tmp / "model_repository" / "cnn"
    if _ov_default_precision() == "f32":
        assert r.returncode == 0, r.stderr
        config = parse((model_dir / "config.pbtxt").read_text())
        assert config.backend == "openvino" and sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.bin", "model.xml"]
        assert config.parameters["ENABLE_BATCH_PADDING"].string_value == "YES"
        _published_matches_eager(CNN, model_dir, cand)
    else:  # bf16 by default, and Triton's backend cannot ask for f32: rejected, with the reason, nothing published
        assert r.returncode == 1 and "no candidate can be published" in r.stderr
        assert cand["status"] == "failed" and cand["stage"] == "correctness"
        assert "differs from the reference" in cand["reason"] and f"computes in {_ov_default_precision()}" in cand["reason"]
        assert not model_dir.exists()


@pytest.mark.slow
def test_a_failing_aoti_compile_fails_only_its_candidate(in_tmp):
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "torch-aoti", "--backend", "onnxruntime",
                "--max-batch-size", "2", "--eager-gate", "disabled", cwd=in_tmp,
                env={"CXX": "false", "TORCHINDUCTOR_CACHE_DIR": str(in_tmp / "inductor")})  # a cached compile calls no compiler
    assert r.returncode == 0, r.stderr
    result = _report(in_tmp, "mlp")
    aoti = _candidate(result, "torch-aoti")
    assert aoti["status"] == "failed" and aoti["stage"] == "build"
    assert "AOTInductor compile failed (false)" in aoti["reason"]
    assert result["selected"] == "onnxruntime[cpu]"
    assert (in_tmp / "model_repository" / "mlp" / "1" / "model.onnx").is_file()


def test_a_dynamic_axis_the_model_fixes_is_named_in_the_torch_aoti_reason(tmp_path):
    """torch.export's own first line names only its Dim ("Constraints violated (axis1_1_50)!"): the reason says which
    input's axis the model fixed, to what, and what to do."""
    from optimizer.errors import BackendError

    model = load_model("tests.fixtures.models:gru_over_sequence")
    sig = resolve_signature(model, [parse_input_spec("seq:float32:1-12x4")])
    with pytest.raises(BackendError) as info:
        backend_named("torch-aoti").build(model, sig, tmp_path / "artifact", (1, 4), "cpu")
    reason = str(info.value)
    assert "seq axis 1 (1-12) to 12" in reason and "--input" in reason and "axis1_1_12" not in reason


def test_an_onnx_graph_that_bakes_in_a_dynamic_length_fails_its_build_with_the_axis(tmp_path):
    """torch.onnx.export kept the GRU's sequence input dynamic but fixed its output to the traced length: the candidate
    failed its correctness check with ONNX Runtime's "Reshape node ... requested shape:{50,-1,32}"."""
    from optimizer.backend.onnx_export import export_onnx
    from optimizer.errors import BackendError

    model = load_model("tests.fixtures.models:gru_over_sequence")
    sig = resolve_signature(model, [parse_input_spec("seq:float32:1-12x4")])
    with pytest.raises(BackendError, match=r"the exported graph fixes '(seq|output__0)' axis 1 to 12, which varies \(1-12\).*--input"):
        export_onnx(model, sig, tmp_path / "model.onnx", 4)
    transformer, tsig = _load(TRANSFORMER)  # a dynamic sequence the exporter keeps
    export_onnx(transformer, tsig, tmp_path / "transformer.onnx", 4)


# -- the OpenVINO stand-in's request handling, without a server ----------------------------------------------


class _FakeTensor:
    def __init__(self, name, array):
        self.name, self._array = name, np.asarray(array)

    def as_numpy(self):
        return self._array


class _FakeResponse:
    def __init__(self, output_tensors=None, error=None):
        self.output_tensors, self.error = output_tensors or [], error


def _fake_pb_utils():
    """A stand-in for triton_python_backend_utils, ONLY so the stand-in's numpy plumbing (batching, padding,
    splitting, errors, dtypes) can run without a server. It is not Triton; serving is tested end to end
    with the real tritonserver by the validation tests."""
    import types

    from tritonclient.utils import triton_to_np_dtype

    mod = types.ModuleType("triton_python_backend_utils")
    mod.Tensor = _FakeTensor
    mod.InferenceResponse = _FakeResponse
    mod.TritonError = lambda msg: msg
    mod.TritonModelException = type("TritonModelException", (Exception,), {})
    mod.triton_string_to_numpy = lambda s: triton_to_np_dtype(s[len("TYPE_"):])
    mod.get_input_tensor_by_name = lambda request, name: request[name]
    mod.Logger = types.SimpleNamespace(log_info=lambda msg: None)
    return mod


@pytest.fixture
def standin(monkeypatch):
    import importlib.util
    import sys

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    path = Path(__file__).resolve().parents[1] / "optimizer" / "triton" / "runtime" / "standin_backends" / "openvino" / "model.py"
    spec = importlib.util.spec_from_file_location("openvino_standin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _standin_model(standin, repo_model: Path, config_text: str):
    from google.protobuf import json_format

    cfg = json_format.MessageToDict(parse(config_text), preserving_proto_field_name=True)
    model = standin.TritonPythonModel()
    model.initialize({"model_config": json.dumps(cfg), "model_repository": str(repo_model), "model_version": "1",
                      "model_name": repo_model.name, "model_instance_kind": "CPU"})
    return model


@pytest.mark.slow
def test_openvino_standin_batches_pads_and_splits_like_the_native_backend(builds, standin, tmp_path):
    from optimizer.triton.repository.publish import PublishOptions, publish

    model, sig, art = builds("openvino", CNN)
    published = publish(_result_for(art, sig, tmp_path), PublishOptions(tmp_path / "repo", "m"))
    config = parse((published.model_dir / "config.pbtxt").read_text())
    config.max_batch_size = mbs = 4  # whatever the short measurement chose: padding needs room above one request
    text = canonical(config)
    served = _standin_model(standin, published.model_dir, text)
    feeds = [generate_feed(sig, ShapePoint(1, "max"), seed=s) for s in range(mbs)]
    responses = served.execute([{"image": _FakeTensor("image", f["image"])} for f in feeds[:2]])  # 2 requests, padded to mbs
    assert all(r.error is None for r in responses)
    tol = DEFAULT_TOLERANCES["float32" if _ov_default_precision() == "f32" else "bfloat16"]
    for feed, response in zip(feeds, responses):
        (out,) = response.output_tensors
        assert out.name == "output__0" and out.as_numpy().shape == (1, 10) and out.as_numpy().dtype == np.float32
        case = compare_outputs("one", ["output__0"], ["float32"], [out.as_numpy()], run_reference(model, ["image"], feed), {"": tol})
        assert case.passed, case.outputs
    too_many = served.execute([{"image": _FakeTensor("image", np.concatenate([f["image"] for f in feeds] * 2))}])
    assert "max allowed is" in too_many[0].error
    unpadded = _standin_model(standin, published.model_dir, text.replace('string_value: "YES"', 'string_value: "NO"'))
    refused = unpadded.execute([{"image": _FakeTensor("image", feeds[0]["image"])}])
    assert f"expected requests with batch size '{mbs}', got '1'" in refused[0].error
    with pytest.raises(standin.pb_utils.TritonModelException, match="allowed inputs are: image"):
        _standin_model(standin, published.model_dir, text.replace('name: "image"', 'name: "pixels"'))
    with pytest.raises(standin.pb_utils.TritonModelException, match="supports only CPU device"):
        cfg = {"model_config": "{}", "model_repository": str(published.model_dir), "model_version": "1", "model_name": "m",
               "model_instance_kind": "GPU"}
        standin.TritonPythonModel().initialize(cfg)


@pytest.mark.slow
def test_openvino_is_served_by_its_stand_in_in_the_real_tritonserver(in_tmp: Path):
    """End to end: the openvino config loads in tritonserver 2.51 through the stand-in and answers like eager.

    --tolerance 0.05 admits OpenVINO's bf16 arithmetic on CPUs that have it (the default fp32 bounds reject it
    there, see README); the same tolerance is what validation compares with.
    """
    r = run_cli("export", "--backend", "openvino", "--precision", "fp32", "--tolerance", "0.05", "--max-batch-size", "4", "--eager-gate", "disabled",
                *OV_ANY_VERSION, "--validate", "--validate-concurrency", "1:2", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    validation = json.loads((in_tmp / "aitune-reports" / "cnn" / "validation.json").read_text())
    assert validation["status"] == "passed" and validation["loaded"] and validation["stand_in"]
    assert validation["platform"] == "openvino" and all(a["passed"] for a in validation["answers"])
    assert validation["oversize"]["refused"] and validation["perf"]["rows"]
    assert json.loads((in_tmp / "aitune-reports" / "cnn" / "report.json").read_text())["result"]["tolerances"] == {"": [0.05, 0.05]}
