"""model_analyzer.yaml beside the report: what it states, that everything it names exists, and (slow) that the real
Model Analyzer (triton-model-analyzer 1.58) runs it as written against the local tritonserver and measures the search
it states, not only the published config."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from optimizer.machine import cpu_cores
from optimizer.triton.config.model_config import parse
from optimizer.triton.repository.publish import PublishOptions, publish
from tests.conftest import run_cli
from tests.triton_records import make_result, tensor

yaml = pytest.importorskip("yaml")

PATH_KEYS = ("model_repository", "export_path", "checkpoint_directory", "output_model_repository_path", "perf_output_path")


def _local_tritonserver() -> bool:
    from optimizer.triton.runtime.install import ToolMissing, find_triton

    try:
        find_triton()
    except ToolMissing:
        return False
    return True


def _published(tmp: Path, **kw: Any):
    result = make_result(tmp / "run", **kw)
    return publish(result, PublishOptions(tmp / "repo", "m", warmup=True, report_dir=tmp / "report"))


def _load(path: str | Path) -> tuple[str, dict[str, Any]]:
    text = Path(path).read_text()
    return text, yaml.safe_load(text)


def test_the_yaml_states_its_search_and_everything_it_names_exists(in_tmp: Path):
    published = _published(in_tmp)
    path = Path(published.model_analyzer_config)
    text, cfg = _load(path)
    served = parse((published.model_dir / "config.pbtxt").read_text())
    assert list(served.dynamic_batching.preferred_batch_size) and len(served.model_warmup) > 1  # what the search must not keep

    header = [line for line in text.splitlines() if line.startswith("#")]
    assert text.startswith("# ") and f"model-analyzer profile -f {path}" in "\n".join(header)
    assert "--triton-launch-mode remote --triton-http-endpoint HOST:8000" in "\n".join(header)  # how to use another server

    # the search explores bounds that contain the published operating point
    assert cfg["run_config_search_mode"] == "brute"
    assert cfg["run_config_search_min_model_batch_size"] == 1
    top = cfg["run_config_search_max_model_batch_size"]
    assert top >= served.max_batch_size and top & (top - 1) == 0  # Model Analyzer doubles from 1
    assert cfg["run_config_search_min_instance_count"] == 1
    assert cfg["run_config_search_max_instance_count"] == max(served.instance_group[0].count, min(4, cpu_cores()))
    assert cfg["run_config_search_min_concurrency"] == 1 and cfg["run_config_search_max_concurrency"] >= 2 * served.max_batch_size
    assert cfg["profile_models"] == {"m": {"cpu_only": True}} and cfg["objectives"] == ["perf_throughput"]

    # every path absolute, every folder there, nothing inside the served repository
    for key in PATH_KEYS:
        assert Path(cfg[key]).is_absolute() and not Path(cfg[key]).is_relative_to(in_tmp / "repo"), key
    assert Path(cfg["export_path"]).is_dir() and Path(cfg["output_model_repository_path"]).parent.is_dir()
    assert Path(cfg["checkpoint_directory"]).is_dir() and not any(Path(cfg["checkpoint_directory"]).iterdir())
    flags = cfg["perf_analyzer_flags"]
    assert flags["input-data"] == str(in_tmp / "report" / "perf_analyzer_input.json") and Path(flags["input-data"]).is_file()
    assert "shape" not in flags and flags["measurement-mode"] == "time_windows"

    # the base config Model Analyzer varies: the published one without preferred sizes and warmup, files linked
    base = Path(cfg["model_repository"]) / "m"
    varied = parse((base / "config.pbtxt").read_text())
    assert list(varied.dynamic_batching.preferred_batch_size) == [] and len(varied.model_warmup) == 0
    assert varied.dynamic_batching.max_queue_delay_microseconds == served.dynamic_batching.max_queue_delay_microseconds
    assert (varied.max_batch_size, varied.platform, list(varied.input), list(varied.instance_group)) == \
        (served.max_batch_size, served.platform, list(served.input), list(served.instance_group))
    assert (base / "1").is_symlink() and (base / "1").resolve() == (published.model_dir / "1").resolve()

    # local launch mode: Model Analyzer starts the local server through a launcher. The server and perf_analyzer are part of
    # this environment (a machine without a server: test_without_a_local_tritonserver_...), so a missing one fails here.
    assert _local_tritonserver(), "tritonserver (nvidia-pytriton) is part of the project's environment: run make venv"
    assert cfg["triton_launch_mode"] == "local"
    endpoints = [cfg["triton_http_endpoint"], cfg["triton_grpc_endpoint"], cfg["triton_metrics_url"]]
    assert all("127.0.0.1:" in e for e in endpoints) and len({e.split(":")[-1].split("/")[0] for e in endpoints}) == 3
    server, pa = Path(cfg["triton_server_path"]), Path(cfg["perf_analyzer_path"])
    for launcher in (server, pa):
        assert launcher.is_file() and os.access(launcher, os.X_OK) and launcher.is_relative_to(cfg["export_path"])
    assert "nvidia_pytriton.libs" in server.read_text() and "bin/tritonserver" in server.read_text()
    assert "cuda_runtime" in pa.read_text() and "perf_analyzer" in pa.read_text()
    assert Path(cfg["triton_server_flags"]["backend-directory"]).is_dir()
    assert cfg["triton_server_flags"]["metrics-address"] == "127.0.0.1"
    from optimizer.triton.runtime.perf_analyzer import (
        find_perf_analyzer,
        perf_analyzer_environment,
    )

    real = subprocess.run([str(find_perf_analyzer()), "--version"], check=False, capture_output=True, text=True, timeout=60,
                          env=perf_analyzer_environment())
    assert "2.51" in real.stderr, real.stdout + real.stderr  # perf_analyzer runs here (libb64: scripts/install_system_deps.sh)
    bare = subprocess.run([str(pa), "--version"], check=False, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert "2.51" in bare.stderr, bare.stdout + bare.stderr  # the launcher brings the CUDA runtime itself


def test_model_analyzer_reads_the_yaml_and_the_flags_that_point_it_at_another_server(in_tmp: Path):
    """Model Analyzer's own parser and checks (no server starts): the file as written, and with the header's remote flags."""
    _model_analyzer()
    from model_analyzer.cli.cli import CLI
    from model_analyzer.config.input.config_command_profile import ConfigCommandProfile

    def parsed(*flags: str) -> Any:
        cli = CLI()
        cli.add_subcommand(cmd="profile", help="profile", config=ConfigCommandProfile())
        return cli.parse(["profile", "-f", str(path), *flags])[1]

    published = _published(in_tmp)
    path = Path(published.model_analyzer_config)
    _, cfg = _load(path)
    config = parsed()
    assert config.triton_launch_mode == cfg["triton_launch_mode"] and config.run_config_search_mode == "brute"
    assert config.run_config_search_max_model_batch_size == cfg["run_config_search_max_model_batch_size"]
    assert config.checkpoint_directory == cfg["checkpoint_directory"] and config.model_repository == cfg["model_repository"]
    remote = parsed("--triton-launch-mode", "remote", "--triton-http-endpoint", "triton-host:8000", "--triton-grpc-endpoint",
                    "triton-host:8001", "--triton-metrics-url", "http://triton-host:8002/metrics")
    assert (remote.triton_launch_mode, remote.triton_grpc_endpoint) == ("remote", "triton-host:8001")
    assert remote.perf_analyzer_path == cfg["perf_analyzer_path"]  # still this environment's perf_analyzer


def test_rewriting_the_yaml_clears_old_checkpoints_and_refreshes_the_base_config(in_tmp: Path):
    published = _published(in_tmp)
    _, cfg = _load(published.model_analyzer_config)
    stale = Path(cfg["checkpoint_directory"]) / "0.ckpt"
    stale.write_text("{}")
    result = make_result(in_tmp / "run2", max_batch=16)
    again = publish(result, PublishOptions(in_tmp / "repo", "m", overwrite=True, report_dir=in_tmp / "report"))
    _, cfg = _load(again.model_analyzer_config)
    assert not stale.exists() and Path(cfg["checkpoint_directory"]).is_dir()
    assert parse((Path(cfg["model_repository"]) / "m" / "config.pbtxt").read_text()).max_batch_size == 16
    assert cfg["run_config_search_max_model_batch_size"] == 16


def test_without_a_local_tritonserver_the_yaml_is_for_a_server_the_user_starts(in_tmp: Path, monkeypatch: pytest.MonkeyPatch):
    from optimizer.triton.runtime import install

    def missing():
        raise install.ToolMissing("tritonserver was not found (nvidia-pytriton is not installed)")

    monkeypatch.setattr(install, "find_triton", missing)
    result = make_result(in_tmp / "run", inputs=(tensor("input_ids", "int64", "1-128"),))
    Path(result.reference.profile_feed).unlink()  # no request mix: perf_analyzer needs --shape for the dynamic axis
    published = publish(result, PublishOptions(in_tmp / "repo", "enc", report_dir=in_tmp / "report"))
    text, cfg = _load(published.model_analyzer_config)
    assert cfg["triton_launch_mode"] == "remote" and cfg["triton_grpc_endpoint"] == "localhost:8001"
    assert "triton_server_path" not in cfg and cfg["perf_analyzer_flags"]["shape"] == ["input_ids:128"]
    assert f"tritonserver --model-repository={(in_tmp / 'repo').resolve()} --model-control-mode=explicit --load-model=enc" in text
    assert Path(cfg["model_repository"], "enc", "config.pbtxt").is_file() and Path(cfg["checkpoint_directory"]).is_dir()


# -- the real Model Analyzer -------------------------------------------------------------------------------------------


def _model_analyzer() -> Path:
    try:
        import model_analyzer  # noqa: F401
    except ImportError as err:
        pytest.skip(f"triton-model-analyzer is not installed (pip install 'aitune-export[model-analyzer]'): {err}")
    return Path(sys.executable).parent / "model-analyzer"


def _stop_leftovers(token: str) -> None:
    """Model Analyzer starts tritonserver in its own session: stop any still running with this YAML's unique flags."""
    import psutil

    for proc in psutil.process_iter(["pid", "cmdline"]):
        if token in " ".join(proc.info["cmdline"] or []):
            try:
                proc.kill()
            except psutil.Error:
                pass


@pytest.mark.slow
@pytest.mark.long  # over a minute (Model Analyzer measures several configs): `make test-long`
def test_model_analyzer_runs_the_yaml_as_written_and_measures_more_than_the_published_config(tmp_path: Path):
    """A real export (max batch 4, preferred size 4, warmup at 1 and 4), then `model-analyzer profile -f` on the YAML
    with only the search's concurrency and instance bounds narrowed on the command line (minutes on a small machine)."""
    binary = _model_analyzer()
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled",
                "--max-batch-size", "4", "--warmup", "--repository", str(tmp_path / "repo"), "--report-dir",
                str(tmp_path / "report"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "report" / "model_analyzer.yaml"
    _, cfg = _load(path)
    served_text = (tmp_path / "repo" / "mlp" / "config.pbtxt").read_text()
    served = parse(served_text)
    assert max(served.dynamic_batching.preferred_batch_size) > 1  # Model Analyzer calls a max below it "illegal" and stops
    assert cfg["triton_launch_mode"] == "local", "nvidia-pytriton is part of the test install"

    token = cfg["triton_server_flags"]["backend-config"].split("=")[-1]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}  # the YAML brings its own
    command = [str(binary), "profile", "-f", str(path),
               "--run-config-search-max-concurrency", "2", "--run-config-search-max-instance-count", "1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # Model Analyzer checkpoints and stops its server on Ctrl-C
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"model-analyzer ran past 420 s: {out[-3000:]}")
    finally:
        _stop_leftovers(token)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, out[-4000:]
    assert "illegal" not in out.lower(), out[-4000:]

    results = Path(cfg["export_path"]) / "results" / "metrics-model-inference.csv"
    with open(results, newline="") as f:
        rows = list(csv.DictReader(f))
    configs = {row["Model Config Path"]: int(row["Max Batch Size"]) for row in rows if float(row["Throughput (infer/sec)"]) > 0}
    assert len(configs) > 1, f"measured only {configs} in {seconds:.0f} s: {out[-3000:]}"
    assert "mlp_config_default" in configs and 1 in configs.values(), configs  # below the published preferred size
    assert list(Path(cfg["checkpoint_directory"]).glob("*.ckpt"))
    assert (tmp_path / "repo" / "mlp" / "config.pbtxt").read_text() == served_text  # the served repository is untouched
