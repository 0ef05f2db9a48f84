"""`aitune-export export-many PLAN`: the plan is checked whole, a failed model never stops the others, Ray runs real tasks.

The fast tests check the plan, the placement rules and the fleet report without exporting anything; the one
slow test runs a two-model plan through a real local Ray instance; the long ones use a Ray head the test
starts on 127.0.0.1, and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optimizer.errors import SettingsError
from optimizer.fleet.executors import _Node
from optimizer.fleet.fleet_report import fleet_record, markdown, read_previous, write_fleet_report
from optimizer.fleet.job import ModelJob, ModelOutcome
from optimizer.fleet.plan import DEFAULT_REPORT_DIR, load_plan
from optimizer.fleet.rerun import settings_key, unchanged
from tests.conftest import ROOT, S3_CREDENTIALS, MotoS3, ctrl_c_reaches_it, run_cli

QUICK = """
backend = ["torchscript"]
max-batch-size = "2"
time-budget = 2
serve-search = "off"
validate = false
eager-gate = "disabled"
"""
"""Settings that keep one tiny export short: one quick candidate, batch 1 (2 if time allows), no served search."""


def _plan(tmp: Path, text: str) -> Path:
    path = tmp / "plan.toml"
    path.write_text(text)
    return path


def _refused(tmp: Path, text: str) -> str:
    with pytest.raises(SettingsError) as err:
        load_plan(_plan(tmp, text))
    message = str(err.value)
    assert "\n" not in message
    return message


# -- the plan ---------------------------------------------------------------------------------------------


def test_plan_applies_top_level_settings_and_model_overrides(tmp_path: Path):
    plan = load_plan(_plan(tmp_path, """
repository = "s3://models/prod"
executor = "ray"
address = "auto"
backend = ["onnxruntime"]
max-batch-size = 8
[models.cnn]
model = "optimizer.examples.cnn:build"
[models.encoder]
model = "optimizer.examples.transformer:build"
input = "input_ids:int64:1-128"
value-range = ["input_ids:0:999"]
max-batch-size = "4"
report-dir = "elsewhere/enc"
[models.gpu]
model = "optimizer.examples.cnn:build"
name = "cnn_gpu"
device = "cuda:1"
"""))
    assert (plan.executor, plan.address, plan.report_dir) == ("ray", "auto", Path(DEFAULT_REPORT_DIR))
    cnn, enc, gpu = plan.models
    assert [m.name for m in plan.models] == ["cnn", "encoder", "cnn_gpu"] and [m.index for m in plan.models] == [0, 1, 2]
    assert all(m.settings.repository == "s3://models/prod" for m in plan.models)  # passed through as written
    assert cnn.settings.backend == ["onnxruntime"] and cnn.settings.max_batch_size == "8"
    assert enc.settings.max_batch_size == "4" and enc.settings.input == ["input_ids:int64:1-128"]
    assert cnn.settings.report_dir == str(Path(DEFAULT_REPORT_DIR) / "cnn") and enc.settings.report_dir == "elsewhere/enc"
    assert gpu.settings.report_dir == str(Path(DEFAULT_REPORT_DIR) / "cnn_gpu")
    assert (cnn.gpu, gpu.gpu) == (False, True)
    assert load_plan(tmp_path / "plan.toml", "cli-dir").models[0].settings.report_dir == str(Path("cli-dir") / "cnn")
    assert plan.entry(2) is gpu
    with pytest.raises(SettingsError, match="--index 3 is outside plan"):
        plan.entry(3)


def test_plan_defaults_to_the_local_executor_and_a_top_level_report_dir(tmp_path: Path):
    plan = load_plan(_plan(tmp_path, 'report-dir = "reports/nightly"\n[models.a]\nmodel = "m.py:f"\n'))
    assert (plan.executor, plan.address, plan.report_dir) == ("local", None, Path("reports/nightly"))
    assert plan.models[0].settings.report_dir == str(Path("reports/nightly") / "a")


@pytest.mark.parametrize("text, fragments", [
    ('[models.cnn]\nmodel = "x:y"\nmax-batch = 4\n', ["'max-batch'", "model 'cnn'"]),
    ('colour = "red"\n[models.cnn]\nmodel = "x:y"\n', ["'colour'", "top level", "executor, address, image, models"]),
    ('executor = "dask"\n[models.cnn]\nmodel = "x:y"\n', ["executor 'dask'", "local, ray"]),
    ('executor = "local"\naddress = "auto"\n[models.cnn]\nmodel = "x:y"\n', ["address 'auto'", 'executor = "ray"']),
    ('repository = "r"\n', ["names no models", "[models.cnn]"]),
    ('models = 3\n', ["names no models"]),
    ('[models]\ncnn = "x:y"\n', ["models.cnn must be a table"]),
    ('[models.cnn]\nbackend = ["onnxruntime"]\n', ["model 'cnn' has no model key"]),
    ('[models.cnn]\nmodel = "x:y"\ninput = [1, 2]\n', ["model 'cnn'", "'input' must be a string or a list of strings"]),
    ('[models.cnn]\nmodel = "x:y"\ndevice = "tpu"\n', ["model 'cnn'", "--device 'tpu'"]),
    ('[models."../up"]\nmodel = "x:y"\n', ["model '../up'", "one path component"]),
    ('[models.a]\nmodel = "x:y"\nname = "same"\n[models.b]\nmodel = "x:z"\nname = "same"\n', ["'a' and 'b'", "same name 'same'"]),
    ('name = "one"\n[models.a]\nmodel = "x:y"\n', ["name at the top level"]),
    ('[models.a\nmodel = 1\n', ["not valid TOML"]),
])
def test_a_bad_plan_is_refused_whole_in_one_line(tmp_path: Path, text: str, fragments: list[str]):
    message = _refused(tmp_path, text)
    for fragment in fragments:
        assert fragment in message, message


def test_a_missing_plan_names_the_file(tmp_path: Path):
    with pytest.raises(SettingsError, match="does not exist"):
        load_plan(tmp_path / "nope.toml")


def test_export_many_help_imports_neither_ray_nor_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom optimizer.cli import main\n"
            "r = CliRunner().invoke(main, ['export-many', '--help']); assert r.exit_code == 0, r.output\n"
            "assert 'PLAN' in r.output and '--index' in r.output\n"
            "assert not {'ray', 'torch'} & set(sys.modules), sorted({'ray', 'torch'} & set(sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr


def test_a_ray_plan_without_ray_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch):
    from optimizer.fleet.executors import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(SettingsError, match=r"aitune-export\[fleet\]"):
        RayExecutor().run([], print, print)


# -- placement on Ray nodes (the rules, without a cluster) -------------------------------------------------


def test_a_cpu_model_reserves_the_whole_node_and_a_gpu_model_one_gpu_and_its_cpu_share():
    node = _Node("n1", "10.0.0.1", cpus=16.0, gpus=4)
    assert node.request(gpu=False) == {"num_cpus": 16.0, "num_gpus": 0}
    assert node.request(gpu=True) == {"num_gpus": 1, "num_cpus": 4.0}
    node.take(gpu=True)
    assert not node.fits(gpu=False) and node.fits(gpu=True)  # a CPU measurement waits for the GPU ones to finish
    for _ in range(3):
        node.take(gpu=True)
    assert not node.fits(gpu=True)
    for _ in range(4):
        node.take(gpu=True, back=True)
    node.take(gpu=False)
    assert not node.fits(gpu=False) and not node.fits(gpu=True)  # nothing beside a CPU measurement
    cpu_only = _Node("n2", "10.0.0.2", cpus=2.0, gpus=0)
    assert not cpu_only.can_ever_fit(gpu=True) and cpu_only.can_ever_fit(gpu=False)
    assert _Node("n3", "h", cpus=2.0, gpus=3).request(gpu=True)["num_cpus"] == 0.66


# -- the fleet report and re-runs -------------------------------------------------------------------------


def _outcomes(tmp: Path) -> list[ModelOutcome]:
    (tmp / "fleet" / "cnn").mkdir(parents=True)
    (tmp / "fleet" / "cnn" / "report.md").write_text("# cnn\n")
    (tmp / "fleet" / "bad").mkdir(parents=True)
    (tmp / "fleet" / "bad" / "export.log").write_text("error: cannot import module 'nope'\n")
    return [
        ModelOutcome("cnn", "published", backend="onnxruntime[cpu]", max_batch_size=4, throughput=412.8, throughput_source="in-process",
                     model_dir=str(tmp / "repo" / "cnn"), version=1, report_dir=str(tmp / "fleet" / "cnn"), seconds=41.0, key="k1"),
        ModelOutcome("bad", "failed", reason="cannot import module 'nope' | x", report_dir=str(tmp / "fleet" / "bad"), seconds=2.0),
        ModelOutcome("late", "not run", reason="the fleet was stopped before this model's turn"),
    ]


def test_fleet_report_lists_every_model_with_status_numbers_and_a_link(tmp_path: Path):
    record = fleet_record(tmp_path / "plan.toml", "ray", "ray on a local Ray instance: ...", _outcomes(tmp_path), 43.2)
    assert record["counts"] == {"published": 1, "unchanged": 0, "failed": 1, "interrupted": 0, "not run": 1}
    json_path, md_path = write_fleet_report(tmp_path / "fleet", record)
    doc = json.loads(json_path.read_text())
    cnn = doc["models"][0]
    assert (cnn["backend"], cnn["max_batch_size"], cnn["throughput"], cnn["status"]) == ("onnxruntime[cpu]", 4, 412.8, "published")
    assert doc["models"][1]["reason"].startswith("cannot import module")
    text = md_path.read_text()
    assert text.startswith("# Fleet: 3 models, 1 published, 1 failed, 1 not run")
    assert "| cnn | published | onnxruntime[cpu] | 4 | 412.8 | in-process | 41 |  | [report.md](cnn/report.md) |" in text
    assert "[export.log](bad/export.log)" in text and "'nope' \\| x" in text  # a pipe in a reason keeps the table intact
    assert markdown(record, tmp_path / "fleet") == text
    assert read_previous(tmp_path / "fleet")["cnn"].key == "k1"
    assert read_previous(tmp_path / "elsewhere") == {}
    assert write_fleet_report(tmp_path / "fleet", record, "-3")[0].name == "fleet-3.json"


def test_a_rerun_skips_only_what_is_unchanged_and_still_published(tmp_path: Path):
    model = tmp_path / "m.py"
    model.write_text("def build(): ...\n")
    plan = load_plan(_plan(tmp_path, f'repository = "{tmp_path / "repo"}"\n[models.cnn]\nmodel = "{model}:build"\n'))
    settings = plan.models[0].settings
    key = settings_key(settings, tmp_path)
    before = ModelOutcome("cnn", "published", version=1, key=key)
    assert not unchanged(before, key, settings, tmp_path)  # nothing in the repository
    (tmp_path / "repo" / "cnn" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "cnn" / "config.pbtxt").write_text("")
    assert unchanged(before, key, settings, tmp_path)
    assert not unchanged(ModelOutcome("cnn", "failed", version=1, key=key), key, settings, tmp_path)
    model.write_text("def build(): return 2\n")  # the model's code changed: the key changes
    assert settings_key(settings, tmp_path) != key
    model.write_text("def build(): ...\n")
    assert settings_key(settings, tmp_path) == key
    other = load_plan(_plan(tmp_path, f'repository = "{tmp_path / "repo"}"\nmax-batch-size = 2\n[models.cnn]\nmodel = "{model}:build"\n'))
    assert settings_key(other.models[0].settings, tmp_path) != key
    s3 = load_plan(_plan(tmp_path, f'repository = "s3://b/p"\n[models.cnn]\nmodel = "{model}:build"\n')).models[0].settings
    assert not unchanged(ModelOutcome("cnn", "published", version=1, key="k"), "k", s3, tmp_path)  # not listed: exported again


def test_a_module_model_is_keyed_by_its_source_file_without_importing_it(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "pkg" / "net.py").write_text("A = 1\n")
    settings = load_plan(_plan(tmp_path, '[models.net]\nmodel = "pkg.net:build"\n')).models[0].settings
    key = settings_key(settings, tmp_path)
    (tmp_path / "pkg" / "net.py").write_text("A = 2\n")
    assert settings_key(settings, tmp_path) != key


# -- running: a failed model never stops the others ---------------------------------------------------------


def test_ctrl_c_in_the_local_executor_stops_and_reports_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import optimizer.fleet.executors as executors

    plan = load_plan(_plan(tmp_path, '[models.a]\nmodel = "x:y"\n[models.b]\nmodel = "x:y"\n[models.c]\nmodel = "x:y"\n'))
    jobs = [ModelJob(m.name, m.settings, str(tmp_path)) for m in plan.models]

    def fake_run_job(job: ModelJob) -> ModelOutcome:
        if job.name == "b":
            raise KeyboardInterrupt
        return ModelOutcome(job.name, "published", backend="onnxruntime[cpu]")

    monkeypatch.setattr(executors, "run_job", fake_run_job)
    started, done = [], []
    run = executors.LocalExecutor().run(jobs, started.append, done.append)
    assert run.interrupted and [o.status for o in run.outcomes] == ["published", "interrupted", "not run"]
    assert started == ["a", "b"] and [o.name for o in done] == ["a"]


def test_failing_models_each_get_their_turn_and_reason(in_tmp: Path):
    plan = _plan(in_tmp, QUICK + '[models.missing]\nmodel = "no_such_module_here:build"\n'
                 '[models.raises]\nmodel = "tests.fixtures.models:raises"\n')
    r = run_cli("export-many", str(plan), "--json", cwd=in_tmp, timeout=180)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    missing, raises = doc["models"]
    assert (missing["status"], raises["status"]) == ("failed", "failed")
    assert "cannot import module 'no_such_module_here'" in missing["reason"]
    assert "weights not found" in raises["reason"]  # the second model ran after the first failed
    assert "2 of 2 models failed (missing, raises)" in r.stderr
    assert (in_tmp / DEFAULT_REPORT_DIR / "report.md").is_file()
    assert (in_tmp / DEFAULT_REPORT_DIR / "raises" / "export.log").is_file()
    assert doc["executor"] == "local" and [line for line in r.stderr.splitlines() if "[2/2 done, 0 left]" in line]
    assert doc["job_manifest"]["path"] is None and 'image = "REGISTRY/IMAGE:TAG"' in doc["job_manifest"]["reason"]


def test_a_plan_with_an_image_gets_an_indexed_job_that_runs_each_entry(in_tmp: Path):
    """The Job is a valid Kubernetes object with one completion per plan entry, in plan order, and the fleet report links
    it; a pod of that Job (--index) leaves it alone."""
    import kubernetes_validate
    import yaml

    plan = _plan(in_tmp, 'image = "registry.example/team/aitune:1"\n[models.missing]\nmodel = "no_such_module_here:build"\n'
                 '[models.other]\nmodel = "no_such_module_either:build"\n')
    r = run_cli("export-many", str(plan), "--json", cwd=in_tmp, timeout=120)
    assert r.returncode == 1, r.stderr
    path = Path(json.loads(r.stdout)["job_manifest"]["path"])
    job = yaml.safe_load((in_tmp / path if not path.is_absolute() else path).read_text())
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    assert container["image"] == "registry.example/team/aitune:1" and container["command"][:3] == ["aitune-export", "export-many", str(plan)]
    assert json.loads(job["metadata"]["annotations"]["aitune-export/models"]) == ["missing", "other"]
    assert "export-many-job.yaml" in (in_tmp / DEFAULT_REPORT_DIR / "report.md").read_text()


def test_index_runs_one_entry_here_whatever_the_executor(in_tmp: Path):
    plan = _plan(in_tmp, 'executor = "ray"\n[models.missing]\nmodel = "no_such_module_here:build"\n'
                 '[models.other]\nmodel = "no_such_module_either:build"\n')
    r = run_cli("export-many", str(plan), "--index", "1", "--json", cwd=in_tmp, timeout=120)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["executor"] == "local" and [m["name"] for m in doc["models"]] == ["other"]
    assert (in_tmp / DEFAULT_REPORT_DIR / "fleet-1.json").is_file() and (in_tmp / DEFAULT_REPORT_DIR / "report-1.md").is_file()
    assert not (in_tmp / DEFAULT_REPORT_DIR / "missing").exists()
    r = run_cli("export-many", str(plan), "--index", "2", cwd=in_tmp, timeout=120)
    assert r.returncode == 2 and "--index 2 is outside plan" in r.stderr


# -- end to end with a real Ray ----------------------------------------------------------------------------


def _two_models(tmp: Path, head: str = "") -> Path:
    return _plan(tmp, f'repository = "{tmp / "repo"}"\nexecutor = "ray"\n{head}' + QUICK +
                 '[models.mlp]\nmodel = "tests.fixtures.models:mlp"\n'
                 '[models.pair]\nmodel = "tests.fixtures.models:two_inputs"\n')


@pytest.mark.slow
@pytest.mark.long  # over a minute; the local executor's tests run the fleet path in CI, make test-long runs Ray
def test_two_models_through_a_local_ray_instance(in_tmp: Path):
    pytest.importorskip("ray")
    plan = _two_models(in_tmp)
    r = run_cli("export-many", str(plan), "--json", cwd=in_tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["executor"] == "ray" and "reserves all of that node's CPUs" in doc["placement"]
    for m in doc["models"]:
        assert (m["status"], m["backend"]) == ("published", "torchscript[cpu]") and m["max_batch_size"] in (1, 2), m
        assert m["throughput"] > 0 and (in_tmp / "repo" / m["name"] / "config.pbtxt").is_file()
        assert (in_tmp / DEFAULT_REPORT_DIR / m["name"] / "report.json").is_file()
    text = (in_tmp / DEFAULT_REPORT_DIR / "report.md").read_text()
    assert "| mlp | published | torchscript[cpu] |" in text and "[report.md](pair/report.md)" in text
    again = run_cli("export-many", str(plan), "--json", cwd=in_tmp, timeout=120)  # nothing changed: no Ray, no export
    assert again.returncode == 0, again.stderr[-3000:]
    assert [m["status"] for m in json.loads(again.stdout)["models"]] == ["unchanged", "unchanged"]


@pytest.mark.slow
@pytest.mark.long  # minutes: two exports on Ray, then a tritonserver per model reading the bucket
def test_a_ray_plan_publishes_into_s3_and_tritonserver_answers_both_from_there(in_tmp: Path, s3: MotoS3):
    """Issue 17's target: a two-model plan on a local Ray instance publishes into a loopback s3:// repository, and the
    local tritonserver loads both models straight from the bucket and answers them correctly."""
    pytest.importorskip("ray")
    bucket = s3.bucket()
    url = s3.url(bucket, "fleet/repo")
    plan = _plan(in_tmp, f'repository = "{url}"\nexecutor = "ray"\n' + QUICK +
                 '[models.mlp]\nmodel = "tests.fixtures.models:mlp"\n'
                 '[models.pair]\nmodel = "tests.fixtures.models:two_inputs"\n')
    env = dict(S3_CREDENTIALS, AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    r = run_cli("export-many", str(plan), "--json", cwd=in_tmp, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["status"] for m in json.loads(r.stdout)["models"]] == ["published", "published"]
    keys = {k.split("fleet/repo/", 1)[1] for k in s3.objects(bucket)}
    assert {"mlp/config.pbtxt", "mlp/1/model.pt", "pair/config.pbtxt", "pair/1/model.pt"} <= keys
    assert not (in_tmp / "model_repository").exists()
    for name in ("mlp", "pair"):
        v = run_cli("validate", url, "--model", name, "--concurrency", "1:1", "--measurement-interval", "300", "--report", str(in_tmp / DEFAULT_REPORT_DIR / name),
                    cwd=in_tmp, env=env, timeout=300)
        assert v.returncode == 0, v.stdout + v.stderr
        record = json.loads((in_tmp / DEFAULT_REPORT_DIR / name / "validation.json").read_text())
        assert record["status"] == "passed" and record["repository"] == url
        assert all(a["passed"] and a["compared_with"] == "reference" for a in record["answers"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_head_on_loopback(env: dict[str, str], log: Path, num_cpus: int | None = None):
    """A real Ray head on 127.0.0.1 (`ray start --head --block` in its own process group); yields its address.

    Stopped by signalling that group only: `ray stop` would stop every Ray instance on the machine, others' too.
    """
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray_cli is None:
        pytest.skip("the ray command is not next to this interpreter")
    port = _free_port()
    cpus = ["--num-cpus", str(num_cpus)] if num_cpus else []
    with open(log, "w") as out:
        head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port), *cpus,
                                 "--include-dashboard", "false", "--disable-usage-stats"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):  # `ray start --block` outlives SIGTERM; its children stop on it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                head.wait(wait_s)
                break


@pytest.fixture
def ray_head(tmp_path: Path):
    """A Ray head with 2 CPUs and its own auth token for one test; yields (address, the driver's extra environment)."""
    pytest.importorskip("ray")
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}  # Ray >= 2.59: a driver must present the head's token
    with ray_head_on_loopback(dict(os.environ, PYTHONPATH=str(ROOT), **auth), tmp_path / "ray_head.log", num_cpus=2) as address:
        yield address, auth


@pytest.mark.slow
@pytest.mark.long
def test_a_plan_on_a_ray_head_the_test_started_keeps_going_past_a_failed_model(in_tmp: Path, ray_head: tuple[str, dict]):
    address, auth = ray_head
    plan = _plan(in_tmp, f'repository = "{in_tmp / "repo"}"\nexecutor = "ray"\naddress = "{address}"\n' + QUICK +
                 '[models.mlp]\nmodel = "tests.fixtures.models:mlp"\n'
                 '[models.broken]\nmodel = "tests.fixtures.models:raises"\n'
                 '[models.pair]\nmodel = "tests.fixtures.models:two_inputs"\n')
    r = run_cli("export-many", str(plan), "--json", cwd=in_tmp, timeout=400, env=auth)
    assert r.returncode == 1, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert [m["status"] for m in doc["models"]] == ["published", "failed", "published"]
    assert "weights not found" in doc["models"][1]["reason"] and "127.0.0.1" in doc["placement"]
    assert sorted(p.name for p in (in_tmp / "repo").iterdir()) == ["mlp", "pair"]


@pytest.mark.slow
@pytest.mark.long
def test_ctrl_c_stops_the_ray_tasks_and_reports_the_rest(in_tmp: Path, ray_head: tuple[str, dict]):
    address, auth = ray_head
    plan = _two_models(in_tmp, f'address = "{address}"\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(in_tmp / ".cache"), **auth)
    with open(in_tmp / "stdout", "w") as out, open(in_tmp / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "optimizer.cli", "export-many", str(plan), "--json"], cwd=in_tmp, env=env,
                                stdout=out, stderr=err, preexec_fn=ctrl_c_reaches_it)
    log = in_tmp / DEFAULT_REPORT_DIR / "mlp" / "export.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and "] load" in log.read_text()) and time.monotonic() < deadline:  # the export is under way
        time.sleep(0.5)
    assert proc.poll() is None, (in_tmp / "stderr").read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert proc.returncode == 130, (in_tmp / "stderr").read_text()[-3000:]
    doc = json.loads((in_tmp / DEFAULT_REPORT_DIR / "fleet.json").read_text())
    assert [m["status"] for m in doc["models"]] == ["interrupted", "not run"]
    assert not (in_tmp / "repo" / "mlp").exists()
    time.sleep(5)  # the cancelled worker's export got SIGTERM and stopped its candidates
    leftover = subprocess.run(["pgrep", "-f", "aitune-fleet-.*settings.toml"], check=False, capture_output=True, text=True).stdout.split()
    assert not leftover, leftover


# -- every model's values are checked before the first model runs ------------------------------------------


@pytest.mark.parametrize("line, fragments", [
    ('max-batch-size = "lots"', ["--max-batch-size 'lots' is not a number or 'auto'", "auto to search it"]),
    ('repository = "ftp://host/repo"', ["ftp:// is not a model repository Triton can read", "s3://BUCKET/PREFIX"]),
    ('strategy = "fastest"', ["unknown strategy 'fastest'", "max-throughput"]),
    ('backend = ["tensorflow"]', ["unknown backend(s) tensorflow", "choose from"]),
    ('input = ["image:float32:abc"]', ["dimension 'abc' is not N or LOW-HIGH"]),
    ('tolerance = ["tiny"]', ["is not [NAME=]ATOL[,RTOL]"]),
    ('memory-budget = "lots"', ["--memory-budget 'lots' is not a size"]),
    ('triton-release = "99.01"', ["--triton-release '99.01'", "choose one of"]),
    ('workflow = "jit"', ["--workflow jit", "add --samples FILE.npz"]),
])
def test_a_bad_value_in_any_model_stops_the_plan_before_it_runs(tmp_path: Path, line: str, fragments: list[str]):
    """Values the settings file takes as text are checked as the model's own export checks them (before loading it)."""
    from optimizer.app.plan import check_settings

    text = f'[models.cnn]\nmodel = "optimizer.examples.cnn:build"\n[models.encoder]\nmodel = "optimizer.examples.transformer:build"\n{line}\n'
    load_plan(_plan(tmp_path, text.replace(line, "")), check=check_settings)  # the same plan without the line is fine
    with pytest.raises(SettingsError) as err:
        load_plan(_plan(tmp_path, text), check=check_settings)
    message = str(err.value)
    assert message.startswith(f"plan {str(tmp_path / 'plan.toml')!r}: model 'encoder': ") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_export_many_refuses_a_bad_value_in_the_second_model_before_the_first_runs(in_tmp: Path):
    """The whole plan is checked first: a bad value in the second model's table is exit 2 at once, in one line, with
    nothing written, not found after the first model's export (minutes) has run."""
    _plan(in_tmp, f'repository = "repo"\n{QUICK}\n[models.cnn]\nmodel = "optimizer.examples.cnn:build"\n'
                  '[models.encoder]\nmodel = "optimizer.examples.transformer:build"\nmax-batch-size = "lots"\n')
    r = run_cli("export-many", "plan.toml", cwd=in_tmp, timeout=120)
    assert r.returncode == 2, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "model 'encoder'" in errors[0] and "--max-batch-size 'lots'" in errors[0] and "a whole number from 1 to" in errors[0]
    assert sorted(p.name for p in in_tmp.iterdir() if p.name != ".cache") == ["plan.toml"]  # no report, no repository
