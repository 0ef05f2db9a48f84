"""Repositories in object storage (s3://), against a real S3 API on loopback (moto's server, started by a fixture).

The publish order is checked the way Triton would see it: at every step of a publish the bucket is listed
through the S3 API and the versions its config.pbtxt selects must be complete and unchanged, never a folder
of files without a config (Triton auto-completes those). The slow test exports a model into s3:// and the
real tritonserver 2.51 loads it from there and answers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from optimizer.errors import PublishError, SettingsError
from optimizer.report.json_report import write_report
from optimizer.settings import ExportSettings
from optimizer.triton.repository.object_store import upload
from optimizer.triton.repository.object_store.location import parse_location, store_url
from optimizer.triton.repository.object_store.upload import MANIFEST, served_versions, stored_versions
from optimizer.triton.repository.publish import PublishOptions, publish
from tests.conftest import S3_CREDENTIALS, MotoS3, run_cli
from tests.triton_records import make_result

ONNX_FILES = ["model.onnx", "model.onnx.data"]  # a model file and its external data: the model file must come last


# -- URLs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, bucket, prefix, endpoint", [
    ("s3://models/prod/triton", "models", "prod/triton", None),
    ("s3://models", "models", "", None),
    ("s3://127.0.0.1:9000/models/repo", "models", "repo", "http://127.0.0.1:9000"),
    ("s3://http://minio.local:9000/models/repo/", "models", "repo", "http://minio.local:9000"),
    ("s3://https://minio.local:9443/models//repo", "models", "repo", "https://minio.local:9443"),
])
def test_both_url_forms_are_read_as_triton_reads_them(url: str, bucket: str, prefix: str, endpoint: str | None):
    location = parse_location(url)
    assert (location.bucket, location.prefix, location.endpoint) == (bucket, prefix, endpoint)
    assert parse_location(location.url) == location  # the canonical URL means the same repository
    assert parse_location(Path(url)) == location  # a URL that went through Path() is still recognized
    assert store_url("model_repository") is None and store_url(Path("/models/repo")) is None


@pytest.mark.parametrize("url, fragment", [
    ("s3://", "names no bucket"),
    ("s3://127.0.0.1:9000", "names no bucket"),
    ("s3://My_Models/repo", "is not an S3 bucket name"),
    ("s3://127.0.0.1:99999/models/repo", "is not HOST:PORT"),
    ("s3://models/my repo", "characters Triton's s3 path parser does not accept"),
    ("s3://https://models/repo", "without HOST:PORT"),
])
def test_a_bad_url_is_one_line_naming_the_rule(url: str, fragment: str):
    with pytest.raises(SettingsError, match=fragment) as err:
        parse_location(url)
    assert "\n" not in str(err.value) and "s3://" in str(err.value)


# -- what Triton would load at every step of a publish -----------------------------------------------


class Watcher:
    """Lists the model's objects at every publish step (through the S3 API), as a polling Triton would find them."""

    def __init__(self, s3: MotoS3, bucket: str, model_key: str) -> None:
        self.s3, self.bucket, self.model_key = s3, bucket, model_key
        self.steps: list[tuple[str, str]] = []
        self.views: list[dict[str, Any]] = []

    def view(self) -> dict[str, Any]:
        objects = {k[len(self.model_key) + 1:]: e for k, e in self.s3.objects(self.bucket, self.model_key + "/").items()}
        config = self.s3.read(self.bucket, f"{self.model_key}/config.pbtxt").decode() if "config.pbtxt" in objects else None
        return {"objects": objects, "config": config}

    def __call__(self, step: str, path: str) -> None:
        self.steps.append((step, path))
        self.views.append(self.view())


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch):
    def start(s3: MotoS3, bucket: str, model_key: str) -> Watcher:
        watcher = Watcher(s3, bucket, model_key)
        monkeypatch.setattr(upload, "checkpoint_hook", watcher)
        return watcher
    return start


def loaded(view: dict[str, Any]) -> dict[int, dict[str, str]]:
    """The versions Triton would load from this view, with their files (path -> ETag)."""
    objects = view["objects"]
    if not objects:
        return {}
    assert view["config"] is not None, f"files without config.pbtxt ({sorted(objects)}): Triton would auto-complete a config and load them"
    versions = stored_versions(objects)
    return {v: {p: e for p, e in objects.items() if p.startswith(f"{v}/")} for v in served_versions(view["config"], versions)}


def assert_never_half_written(watcher: Watcher, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Every view in between: each loadable version is exactly as before (old config family) or exactly as after (final config)."""
    old, new = loaded(before), loaded(after)
    for step, view in zip(watcher.steps, [*watcher.views[1:], after]):
        for version, files in loaded(view).items():
            if version in old and files == old[version] and view["config"] != after["config"]:
                continue  # an untouched version, served by the previous config or its gate
            assert version in new and files == new[version], f"after {step} {view}: version {version} would load with files {files}"
            assert view["config"] == after["config"], f"after {step}: version {version} would load with a config that is not the final one"


def options(url: str, **kw: Any) -> PublishOptions:
    return PublishOptions(url, kw.pop("name", "m"), **kw)


def test_a_new_model_is_gated_until_its_config_commits_it(s3: MotoS3, tmp_path: Path, watch):
    bucket = s3.bucket()
    result = make_result(tmp_path, files=ONNX_FILES)
    watcher = watch(s3, bucket, "repo/m")
    published = publish(result, options(s3.url(bucket), warmup=True, report_dir=tmp_path / "report"))
    after = watcher.view()
    assert published.model_dir == f"{s3.url(bucket)}/m" and published.version == 1
    steps = [s for s, _ in watcher.steps]
    uploads = [p for s, p in watcher.steps if s == "upload"]
    assert steps[0] == "gate" and steps[-2:] == ["manifest", "commit"] and set(steps) == {"gate", "upload", "manifest", "commit"}
    assert uploads == ["warmup/image.data", "1/model.onnx.data", "1/model.onnx"]  # warmup first, the model file last
    assert all(loaded(v) == {} for v in watcher.views)  # nothing loadable before the commit
    assert loaded(after) == {1: {p: e for p, e in after["objects"].items() if p.startswith("1/")}}
    assert_never_half_written(watcher, {"objects": {}, "config": None}, after)
    assert "model_warmup" in after["config"] and "version_policy" not in after["config"]
    # the assembled model stays beside the report: Model Analyzer's base repository reads it
    staged = tmp_path / "report" / "work" / "object_store" / "m"
    assert (staged / "1" / "model.onnx").is_file() and (tmp_path / "report" / "model_analyzer.yaml").is_file()


def test_an_existing_model_is_never_clobbered_without_overwrite(s3: MotoS3, tmp_path: Path):
    bucket = s3.bucket()
    url = s3.url(bucket)
    publish(make_result(tmp_path / "a"), options(url))
    before = s3.objects(bucket)
    with pytest.raises(PublishError, match=r"model 'm' already exists in .*; nothing was changed. Add it as a new version with --version 2"):
        publish(make_result(tmp_path / "b"), options(url))
    with pytest.raises(PublishError, match="version 1 of model 'm' already exists"):
        publish(make_result(tmp_path / "b"), options(url, version=1))
    assert s3.objects(bucket) == before


def test_version_n_is_added_while_the_served_version_stays_pinned(s3: MotoS3, tmp_path: Path, watch):
    bucket = s3.bucket()
    url = s3.url(bucket)
    publish(make_result(tmp_path / "a", files=ONNX_FILES), options(url))
    v1 = {k: e for k, e in s3.objects(bucket).items() if "/1/" in k}
    watcher = watch(s3, bucket, "repo/m")
    before = watcher.view()
    published = publish(make_result(tmp_path / "b", files=ONNX_FILES, max_batch=4), options(url, version=2))
    after = watcher.view()
    assert published.version == 2 and published.versions == [1, 2]
    assert_never_half_written(watcher, before, after)
    assert all(set(loaded(v)) == {1} for v in watcher.views)  # version 1 served (pinned) until the commit
    assert set(loaded(after)) == {2} and "latest" in after["config"]  # then the new version, with its own config
    assert {k: e for k, e in s3.objects(bucket).items() if "/1/" in k} == v1  # version 1's files never touched
    gate = watcher.views[1]["config"]
    assert "specific" in gate and "versions: [1]" in gate and "max_batch_size: 8" in gate  # the old config, pinned to version 1


def test_overwrite_replaces_the_model_and_loads_nothing_in_between(s3: MotoS3, tmp_path: Path, watch):
    bucket = s3.bucket()
    url = s3.url(bucket)
    publish(make_result(tmp_path / "a"), options(url))
    publish(make_result(tmp_path / "b"), options(url, version=3))
    watcher = watch(s3, bucket, "repo/m")
    before = watcher.view()
    published = publish(make_result(tmp_path / "c", files=ONNX_FILES, max_batch=2), options(url, overwrite=True))
    after = watcher.view()
    assert published.replaced and published.versions == [1]
    assert_never_half_written(watcher, before, after)
    assert all(loaded(v) == {} for v in watcher.views[1:])  # the gate selects nothing while files change
    assert sorted(after["objects"]) == ["1/model.onnx", "1/model.onnx.data", MANIFEST, "config.pbtxt"]  # version 3 is gone
    assert [s for s, _ in watcher.steps].count("delete") == 1  # 3/model.onnx (1/model.onnx is rewritten, not deleted)


def test_the_manifest_holds_the_sha256_of_every_file(s3: MotoS3, tmp_path: Path):
    bucket = s3.bucket()
    url = s3.url(bucket)
    publish(make_result(tmp_path / "a", files=ONNX_FILES), options(url, warmup=True))
    publish(make_result(tmp_path / "b", files=ONNX_FILES), options(url, version=2))
    keys = s3.objects(bucket, "repo/m/")
    manifest = json.loads(s3.read(bucket, f"repo/m/{MANIFEST}"))
    assert manifest["model"] == "m" and manifest["versions"] == [1, 2] and manifest["version"] == 2
    stored = {k[len("repo/m/"):]: s3.read(bucket, k) for k in keys if not k.endswith(MANIFEST)}
    assert set(manifest["files"]) == set(stored)  # every file, the kept version 1 and the final config included
    for path, data in stored.items():
        assert manifest["files"][path] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, path


def test_a_failed_publish_takes_back_what_it_wrote(s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bucket = s3.bucket()
    url = s3.url(bucket)

    def fail_at_model_file(step: str, path: str) -> None:
        if path == "1/model.onnx" or path == "2/model.onnx":
            raise ConnectionResetError("the store went away")

    monkeypatch.setattr(upload, "checkpoint_hook", fail_at_model_file)
    with pytest.raises(PublishError, match="stopped: ConnectionResetError: the store went away. Nothing of it was left"):
        publish(make_result(tmp_path / "a", files=ONNX_FILES), options(url))
    assert s3.objects(bucket) == {}
    monkeypatch.setattr(upload, "checkpoint_hook", None)
    publish(make_result(tmp_path / "a", files=ONNX_FILES), options(url))
    before = {k: s3.read(bucket, k) for k in s3.objects(bucket)}
    monkeypatch.setattr(upload, "checkpoint_hook", fail_at_model_file)
    with pytest.raises(PublishError, match="is as it was"):
        publish(make_result(tmp_path / "b", files=ONNX_FILES), options(url, version=2))
    assert {k: s3.read(bucket, k) for k in s3.objects(bucket)} == before


def test_publish_report_into_s3_and_the_settings_key(s3: MotoS3, tmp_path: Path):
    bucket = s3.bucket()
    result = make_result(tmp_path / "run")
    report = write_report(tmp_path / "run" / "report.json", result, ExportSettings(repository=s3.url(bucket, "from-settings"), name="m"))
    env = dict(S3_CREDENTIALS, AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    r = run_cli("publish", str(report), cwd=tmp_path, env=env)  # the run's `repository` setting
    assert r.returncode == 0 and f"published {s3.url(bucket, 'from-settings')}/m (version 1)" in r.stdout, r.stderr
    r = run_cli("publish", str(report), "--repository", s3.url(bucket, "other"), "--version", "3", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(k for k in s3.objects(bucket) if "/3/" in k or k.endswith("config.pbtxt")) == [
        "from-settings/m/config.pbtxt", "other/m/3/model.onnx", "other/m/config.pbtxt"]
    r = run_cli("publish", str(report), "--repository", s3.url(bucket, "other"), cwd=tmp_path, env=env)
    assert r.returncode == 2 and "already exists" in r.stderr and "--version 4" in r.stderr


def test_validate_fails_a_model_whose_publish_did_not_finish(s3: MotoS3, tmp_path: Path):
    bucket = s3.bucket()
    publish(make_result(tmp_path / "a"), options(s3.url(bucket)))
    gate = s3.read(bucket, "repo/m/config.pbtxt").decode() + "version_policy { specific { } }\n"
    s3.client.put_object(Bucket=bucket, Key="repo/m/config.pbtxt", Body=gate.encode())  # as a publish stopped before its commit
    env = dict(S3_CREDENTIALS, AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    r = run_cli("validate", s3.url(bucket), cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 1 and "incomplete publish" in r.stdout + r.stderr and "not the one aitune-manifest.json lists" in r.stderr, r.stderr
    assert json.loads((tmp_path / "aitune-reports" / "m" / "validation.json").read_text())["status"] == "failed"


# -- errors before anything is written ----------------------------------------------------------------


def test_missing_bucket_unreachable_endpoint_and_missing_credentials_say_which(s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    result = make_result(tmp_path)
    with pytest.raises(PublishError, match=r"bucket 'no-such-bucket' does not exist at http://127.0.0.1:\d+; create it first"):
        publish(result, options(s3.url("no-such-bucket")))
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with pytest.raises(PublishError, match=rf"cannot reach the S3 endpoint http://127.0.0.1:{closed} .*check that the storage is running"):
        publish(result, options(f"s3://127.0.0.1:{closed}/bucket/repo"))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(PublishError, match="no usable AWS credentials .*set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"):
        publish(result, options(s3.url(s3.bucket())))


def test_the_cli_reports_a_bad_store_in_one_line_with_exit_2(s3: MotoS3, tmp_path: Path):
    env = dict(S3_CREDENTIALS, AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    r = run_cli("validate", s3.url("no-such-bucket"), cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bucket 'no-such-bucket' does not exist" in r.stderr, r.stderr
    r = run_cli("validate", "s3://Not_A_Bucket/repo", cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2 and "is not an S3 bucket name" in r.stderr, r.stderr
    bucket = s3.bucket()
    r = run_cli("validate", s3.url(bucket), cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2 and "holds 0 models" in r.stderr, r.stderr
    r = run_cli("export", "--repository", "s3://127.0.0.1:1/bucket/repo", cwd=tmp_path, env=env, timeout=120)  # before any tuning
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot reach the S3 endpoint http://127.0.0.1:1" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".cache") == []  # no report, no repository


# -- end to end: export into s3://, the real tritonserver reads it from there ---------------------------


@pytest.mark.slow
def test_export_publishes_into_s3_and_tritonserver_serves_it_from_there(s3: MotoS3, tmp_path: Path):
    bucket = s3.bucket()
    url = s3.url(bucket, "prefix/repo")
    env = dict(S3_CREDENTIALS, AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    r = run_cli("export", "--backend", "onnxruntime", "--max-batch-size", "2", "--eager-gate", "disabled", "--no-validate",
                "--repository", url, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert f"published {url}/cnn (version 1)" in r.stdout
    assert sorted(k.rsplit("/", 1)[-1] for k in s3.objects(bucket)) == [MANIFEST, "config.pbtxt", "model.onnx"]
    assert not (tmp_path / "model_repository").exists()  # nothing published locally
    r = run_cli("validate", url, "--concurrency", "1:1", "--measurement-interval", "300", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    record = json.loads((tmp_path / "aitune-reports" / "cnn" / "validation.json").read_text())
    assert record["status"] == "passed" and record["loaded"] and record["repository"] == url
    assert any(f"--model-repository {url}" in n for n in record["notes"])  # Triton's own S3 client read it
    assert all(a["passed"] and a["compared_with"] == "reference" for a in record["answers"])  # the export's report was found
