"""Publishing into a model repository: never damage what is there, even when killed; serialize publishers; re-emit a run.

Records are built directly (tests/triton_records.py); the kill and concurrency tests run real child
publishers (tests/publisher_child.py) and stop them at the repository's named checkpoints.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimizer.errors import ConfigRuleError, PublishError, TemplateError
from optimizer.model.samples import save_feeds
from optimizer.report.json_report import write_report
from optimizer.settings import ExportSettings
from optimizer.triton.repository import atomic as repository
from optimizer.triton.config.model_config import packaged_template_dir, parse
from optimizer.triton.repository.publish import PublishOptions, publish
from optimizer.triton.repository.atomic import CHECKPOINTS, ModelFiles, RepositoryState, publish_model
from tests.conftest import ROOT, run_cli
from tests.publisher_child import config_text
from tests.triton_records import make_result, tensor


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under root (root included): kind, inode, mtime and, for files, size and content hash."""
    out: dict[str, tuple[Any, ...]] = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("l", os.readlink(p))
        elif p.is_dir():
            out[rel] = ("d", st.st_ino, st.st_mtime_ns)
        else:
            out[rel] = ("f", st.st_ino, st.st_mtime_ns, st.st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def staging_leftovers(repo: Path) -> list[str]:
    root = repo.resolve().parent / f".{repo.name}.aitune-staging"
    return sorted(p.name for p in root.iterdir() if p.name != "lock") if root.exists() else []


def opts(repo: Path, **kw: Any) -> PublishOptions:
    return PublishOptions(repo, kw.pop("name", "m"), **kw)


# -- publishing from records ---------------------------------------------------------------------------


def test_new_model_lands_complete_with_nothing_left_beside_it(tmp_path: Path):
    result = make_result(tmp_path / "run", "onnxruntime_onnx", triton_settings={"parameters": {"intra_op_thread_count": 2}})
    published = publish(result, opts(tmp_path / "repo", warmup=True, report_dir=tmp_path / "report"))
    model = tmp_path / "repo" / "m"
    assert sorted(p.relative_to(model).as_posix() for p in model.rglob("*")) == [
        "1", "1/model.onnx", "config.pbtxt", "warmup", "warmup/image.data"]
    config = parse((model / "config.pbtxt").read_text())
    assert config.name == "m" and config.max_batch_size == 8 and not config.HasField("version_policy")
    assert (model / "1" / "model.onnx").read_bytes() == (tmp_path / "run" / "artifact" / "model.onnx").read_bytes()
    assert published.version == 1 and not published.replaced and published.versions == [1]
    assert staging_leftovers(tmp_path / "repo") == [] and sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["m"]
    batching = published.config["batching"]
    assert batching["max_queue_delay_microseconds"] == 100 and batching["peak"] == 4 and batching["share_us"] == 100


def test_report_json_shows_the_dynamic_batching_formula_inputs_and_result(tmp_path: Path):
    result = make_result(tmp_path / "run", "pytorch_libtorch", latency_budget_ms=3.65)  # p95 at batch 8 = 3.6 ms
    published = publish(result, opts(tmp_path / "repo"))
    report = write_report(tmp_path / "report" / "report.json", result, ExportSettings(name="m"), published)
    batching = json.loads(report.read_text())["published"]["config"]["batching"]
    assert batching["formula"].startswith("max_queue_delay_microseconds = clamp(10% of p50(batch 1)")
    assert {k: batching[k] for k in ("peak", "single_p50_ms", "share_us", "latency_budget_ms", "max_batch_latency_at", "budget_room_us",
                                     "max_queue_delay_microseconds", "preferred_batch_size")} == {
        "peak": 4, "single_p50_ms": 1.0, "share_us": 100, "latency_budget_ms": 3.65, "max_batch_latency_at": 8, "budget_room_us": 50,
        "max_queue_delay_microseconds": 50, "preferred_batch_size": [4]}
    config = parse((tmp_path / "repo" / "m" / "config.pbtxt").read_text())
    assert config.dynamic_batching.max_queue_delay_microseconds == 50


def test_existing_model_is_left_alone_and_the_error_says_how_to_proceed(tmp_path: Path):
    result = make_result(tmp_path / "run")
    repo = tmp_path / "repo"
    publish(result, opts(repo))
    before = snapshot(repo)
    with pytest.raises(PublishError) as err:
        publish(result, opts(repo))
    assert "already exists" in str(err.value) and "--version 2" in str(err.value) and "--overwrite" in str(err.value)
    assert snapshot(repo) == before and staging_leftovers(repo) == []


def test_version_adds_a_version_without_touching_the_others(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(make_result(tmp_path / "run1"), opts(repo, warmup=True))
    v1 = snapshot(repo / "m" / "1")
    old_sample = (repo / "m" / "warmup" / "image.data").read_bytes()
    published = publish(make_result(tmp_path / "run2", triton_settings={"parameters": {"intra_op_thread_count": 1}}),
                        opts(repo, version=2, warmup=True))
    after = snapshot(repo / "m" / "1")
    assert after.pop(".")[2] == v1.pop(".")[2] and after == v1  # the same files (same inodes), in a folder with the same mtime
    assert published.versions == [1, 2] and not published.replaced
    config = parse((repo / "m" / "config.pbtxt").read_text())
    assert config.version_policy.latest.num_versions == 1
    assert (repo / "m" / "warmup" / "image.data").read_bytes() == old_sample  # same sample data, rewritten as a new file
    with pytest.raises(PublishError, match="version 2 of model 'm' already exists"):
        publish(make_result(tmp_path / "run3"), opts(repo, version=2))


def test_older_version_number_is_served_explicitly(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(make_result(tmp_path / "a"), opts(repo, version=3))
    publish(make_result(tmp_path / "b"), opts(repo, version=2))
    config = parse((repo / "m" / "config.pbtxt").read_text())
    assert list(config.version_policy.specific.versions) == [2]


def test_overwrite_swaps_the_whole_model(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(make_result(tmp_path / "a"), opts(repo))
    publish(make_result(tmp_path / "b"), opts(repo, version=2))
    published = publish(make_result(tmp_path / "c", "pytorch_libtorch"), opts(repo, overwrite=True))
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["1", "config.pbtxt"]
    assert (repo / "m" / "1" / "model.pt").is_file() and published.replaced
    assert parse((repo / "m" / "config.pbtxt").read_text()).platform == "pytorch_libtorch"
    assert staging_leftovers(repo) == []


def test_a_new_version_must_keep_the_models_platform(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(make_result(tmp_path / "a"), opts(repo))
    before = snapshot(repo)
    with pytest.raises(PublishError, match="served by onnxruntime_onnx; the new version is pytorch_libtorch"):
        publish(make_result(tmp_path / "b", "pytorch_libtorch"), opts(repo, version=2))
    assert snapshot(repo) == before


def test_template_and_rule_errors_write_nothing(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(make_result(tmp_path / "a"), opts(repo, name="other"))
    before = snapshot(repo)
    bad = tmp_path / "templates"
    bad.mkdir()
    (bad / "onnxruntime_onnx.pbtxt.j2").write_text((packaged_template_dir() / "onnxruntime_onnx.pbtxt.j2").read_text() + "bogus: 1\n")
    with pytest.raises(TemplateError, match="no field named \"bogus\""):
        publish(make_result(tmp_path / "b"), opts(repo, template_dir=bad))
    with pytest.raises(ConfigRuleError, match="only supports max-batch 4"):
        publish(make_result(tmp_path / "c", "tensorrt_plan", device="cuda:0", metadata={"engine_max_batch": 4}), opts(repo))
    assert snapshot(repo) == before and staging_leftovers(repo) == []


def test_missing_artifact_is_a_clear_error(tmp_path: Path):
    result = make_result(tmp_path / "run")
    (tmp_path / "run" / "artifact" / "model.onnx").unlink()
    with pytest.raises(PublishError, match=r"the artifact files model\.onnx of onnxruntime\[cpu\] are gone from .*; re-run the export"):
        publish(result, opts(tmp_path / "repo"))
    assert not (tmp_path / "repo").exists()


def test_companion_files_follow_the_model_file_name(tmp_path: Path):
    result = make_result(tmp_path / "run", "openvino", files=["encoder.xml", "encoder.bin"],
                         triton_settings={"parameters": {"ENABLE_BATCH_PADDING": "YES"}})
    publish(result, opts(tmp_path / "repo"))
    assert sorted(p.name for p in (tmp_path / "repo" / "m" / "1").iterdir()) == ["model.bin", "model.xml"]


def test_without_atomic_exchange_an_existing_model_is_never_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A filesystem without RENAME_EXCHANGE (simulated: renameat2 answers EINVAL for every flag)."""
    repo = tmp_path / "repo"
    publish(make_result(tmp_path / "a"), opts(repo))
    before = snapshot(repo)
    monkeypatch.setattr(repository, "_renameat2", lambda src, dst, flags: errno.EINVAL)
    for kw in ({"overwrite": True}, {"version": 2}):
        with pytest.raises(PublishError, match="cannot swap directories atomically.*nothing was written"):
            publish(make_result(tmp_path / "b"), opts(repo, **kw))
        assert snapshot(repo) == before and staging_leftovers(repo) == []
    publish(make_result(tmp_path / "c"), opts(repo, name="fresh"))  # a new model only needs a plain rename
    assert (repo / "fresh" / "config.pbtxt").is_file()


def test_repository_that_is_a_mount_point_is_refused_before_anything_is_written(tmp_path: Path):
    """A real tmpfs mounted on the repository, in a private mount namespace (unshare)."""
    parent = tmp_path / "volume"
    (parent / "repo").mkdir(parents=True)
    result = make_result(tmp_path / "run")
    report = write_report(tmp_path / "run" / "report.json", result, ExportSettings(name="m", repository=str(parent / "repo")))
    script = (f"mount -t tmpfs none {parent / 'repo'} && cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} -m optimizer.cli publish {report}; "
              f"echo rc=$?; ls -A {parent}")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "rc=" not in r.stdout:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {r.stderr.strip()}")
    assert "rc=2" in r.stdout, r.stdout + r.stderr
    assert "is a mount point" in r.stderr and "nothing was written" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout.split("rc=2")[1].split() == ["repo"]  # no staging folder next to it, no lock


# -- killed at any moment ------------------------------------------------------------------------------


def _child(repo: Path, payload: Path, name: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.publisher_child", str(repo), name, "--payload", str(payload), *args],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_stopped(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Until the child has SIGSTOPped itself at its checkpoint (state 'T' in /proc/<pid>/stat)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"publisher exited rc={proc.returncode} before its checkpoint: {proc.stderr.read()}")
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("publisher never reached its checkpoint")


def _build(name: str, payload: Path):
    def build(state: RepositoryState) -> ModelFiles:
        return ModelFiles(config_text(name, state), {"model.onnx": payload}, {"warmup/image.data": f"new sample for version {state.version}".encode()})

    return build


def _seed(repo: Path, scenario: str, payload: Path) -> tuple[str, list[str]]:
    """A repository with something to damage; returns the model name and the child's flags."""
    repo.parent.mkdir(parents=True, exist_ok=True)
    old = repo.parent / "old.bin"
    old.write_bytes(b"old model" * 1000)
    publish_model(repo, "keep", _build("keep", old), None, False)
    if scenario == "new":
        return "m", []
    publish_model(repo, "m", _build("m", old), None, False)
    if scenario == "version":
        return "m", ["--version", "2"]
    publish_model(repo, "m", _build("m", old), 2, False)
    return "m", ["--overwrite"]


@pytest.mark.parametrize("scenario", ["new", "version", "overwrite"])
def test_killed_publisher_leaves_the_repository_as_it_was(tmp_path: Path, scenario: str):
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(4 << 20))  # big enough that copying it is a real step
    for point in CHECKPOINTS:
        base = tmp_path / point
        repo = base / "repo"
        name, flags = _seed(repo, scenario, payload)
        before = snapshot(repo)
        proc = _child(repo, payload, name, *flags, "--stop-at", point)
        _wait_stopped(proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        after = snapshot(repo)
        if point != "swapped":
            assert after == before, f"{scenario}: killed at {point!r}, the repository changed"
        else:  # the swap happened: the new model is complete, and nothing else changed
            assert (repo / name / "config.pbtxt").read_text().startswith(f'name: "{name}"')
            version = "2" if scenario == "version" else "1"
            assert (repo / name / version / "model.onnx").read_bytes() == payload.read_bytes()
            assert {k: v for k, v in after.items() if k.startswith("keep")} == {k: v for k, v in before.items() if k.startswith("keep")}
        # the next publisher is not blocked by the dead one's lock, and clears what it left
        publish_model(repo, "next", _build("next", payload), None, False)
        assert staging_leftovers(repo) == [], f"{scenario}/{point}: staging not cleaned"


def test_killed_version_publisher_never_writes_through_hard_links(tmp_path: Path):
    """Version 2 is staged next to hard links of version 1's files; its warmup file must be a new file, even mid-way."""
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"v2")
    repo = tmp_path / "repo"
    _seed(repo, "version", payload)
    served = (repo / "m" / "warmup" / "image.data").read_bytes()
    proc = _child(repo, payload, "m", "--version", "2", "--stop-at", "files_written")
    _wait_stopped(proc)
    assert (repo / "m" / "warmup" / "image.data").read_bytes() == served  # while the child is stopped mid-way
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (repo / "m" / "warmup" / "image.data").read_bytes() == served


def test_two_publishers_into_one_repository_run_one_after_the_other(tmp_path: Path):
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"model bytes")
    repo, log = tmp_path / "repo", tmp_path / "events.log"
    publish_model(repo, "m", _build("m", payload), None, False)
    first = _child(repo, payload, "m", "--version", "2", "--stop-at", "locked", "--log", str(log), "--tag", "P1")
    _wait_stopped(first)  # P1 holds the lock, stopped
    second = _child(repo, payload, "m", "--version", "3", "--log", str(log), "--tag", "P2")
    deadline = time.monotonic() + 60
    while "P2 start" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # P2 is running; whatever its speed, it cannot pass the lock while P1 holds it
    assert second.poll() is None and "P2 locked" not in log.read_text()
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=60) == 0, first.stderr.read()
    assert second.wait(timeout=60) == 0, second.stderr.read()
    events = log.read_text().splitlines()
    assert events.index("P1 swapped") < events.index("P2 locked")  # P1 finished its swap (its last step under the lock) first
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["1", "2", "3", "config.pbtxt", "warmup"]
    # P2 built its config under the lock, from the repository P1 had just changed
    assert "versions after publishing: [1, 2, 3]" in (repo / "m" / "config.pbtxt").read_text()
    assert staging_leftovers(repo) == []


# -- re-emitting a finished run ------------------------------------------------------------------------


def test_publish_report_re_emits_without_re_tuning(tmp_path: Path):
    result = make_result(tmp_path / "run", "onnxruntime_onnx", inputs=(tensor("input_ids", "int64", "1-128"),))
    settings = ExportSettings(repository=str(tmp_path / "repo"), name="enc", warmup=True)
    report = write_report(tmp_path / "run" / "report.json", result, settings)
    r = run_cli("publish", str(report), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    model = tmp_path / "repo" / "enc"
    assert (model / "1" / "model.onnx").is_file() and (model / "warmup" / "input_ids.data").is_file()
    assert parse((model / "config.pbtxt").read_text()).name == "enc"
    analyzer = tmp_path / "run" / "model_analyzer.yaml"
    assert f"Model Analyzer config: {analyzer}" in r.stdout

    import yaml

    cfg = yaml.safe_load(analyzer.read_text())
    assert cfg["triton_launch_mode"] == "local" and cfg["model_repository"] == str(tmp_path / "run" / "model_analyzer" / "repository")
    assert cfg["profile_models"] == {"enc": {"cpu_only": True}}
    assert cfg["run_config_search_max_model_batch_size"] == 8
    assert cfg["perf_analyzer_flags"]["input-data"] == str(tmp_path / "run" / "perf_analyzer_input.json")
    assert not Path(cfg["export_path"]).is_relative_to(tmp_path / "repo")

    r = run_cli("publish", str(report), "--repository", str(tmp_path / "repo"), cwd=tmp_path)
    assert r.returncode == 2 and "already exists" in r.stderr and "--version 2" in r.stderr
    r = run_cli("publish", str(report), "--version", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in model.iterdir()) == ["1", "2", "config.pbtxt", "warmup"]


def test_publish_report_whose_artifacts_are_gone_fails_clearly(tmp_path: Path):
    result = make_result(tmp_path / "run")
    report = write_report(tmp_path / "run" / "report.json", result, ExportSettings(repository=str(tmp_path / "repo"), name="m"))
    shutil.rmtree(tmp_path / "run" / "artifact")
    r = run_cli("publish", str(report), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "are gone from" in r.stderr and "re-run the export" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "repo").exists()


def test_model_analyzer_config_carries_the_latency_budget(tmp_path: Path):
    import yaml

    result = make_result(tmp_path / "run", latency_budget_ms=4.0)
    published = publish(result, opts(tmp_path / "repo", report_dir=tmp_path / "report"))
    text = Path(published.model_analyzer_config).read_text()
    cfg = yaml.safe_load(text)
    assert cfg["constraints"] == {"perf_latency_p99": {"max": 4.0}} and "p95" in text  # the header says which percentile we used
    assert "shape" not in cfg["perf_analyzer_flags"]  # fixed dims need no --shape


@pytest.mark.slow
def test_export_stops_on_a_template_error_keeps_the_report_and_publish_finishes_the_job(tmp_path: Path):
    """A real export (one small ONNX Runtime candidate): the broken template stops it before anything is written;
    `publish REPORT` then re-emits the model without re-tuning, warmup included, and the config fits the real graph."""
    bad = tmp_path / "templates" / "partials"
    bad.mkdir(parents=True)
    (bad / "batching.pbtxt.j2").write_text("dynamic_batching { max_queue_delay_microsecond: 5 }\n")
    args = ("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--max-batch-size", "2", "--eager-gate", "disabled",
            "--warmup", "--repository", str(tmp_path / "repo"), "--report-dir", str(tmp_path / "report"))
    r = run_cli(*args, "--template-dir", str(tmp_path / "templates"), cwd=ROOT)
    assert r.returncode == 2, r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "at line" in error[0] and "column" in error[0] and "max_queue_delay_microsecond" in error[0]
    assert str(bad / "batching.pbtxt.j2") in error[0]
    assert not (tmp_path / "repo" / "mlp").exists() and (tmp_path / "report" / "report.json").is_file()

    r = run_cli("publish", str(tmp_path / "report" / "report.json"), "--template-dir", str(ROOT / "model_repository_templates"), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    model = tmp_path / "repo" / "mlp"
    config = parse((model / "config.pbtxt").read_text())
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 2
    assert [w.batch_size for w in config.model_warmup] == [1, 2] and (model / "warmup").is_dir()
    assert (model / "1" / "model.onnx").is_file() and (tmp_path / "report" / "model_analyzer.yaml").is_file()


def test_perf_analyzer_input_is_the_profiled_request_mix_beside_the_report(tmp_path: Path):
    result = make_result(tmp_path / "run")
    save_feeds(Path(result.reference.feeds), [{"image": np.zeros((5, 3, 8, 8), np.float32)}])  # correctness samples: not the mix
    save_feeds(Path(result.reference.profile_feed), [{"image": np.ones((3, 3, 8, 8), np.float32)}])
    published = publish(result, opts(tmp_path / "repo", report_dir=tmp_path / "report"))
    doc = json.loads(Path(published.perf_analyzer_input).read_text())
    assert Path(published.perf_analyzer_input).parent == tmp_path / "report"
    assert len(doc["data"]) == 3 and doc["data"][0]["image"]["shape"] == [3, 8, 8]
    assert base64.b64decode(doc["data"][0]["image"]["content"]["b64"]) == np.ones((3, 8, 8), np.float32).tobytes()
    assert not any(p.name.endswith(".json") for p in (tmp_path / "repo").rglob("*"))


def test_a_report_folder_stays_outside_the_repository(tmp_path: Path):
    from optimizer.errors import SettingsError

    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (tmp_path / "a_file").write_text("")
    assert repository.outside_repository(tmp_path / "reports", repo, "--report") == tmp_path / "reports"
    with pytest.raises(SettingsError, match=r"^--report-dir '.*repo/m/out' is inside the repository '.*repo'; Triton would see it as a model"):
        repository.outside_repository(repo / "m" / "out", repo, "--report-dir")
    with pytest.raises(SettingsError, match="is inside the repository"):
        repository.outside_repository(repo, repo, "--report")
    with pytest.raises(SettingsError, match=r"^--report '.*a_file' is a file; give a folder\.$"):
        repository.outside_repository(tmp_path / "a_file", repo, "--report")
