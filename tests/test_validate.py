"""`aitune-export validate` and `export --validate` against the real tritonserver 2.51 and perf_analyzer 2.51.

The bundled CNN is exported once per backend (small max batch, eager baseline off, to stay quick) and
validated; broken or unservable repositories must fail with Triton's own words or be reported as not
validated, never as passed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli, tree_snapshot
from tests.test_triton_server import write_double_model

EXPORT = ("export", "--max-batch-size", "2", "--eager-gate", "disabled")
QUICK = ("--measurement-interval", "300")
"""Short perf_analyzer windows for the cases that check loading and answers, not the figures: a smoke check's setting."""


def _record(folder: Path) -> dict:
    return json.loads((folder / "validation.json").read_text())


def _assert_validated(record: dict, levels: set[int]) -> None:
    """Loaded, right answers on both protocols, oversize refused, a perf sweep, all labelled as a stand-in."""
    assert record["status"] == "passed", record["reason"]
    assert record["loaded"] and record["stand_in"] and "stand-in backend" in record["served_by"]
    answers = {a["protocol"]: a for a in record["answers"]}
    assert set(answers) == {"http", "grpc"}
    for a in answers.values():
        assert a["passed"] and a["compared_with"] == "reference"
        assert [c["point"] for c in a["cases"]] == ["batch=1,axes=max", "batch=3,axes=max"]  # batch 3 > max 2: sent in slices
        assert a["max_abs"] < 1e-4
    assert record["oversize"]["refused"] and record["oversize"]["batch"] == 3
    assert "batch-size must be <= 2" in record["oversize"]["message"]
    perf = record["perf"]
    rows = perf["rows"]
    assert rows and all(r["throughput"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert {r["concurrency"] for r in rows} | set(perf["unstable"]) == levels
    assert all(1 <= r["server_batch"] <= 2 for r in rows if r["server_batch"])
    assert record["predicted_throughput"] > 0 and record["throughput_ratio"] == pytest.approx(perf["best_throughput"] / record["predicted_throughput"], rel=1e-2)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("validate")


@pytest.fixture(scope="module")
def ort_export(work: Path):
    """ONNX Runtime winner, published and validated in one `export --validate` run."""
    r = run_cli(*EXPORT, "--backend", "onnxruntime", "--repository", "repo_ort", "--report-dir", "rep_ort",
                "--validate", "--validate-concurrency", "1:4:3", cwd=work)
    return r


@pytest.fixture(scope="module")
def ts_export(work: Path):
    r = run_cli(*EXPORT, "--backend", "torchscript", "--repository", "repo_ts", "--report-dir", "rep_ts", cwd=work)
    assert r.returncode == 0, r.stderr
    return work / "repo_ts"


@pytest.mark.slow
def test_export_validate_proves_the_onnxruntime_model_in_triton(ort_export, work: Path):
    assert ort_export.returncode == 0, ort_export.stderr
    record = _record(work / "rep_ort")
    _assert_validated(record, {1, 4})
    assert record["platform"] == "onnxruntime_onnx" and record["export_report"].endswith("rep_ort/report.json")
    out = ort_export.stdout
    assert "validation of cnn (onnxruntime_onnx)" in out and ": passed [stand-in backend]" in out
    assert "answers over grpc: match the eager reference" in out
    assert "no served prediction (the served search did not run): in-process" in out  # not a ratio to an in-process peak
    assert record["perf"]["settings"]["protocol"] == "grpc"  # the local server's protocol even without a served search
    data = json.loads((work / "rep_ort" / "perf_analyzer_input.json").read_text())["data"]
    assert data and all(d["image"]["shape"] == [3, 64, 64] for d in data)  # the run's traffic: one shape, no dynamic axis
    assert "traffic" in record["traffic"] and "perf_analyzer" in out and "sending the export's traffic" in out
    assert not any(p.name.endswith(".json") for p in (work / "repo_ort").rglob("*"))  # nothing written into the repository


@pytest.mark.slow
@pytest.mark.serial  # beside another worker's export, Triton 2.51's python backend declared this model's stub "not healthy"
# while perf_analyzer waited for concurrency 1 to settle, then crashed (SIGSEGV, boost lock_exception): CI failed on it
def test_validate_measures_a_local_server_over_the_served_search_protocol(ts_export: Path, work: Path):
    """No --protocol: perf_analyzer measures the local server over gRPC, as the export's served search did (perf_analyzer
    2.51's HTTP client can stall with dozens of clients on a few cores)."""
    r = run_cli("validate", str(ts_export), "--concurrency", "1", "--json", cwd=work)
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record == _record(work / "rep_ts")  # the export's report folder was found from the repository
    _assert_validated(record, {1})
    assert record["platform"] == "pytorch_libtorch" and record["perf"]["settings"]["protocol"] == "grpc"
    assert "-i grpc" in " ".join(record["perf"]["command"])


@pytest.mark.slow
def test_wrong_dims_fail_with_tritons_message(ort_export, ts_export: Path, work: Path):
    for source, report, expected in (
        (work / "repo_ort" / "cnn", work / "rep_ort", "the model expects 4 dimensions (shape [-1, 3, 64, 64])"),  # refused at load
        (ts_export / "cnn", work / "rep_ts", "unexpected shape for input 'image' for model 'cnn'"),  # refused per request
    ):
        repo = work / f"bad_{source.parent.name}"
        shutil.copytree(source, repo / "cnn")
        config = repo / "cnn" / "config.pbtxt"
        config.write_text(config.read_text().replace("dims: [3, 64, 64]", "dims: [3, 32, 32]"))
        out = work / f"out_{source.parent.name}"
        out.mkdir()
        shutil.copy(report / "report.json", out)  # the export's report and samples, without touching its validation.json
        shutil.copytree(report / "samples", out / "samples")
        r = run_cli("validate", str(repo), "--report", str(out), "--concurrency", "1", *QUICK, cwd=work)
        assert r.returncode == 1, r.stderr
        error = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
        assert len(error) == 1 and expected in error[0], r.stderr
        assert "Traceback" not in r.stderr
        record = _record(out)
        assert record["status"] == "failed" and expected in record["reason"] and record["perf"] is None
        shutil.rmtree(repo)
        shutil.rmtree(out)  # its copy of report.json would claim the good model for later tests


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda c: c.replace('platform: "onnxruntime_onnx"', 'platform: "tensorrt_plan"'), "TensorRT and a GPU"),
        (lambda c: c.replace("kind: KIND_CPU", "kind: KIND_GPU"), "KIND_GPU and this machine has no GPU"),
        (lambda c: c.replace('platform: "onnxruntime_onnx"', 'backend: "tensorflow"'), "no 'tensorflow' backend"),
    ],
)
def test_what_the_local_server_cannot_serve_is_not_validated_never_passed(edit, reason, tmp_path: Path):
    model = write_double_model(tmp_path / "repo")
    (model / "config.pbtxt").write_text(edit((model / "config.pbtxt").read_text()))
    r = run_cli("validate", str(tmp_path / "repo"), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "not validated" in r.stdout and "passed" not in r.stdout
    assert reason in r.stderr
    record = _record(tmp_path / "aitune-reports" / "double")  # beside the repository, never inside it
    assert record["status"] == "not validated" and not record["loaded"]


@pytest.mark.parametrize(
    "header, status, words",
    [
        # Triton's core takes the backend from default_model_filename when the config names none, so this model loads
        ('default_model_filename: "model.onnx"', "passed", "passed"),
        # server qa/L0_model_config/special_cases/invalid_platform: the file names onnxruntime, which the misspelt platform is not
        ('platform: "onnxruntim"\ndefault_model_filename: "model.onnx"', "failed",
         "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime"),
    ],
)
def test_the_default_model_filename_names_the_backend_as_in_triton(header, status, words, tmp_path: Path):
    model = write_double_model(tmp_path / "repo")
    (model / "config.pbtxt").write_text((model / "config.pbtxt").read_text().replace('platform: "onnxruntime_onnx"', header))
    r = run_cli("validate", str(tmp_path / "repo"), *QUICK, "--concurrency", "1:1", cwd=tmp_path)
    assert r.returncode == (0 if status == "passed" else 1), r.stderr
    assert words in r.stdout + r.stderr
    assert _record(tmp_path / "aitune-reports" / "double")["status"] == status


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["missing_repo"], "is not a directory"),
        (["repo", "--model", "nope"], "model 'nope' is not in"),
        (["two"], "holds 2 models (a, b); choose one with --model"),
        (["repo", "--url", "127.0.0.1:1", "--local"], "either --url"),
        (["repo", "--report", "repo/double/out"], "inside the repository"),
        (["repo", "--concurrency", "8:1"], "--concurrency '8:1'"),
        (["repo", "--protocol", "udp"], "Invalid value for '--protocol'"),
    ],
)
def test_bad_usage_exits_2_and_writes_nothing(args, fragment, tmp_path: Path):
    write_double_model(tmp_path / "repo")
    write_double_model(tmp_path / "two", "a")
    write_double_model(tmp_path / "two", "b")
    before = tree_snapshot(tmp_path)
    r = run_cli("validate", *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert fragment in r.stderr and "Traceback" not in r.stderr
    assert tree_snapshot(tmp_path) == before


def test_backends_says_whether_the_validation_tools_were_found():
    r = run_cli("backends", "--json")
    assert r.returncode == 0, r.stderr
    tools = {t["name"]: t for t in json.loads(r.stdout)["tools"]}
    assert tools["tritonserver"]["found"] and tools["tritonserver"]["path"].endswith("bin/tritonserver")
    assert "onnxruntime" in tools["tritonserver"]["reason"] and "pytorch" in tools["tritonserver"]["reason"]
    assert tools["perf_analyzer"]["found"], tools["perf_analyzer"]["reason"]
    plain = run_cli("backends")
    assert "tritonserver   found" in plain.stdout and "perf_analyzer  found" in plain.stdout


@pytest.mark.slow
def test_validate_against_a_running_server_with_url(ort_export, work: Path):
    from optimizer.triton.runtime.server import LocalTritonServer

    assert ort_export.returncode == 0, ort_export.stderr
    with LocalTritonServer(work / "repo_ort") as server:  # stands for a server someone else runs
        r = run_cli("validate", str(work / "repo_ort"), "--url", server.http_url, "--concurrency", "1",
                    "--report", str(work / "remote"), cwd=work)
        assert server.client("http").is_model_ready("cnn")  # validate asked the explicit-mode server to load it
    assert r.returncode == 0, r.stderr
    record = _record(work / "remote")
    assert record["status"] == "passed" and record["server"] == server.http_url
    assert [a["protocol"] for a in record["answers"]] == ["http"]  # only the protocol of --url is known
    assert record["perf"]["settings"]["protocol"] == "http"  # the port given is taken to speak HTTP
    assert record["stand_in"] and record["perf"]["rows"][0]["throughput"] > 0
    assert record["export_report"].endswith("rep_ort/report.json")  # found from the repository, though --report is elsewhere
    assert record["answers"][0]["compared_with"] == "reference" and record["throughput_ratio"] > 0


@pytest.mark.slow
def test_a_model_without_batching_and_without_a_report(tmp_path: Path):
    config = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input {{ name: "x" data_type: TYPE_FP32 dims: [-1, 3] }}
output {{ name: "y" data_type: TYPE_FP32 dims: [-1, 3] }}
instance_group {{ count: 1 kind: KIND_CPU }}
"""
    write_double_model(tmp_path / "repo", config=config)
    r = run_cli("validate", str(tmp_path / "repo" / "double"), "--concurrency", "1", *QUICK, "--json", cwd=tmp_path)  # REPO may be the model folder
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["status"] == "passed" and record["oversize"] is None  # nothing to refuse without a batch axis
    assert [a["compared_with"] for a in record["answers"]] == ["none", "none"] and all(a["passed"] for a in record["answers"])
    assert record["predicted_throughput"] is None and record["throughput_ratio"] is None
    data = json.loads((tmp_path / "aitune-reports" / "double" / "perf_analyzer_input.json").read_text())["data"]  # beside the repository
    assert data[0]["x"]["shape"] == [1, 3]


@pytest.mark.slow
def test_a_string_model_like_tritons_own_is_served_answered_and_measured(tmp_path: Path):
    """A TYPE_STRING model (Triton's simple_identity, here in ONNX): the onnxruntime stand-in loads it as the native
    backend does, and validate builds its requests (BYTES go to perf_analyzer as strings), answers and measures it."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", "n"])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (tmp_path / "repo" / "simple_identity" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "repo" / "simple_identity" / "1" / "model.onnx"))
    (tmp_path / "repo" / "simple_identity" / "config.pbtxt").write_text(
        'name: "simple_identity"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n')
    r = run_cli("validate", str(tmp_path / "repo"), "--concurrency", "1:2", *QUICK, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["status"] == "passed" and all(a["passed"] for a in record["answers"])
    assert record["oversize"]["refused"] and "must be <= 8" in record["oversize"]["message"]
    assert [row["concurrency"] for row in record["perf"]["rows"]] == [1, 2]
    data = json.loads((tmp_path / "aitune-reports" / "simple_identity" / "perf_analyzer_input.json").read_text())["data"]
    assert data[0]["INPUT0"] == {"content": ["aitune"], "shape": [1]}  # BYTES go to perf_analyzer as strings


def test_the_measurement_interval_reaches_validate_and_a_slow_models_window_only_grows_from_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """--measurement-interval reaches validate, and a slow model's window is only ever lengthened from it."""
    from click.testing import CliRunner

    import optimizer.triton.measure.validation as validation
    from optimizer.cli import main
    from optimizer.triton.runtime.perf_analyzer import PerfSettings
    from optimizer.triton.measure.validation.checks import window_for

    seen = {}

    class Stop(Exception):
        pass

    def fake_validate(repository, model=None, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(validation, "validate", fake_validate)
    CliRunner().invoke(main, ["validate", str(tmp_path), "--measurement-interval", "300"])
    assert seen["measurement_interval_ms"] == 300
    short = PerfSettings(measurement_interval_ms=300)
    assert window_for(short, 1.0) == 300 and window_for(short, 50.0) == 1000  # 20 requests of 50 ms need a 1 s window


def _onnx_model(path: Path, nodes, inputs, outputs, initializers=()) -> None:
    import onnx
    from onnx import helper

    model = helper.make_model(helper.make_graph(nodes, path.parent.parent.name, inputs, outputs, list(initializers)),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


@pytest.mark.slow
def test_the_onnxruntime_stand_in_completes_configs_and_takes_optional_inputs_as_the_native_backend_does(tmp_path: Path):
    """Triton's own kinds of config the native backend loads: none at all (it fills max_batch_size 4 and a dynamic
    batcher when every first axis is variable), and an optional input that the graph gives a default (an overridable
    initializer), which a request may leave out. Validate finds a model with no config.pbtxt, the stand-in completes
    it batched as the native backend does, and it serves a request without the optional input."""
    from onnx import TensorProto, helper

    from optimizer.triton.runtime.server import LocalTritonServer

    repo = tmp_path / "repo"
    _onnx_model(repo / "autofill" / "1" / "model.onnx", [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
                [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])])
    # no config.pbtxt at all: Triton's core finds the backend from model.onnx, the backend completes the rest
    _onnx_model(repo / "optional" / "1" / "model.onnx", [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])],
                [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [1, 16]),
                 helper.make_tensor_value_info("INPUT1", TensorProto.FLOAT, [1, 16])],
                [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [1, 16])],
                [helper.make_tensor("INPUT1", TensorProto.FLOAT, [1, 16], [100.0] * 16)])
    (repo / "optional" / "config.pbtxt").write_text(
        'name: "optional"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },\n'
        '        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] optional: true } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]\n')
    r = run_cli("validate", str(repo), "--model", "autofill", "--concurrency", "1", *QUICK, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["oversize"]["refused"] and "must be <= 4" in record["oversize"]["message"]  # served batched, as natively
    assert any("has no config.pbtxt: Triton completed one" in n for n in record["notes"])
    import tritonclient.http as http

    with LocalTritonServer(repo) as server:
        server.load("optional")
        client = server.client("http")
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        only = http.InferInput("INPUT0", [1, 16], "FP32")
        only.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("optional", [only]).as_numpy("OUTPUT0"), x + 100)  # the graph's default
        given = http.InferInput("INPUT1", [1, 16], "FP32")
        given.set_data_from_numpy(np.ones((1, 16), np.float32))
        np.testing.assert_array_equal(client.infer("optional", [only, given]).as_numpy("OUTPUT0"), x + 1)


@pytest.mark.slow
def test_an_ensemble_of_two_steps_on_stand_ins_says_so_in_its_verdict(tmp_path: Path):
    """Triton's own kind of ensemble (two ONNX steps, not the optimizer's one-step front): every step is looked at, so
    the verdict names both steps as served by a stand-in backend."""
    from onnx import TensorProto, helper

    repo = tmp_path / "repo"
    for name, op in (("double", "Add"), ("negate", "Neg")):
        _onnx_model(repo / name / "1" / "model.onnx", [helper.make_node(op, ["X", "X"] if op == "Add" else ["X"], ["Y"])],
                    [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])])
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
                                                  'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                                                  'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(
        'name: "pipeline"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\noutput [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'ensemble_scheduling { step [\n'
        '  { model_name: "double" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },\n'
        '  { model_name: "negate" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } } ] }\n')
    r = run_cli("validate", str(repo), "--model", "pipeline", "--concurrency", "1", *QUICK, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["stand_in"] and "'double', 'negate' run on a stand-in backend" in record["served_by"], record["served_by"]


SEQUENCE_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            key = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0])
            self.sums[key] = (0 if start else self.sums.get(key, 0)) + value
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[self.sums[key]]], np.int32))]))
        return responses
"""


@pytest.mark.slow
def test_a_sequence_model_like_tritons_simple_sequence_is_validated(tmp_path: Path):
    """Triton refuses a request to a sequence batcher without a correlation ID: validate sends each request as a
    one-request sequence of its own, so such a model is validated."""
    (tmp_path / "repo" / "accumulate" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "accumulate" / "1" / "model.py").write_text(SEQUENCE_MODEL)
    (tmp_path / "repo" / "accumulate" / "config.pbtxt").write_text("""name: "accumulate"
backend: "python"
max_batch_size: 1
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""")
    r = run_cli("validate", str(tmp_path / "repo"), "--concurrency", "1", *QUICK, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["status"] == "passed" and [a["passed"] for a in record["answers"]] == [True, True]
    assert record["perf"]["rows"][0]["throughput"] > 0


DECOUPLED_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for i in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x + i).astype(np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.mark.slow
def test_a_decoupled_model_is_not_validated_and_the_reason_says_how_to_measure_it(tmp_path: Path):
    """Triton answers a decoupled model over gRPC streaming only: validate reports it as not validated, with how to
    measure it, not as a wrong answer."""
    (tmp_path / "repo" / "repeat" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "repeat" / "1" / "model.py").write_text(DECOUPLED_MODEL)
    (tmp_path / "repo" / "repeat" / "config.pbtxt").write_text(
        'name: "repeat"\nbackend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\noutput [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    r = run_cli("validate", str(tmp_path / "repo"), "--concurrency", "1", *QUICK, "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    record = json.loads(r.stdout)
    assert record["status"] == "not validated" and record["loaded"] and record["perf"] is None
    assert "decoupled" in record["reason"] and "--streaming" in record["reason"]


def test_each_answer_check_request_to_a_sequence_model_is_a_sequence_of_its_own():
    from optimizer.triton.measure.client import one_request_sequence

    assert one_request_sequence({"max_batch_size": 8}) == {}
    first, second = one_request_sequence({"sequence_batching": {}}), one_request_sequence({"sequence_batching": {}})
    assert first["sequence_start"] and first["sequence_end"] and first["sequence_id"] != second["sequence_id"] > 0
    text = {"sequence_batching": {"control_input": [{"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_STRING"}]}]}}
    assert isinstance(one_request_sequence(text)["sequence_id"], str)


def test_the_onnxruntime_stand_in_hands_text_to_onnxruntime_and_bytes_back():
    """Triton gives a TYPE_STRING input as bytes; ONNX Runtime would store bytes as their repr ("b'ab'")."""
    import importlib.util
    import sys
    import types

    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    path = Path(__file__).parents[1] / "optimizer" / "triton" / "runtime" / "standin_backends" / "onnxruntime" / "model.py"
    spec = importlib.util.spec_from_file_location("ort_standin", path)
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
    sent = np.array([[b"ab", "caf\u00e9".encode()]], dtype=object)
    assert standin._text_in(sent).tolist() == [["ab", "caf\u00e9"]]
    assert standin._text_out(np.array([["ab", "caf\u00e9"]], dtype=object)).tolist() == sent.tolist()
    assert standin._text_in(np.ones(2, np.float32)).dtype == np.float32


def test_a_model_folder_without_a_config_is_found_as_triton_finds_it(tmp_path: Path):
    from optimizer.errors import RepositoryError
    from optimizer.triton.measure.validation import resolve_target

    (tmp_path / "repo" / "bare" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "bare" / "1" / "model.onnx").write_bytes(b"")
    (tmp_path / "repo" / "notes").mkdir()  # a folder with no version and no model file is not a model
    target = resolve_target(tmp_path / "repo", None)
    assert (target.name, target.backend, target.completed) == ("bare", "onnxruntime", True)
    assert resolve_target(tmp_path / "repo" / "bare", None).name == "bare"  # REPO may be the model folder
    with pytest.raises(RepositoryError, match="holds no model .*config.pbtxt.*model.onnx"):
        resolve_target(tmp_path / "repo" / "notes", None)
    (tmp_path / "repo" / "other").mkdir()
    (tmp_path / "repo" / "other" / "config.pbtxt").write_text('name: "other"\nbackend: "onnxruntime"\n')
    with pytest.raises(RepositoryError, match=r"holds 2 models \(bare, other\); choose one"):  # beside a configured one
        resolve_target(tmp_path / "repo", None)


def test_the_versions_a_server_holds_ready_are_read_from_its_repository_index():
    """A version_policy can serve several versions while requests without a version reach only the newest: validate names them."""
    from optimizer.triton.measure.client import ready_versions, response_cache_enabled

    class Http:
        __module__ = "tritonclient.http._client"

        def get_model_repository_index(self):
            return [{"name": "m", "version": "2", "state": "READY"}, {"name": "m", "version": "1", "state": "READY"},
                    {"name": "m", "version": "3", "state": "UNAVAILABLE"}, {"name": "other", "version": "7", "state": "READY"}]

    assert ready_versions(Http(), "m") == [1, 2]
    assert response_cache_enabled({"response_cache": {"enable": True}}) and not response_cache_enabled({})


def test_the_export_report_is_found_from_the_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from optimizer.triton.measure.validation import find_export_report, resolve_target

    model = write_double_model(tmp_path / "repo")
    elsewhere = write_double_model(tmp_path / "other_repo")

    def report(folder: Path, model_dir: Path, mtime: int) -> Path:
        folder.mkdir(parents=True)
        (folder / "report.json").write_text(json.dumps({"published": {"model_dir": str(model_dir), "version": 1}}))
        os.utime(folder / "report.json", ns=(mtime, mtime))
        return folder / "report.json"

    report(tmp_path / "aitune-reports" / "double", elsewhere, 3_000_000_000)  # same name, another repository: not ours
    old = report(tmp_path / "aitune-reports" / "old", model, 1_000_000_000)
    new = report(tmp_path / "custom_reports", model, 2_000_000_000)  # a later export with --report-dir custom_reports
    monkeypatch.chdir(tmp_path / "repo")  # found beside the repository, not only in the working directory
    target = resolve_target(tmp_path / "repo", None)
    assert find_export_report(target) == new.resolve()
    assert find_export_report(target, old.parent) == old.parent / "report.json"  # --report wins
    new.unlink()
    assert find_export_report(target) == old.resolve()



def test_the_export_reference_is_read_from_the_typed_report(tmp_path: Path):
    from optimizer.errors import RepositoryError
    from optimizer.triton.measure.validation import load_export_reference
    from tests.conftest import ROOT

    folder = tmp_path / "rep"
    (folder / "samples").mkdir(parents=True)
    for name in ("samples.npz", "reference_outputs.npz"):  # the recorded paths are gone: the report's own samples/ is used
        (folder / "samples" / name).write_bytes(b"")
    doc = json.loads((ROOT / "tests" / "fixtures" / "report_cnn.json").read_text())
    doc["result"]["tolerances"] = {"": [1e-3, 1e-2]}
    (folder / "report.json").write_text(json.dumps(doc))
    ref = load_export_reference(folder / "report.json")
    assert ref.candidate == "onnxruntime[cpu]" and ref.predicted_batch == 8 and ref.predicted_throughput > 0
    assert ref.feeds == folder / "samples" / "samples.npz" and ref.points == ["batch=1,axes=max", "batch=3,axes=max"]
    assert ref.input_names == ["image"] and ref.output_names == ["output__0"]
    assert (ref.tolerances[""].atol, ref.tolerances[""].rtol) == (1e-3, 1e-2)
    doc["result"]["selected"] = None  # nothing selected: the samples still count, there is no prediction
    (folder / "report.json").write_text(json.dumps(doc))
    assert load_export_reference(folder / "report.json").predicted_throughput is None
    (folder / "report.json").write_text(json.dumps({"published": {}}))
    with pytest.raises(RepositoryError, match=r"is not an aitune-export report \(KeyError: 'result'\); point --report at"):
        load_export_reference(folder / "report.json")

@pytest.mark.long  # a benchmark's smoke run (the emitted config against a naive one): make test-long runs it
def test_served_throughput_benchmark_compares_with_a_naive_config(ort_export, work: Path):
    import re
    import subprocess
    import sys

    from tests.conftest import ROOT

    assert ort_export.returncode == 0, ort_export.stderr
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "served_throughput.py"), str(work / "repo_ort"), "--rounds", "1",
                        "--concurrency", "4"], cwd=work, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert re.search(r"round 1 cnn_naive .* server batch 1\.00", r.stdout)  # the naive model never batches
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"served_throughput model=cnn emitted=([\d.]+) naive=([\d.]+) ratio=([\d.]+)", last)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0
    assert float(m.group(3)) == pytest.approx(float(m.group(1)) / float(m.group(2)), rel=0.02)


def test_a_reshaped_output_is_compared_in_the_shape_clients_receive():
    """A per-sample scalar is published as `dims: [1] reshape { shape: [] }`: Triton answers [batch, 1] while the eager
    reference is [batch]; the check compares the two as clients see them, and a real shape difference still shows."""
    import numpy as np

    from optimizer.triton.measure.answers import as_served

    ref = np.arange(3, dtype=np.float32)
    spec = {"name": "output__1", "data_type": "TYPE_FP32", "dims": ["1"], "reshape": {}}
    assert as_served(ref, spec, batching=True).shape == (3, 1)
    assert as_served(ref, {**spec, "reshape": {"shape": []}}, batching=True).tolist() == [[0.0], [1.0], [2.0]]
    assert as_served(ref, {k: v for k, v in spec.items() if k != "reshape"}, batching=True).shape == (3,)  # no reshape: as is
    assert as_served(ref, {**spec, "dims": ["2"]}, batching=True).shape == (3,)  # 3 values cannot be [3, 2]: left for the check


def test_a_reshaped_input_is_sent_in_the_configs_dims():
    """A per-sample scalar input (`dims: [1] reshape { shape: [] }`) goes out as [batch, 1]: sent as the model's own
    [batch], Triton refused it ("unexpected shape for input 'idx' ... Expected [-1,1], got [1]")."""
    import numpy as np

    from optimizer.triton.measure.client import as_sent

    idx = np.array([1, 2, 3], dtype=np.int32)
    spec = {"name": "idx", "data_type": "TYPE_INT32", "dims": ["1"], "reshape": {}}
    assert as_sent(idx, spec, batching=True).shape == (3, 1)
    assert as_sent(idx, {k: v for k, v in spec.items() if k != "reshape"}, batching=True).shape == (3,)
    assert as_sent(np.ones((2, 4)), {**spec, "dims": ["-1"], "reshape": {"shape": ["4"]}}, batching=True).shape == (2, 4)
