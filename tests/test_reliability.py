"""The run survives its candidates, stops cleanly, resumes from its cache, and never damages the repository."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from optimizer.triton.config.model_config import parse
from tests.conftest import CLI, ROOT, run_cli, tree_snapshot
from tests.test_triton_server import processes_working_in

pytestmark = pytest.mark.slow


def _result(base: Path, name: str) -> dict:
    return json.loads((base / "aitune-reports" / name / "report.json").read_text())["result"]


def _by_backend(result: dict) -> dict:
    return {c["backend"]: c for c in result["candidates"]}


def test_a_segfaulting_candidate_is_a_failed_candidate(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:segfaults_when_traced", "--backend", "torchscript", "--backend", "onnxruntime",
                "--max-batch-size", "2", "--eager-gate", "disabled", "--no-cache", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    cands = _by_backend(_result(in_tmp, "segfaults_when_traced"))
    assert cands["torchscript"]["status"] == "failed" and cands["torchscript"]["stage"] == "crash"
    assert "SIGSEGV" in cands["torchscript"]["reason"]
    assert cands["onnxruntime"]["status"] == "passed"
    assert (in_tmp / "model_repository" / "segfaults_when_traced" / "1" / "model.onnx").exists()


def test_a_hanging_candidate_is_stopped_at_the_build_timeout(in_tmp: Path):
    t0 = time.monotonic()
    r = run_cli("export", "tests.fixtures.models:hangs_when_exported", "--backend", "onnxruntime", "--backend", "torchscript",
                "--max-batch-size", "2", "--eager-gate", "disabled", "--no-cache", "--build-timeout", "12", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 600
    cands = _by_backend(_result(in_tmp, "hangs_when_exported"))
    assert cands["onnxruntime"]["status"] == "failed" and cands["onnxruntime"]["stage"] == "timeout"
    assert "--build-timeout" in cands["onnxruntime"]["reason"]
    assert cands["torchscript"]["status"] == "passed"
    assert (in_tmp / "model_repository" / "hangs_when_exported" / "1" / "model.pt").exists()


def _valid_model(model_dir: Path) -> bool:
    config = parse((model_dir / "config.pbtxt").read_text())
    return config.name == model_dir.name and (model_dir / "1" / "model.onnx").stat().st_size > 0


# not serial: every check (its processes, its tritonservers) is limited to this test's folder, so it runs beside the others
def test_killing_an_export_at_random_moments_never_damages_the_repository(in_tmp: Path):
    # seeded, so runs 2+ take the build and its measurement from the cache and reach the served search and the publish
    # within the kill window (an unseeded model's weights, and so its cache key, change on every run); each run gives the
    # search another budget, so its served search is not cached either and a tritonserver is there to be killed
    def args(budget: float) -> list[str]:
        return [*CLI, "export", "tests.fixtures.models:seeded_mlp", "--backend", "onnxruntime", "--max-batch-size", "4",
                "--eager-gate", "disabled", "--cache-dir", str(in_tmp / "cache"), "--overwrite", "--serve-search-seconds", str(budget)]

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run(args(6), cwd=in_tmp, env=env, capture_output=True).returncode == 0
    model_dir = in_tmp / "model_repository" / "seeded_mlp"
    rng = random.Random(7)
    for i in range(6):
        before = tree_snapshot(model_dir)
        proc = subprocess.Popen(args(6.5 + i / 2), cwd=in_tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 9.0))
        proc.send_signal(signal.SIGKILL if i % 2 == 0 else signal.SIGTERM)
        proc.wait(timeout=60)
        after = tree_snapshot(model_dir)
        assert after == before or _valid_model(model_dir), f"kill {i}: the model is neither the old nor a complete new one"
        assert _valid_model(model_dir)
        assert not [p for p in (in_tmp / "model_repository").iterdir() if p.name != "seeded_mlp"]
    deadline = time.monotonic() + 10  # a fork server killed while it imports torch exits when the import ends
    while processes_working_in(in_tmp) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_working_in(in_tmp), "no candidate, fork server or tritonserver may outlive a killed run"
    servers = subprocess.run(["pgrep", "-f", f"tritonserver.*{in_tmp}"], capture_output=True, text=True).stdout.split()
    assert not servers, "no served-search tritonserver may outlive a killed run"
    assert subprocess.run(args(6), cwd=in_tmp, env=env, capture_output=True).returncode == 0


@pytest.mark.long
def test_killing_an_export_with_its_children_during_the_served_search_leaves_no_process(in_tmp: Path):
    """As a CI runner ends a cancelled job (SIGKILL to the export and its children, the served search's tritonserver and
    perf_analyzer among them): the server's python stubs, which outlive it otherwise, are gone within seconds, the
    repository holds the old model or a complete new one, and the next export runs."""
    from tests.test_triton_server import processes_mentioning, regions_of
    from tests.test_triton_server_hard_exit import _kill_with_children

    def left(pid: int) -> list:  # the stubs and watchers name the run's folders and its server home (--cache-dir is in in_tmp)
        return processes_working_in(in_tmp) + processes_mentioning(str(in_tmp)) + regions_of(pid)

    def args(budget: float) -> list[str]:  # a new budget per run: its served search is not taken from the cache
        return [*CLI, "export", "tests.fixtures.models:seeded_mlp", "--backend", "onnxruntime", "--max-batch-size", "4",
                "--eager-gate", "disabled", "--cache-dir", str(in_tmp / "cache"), "--overwrite", "--serve-search-seconds", str(budget)]

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run(args(8), cwd=in_tmp, env=env, capture_output=True).returncode == 0
    model_dir, rng = in_tmp / "model_repository" / "seeded_mlp", random.Random(55)
    for i in range(2):
        before = tree_snapshot(model_dir)
        proc = subprocess.Popen(args(8.5 + i / 2), cwd=in_tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not regions_of(proc.pid):  # the served search has loaded a variant: its stubs run
            assert proc.poll() is None and time.monotonic() < deadline, f"kill {i}: the export never reached the served search"
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 4.0))
        _kill_with_children(proc)
        deadline = time.monotonic() + 30  # the watcher acts within a second; room for a busy machine
        while left(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left(proc.pid) == [], f"kill {i}: part of the run outlived it"
        assert tree_snapshot(model_dir) == before or _valid_model(model_dir), f"kill {i}: the model is neither the old nor a complete new one"
    assert subprocess.run(args(9.5), cwd=in_tmp, env=env, capture_output=True).returncode == 0
    assert _valid_model(model_dir)


def test_sigterm_stops_cleanly_and_reports_the_interruption(in_tmp: Path):
    args = [*CLI, "export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--backend", "torchscript",
            "--max-batch-size", "64", "--no-cache"]
    proc = subprocess.Popen(args, cwd=in_tmp, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (in_tmp / "aitune-reports" / "mlp" / "work" / "candidates").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "partial results are in" in err
    result = _result(in_tmp, "mlp")
    assert result["interrupted"] is True and result["selected"] is None
    assert not (in_tmp / "model_repository" / "mlp").exists()


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_while_publishing_leaves_the_old_model(in_tmp: Path):
    base = ("export", "tests.fixtures.models:wide", "--backend", "onnxruntime", "--max-batch-size", "2",
            "--eager-gate", "disabled", "--no-cache")
    assert run_cli(*base, cwd=in_tmp).returncode == 0
    repo = in_tmp / "model_repository"
    before = tree_snapshot(repo)
    report = in_tmp / "aitune-reports" / "wide" / "report.json"
    r = subprocess.run([*CLI, "publish", str(report), "--overwrite"], cwd=in_tmp, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, preexec_fn=_limit_file_size(200_000), timeout=600)
    assert r.returncode == 2, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "too large" in errors[0].lower() or "space" in errors[0].lower()
    assert "left as it was" in errors[0]
    assert tree_snapshot(repo) == before
    staging = in_tmp / ".model_repository.aitune-staging"
    assert not staging.exists() or {p.name for p in staging.iterdir()} <= {"lock"}, "no half-staged model is left behind"
    # with room again, the same command completes
    r = run_cli("publish", str(report), "--overwrite", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
