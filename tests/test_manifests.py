"""Deployment manifests (optimizer/fleet/manifests.py): valid Kubernetes objects whose fields match the published model.

The published model is real: the config of the stored run of the bundled example (tests/fixtures/report_cnn.json),
rendered by the publisher itself and laid out as a repository. Core objects (the Job, and the predictor's container
fields as a core/v1 Container in a Pod) are schema-checked with kubernetes-validate, at the oldest Kubernetes where
every field used is GA (1.33: backoffLimitPerIndex) and the newest it knows. The InferenceService is a KServe CRD,
which kubernetes-validate does not cover, and no package this project can install ships its schema (the kserve
wheel needs protobuf 6; tritonclient 2.51 pins 4): its KServe-only fields are checked against ISVC_SCHEMA below,
written from KServe's v1beta1 API types (closed objects, so a misspelled field fails), and its values against
what KServe's webhook (the name rule) and the Triton runtime (storageUri at the repository root) accept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from optimizer.errors import PublishError, SettingsError
from optimizer.fleet import manifests
from optimizer.fleet.manifests import (
    DEFAULT_RELEASE,
    MAX_SERVICE_NAME,
    PVC_PLACEHOLDER,
    dns_label,
    indexed_job,
    inference_service,
    record_manifests,
    runtime_version,
    write_manifests,
)
from optimizer.records.tune_result import TuneResult
from optimizer.report.markdown import render_markdown
from optimizer.triton.repository.publish import PublishOptions, prepare_config
from optimizer.triton.repository.atomic import Published
from tests.conftest import FIXTURES, ROOT

ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""KServe's webhook rule for an InferenceService name (IsvcNameFmt)."""
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
K8S_VERSIONS = ("1.33", kubernetes_validate.latest_version())
CONTAINER_FIELDS = ("args", "command", "env", "resources")
"""The core/v1 Container fields the predictor sets (KServe's ModelSpec inlines a Container); kubernetes-validate checks them."""
_CLOSED = {"type": "object", "additionalProperties": False}
ISVC_SCHEMA = {
    **_CLOSED,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"},
        "kind": {"const": "InferenceService"},
        "metadata": {**_CLOSED, "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": ISVC_NAME.pattern, "maxLength": 63},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        }},
        "spec": {**_CLOSED, "required": ["predictor"], "properties": {"predictor": {**_CLOSED, "required": ["model"], "properties": {
            "model": {**_CLOSED, "required": ["modelFormat", "storageUri"], "properties": {
                "modelFormat": {**_CLOSED, "required": ["name"], "properties": {"name": {"type": "string"}, "version": {"type": "string"}}},
                "runtime": {"type": "string"},
                "runtimeVersion": {"type": "string"},
                "protocolVersion": {"enum": ["v1", "v2", "grpc-v2"]},
                "storageUri": {"type": "string", "pattern": r"^(s3|gs|pvc|hdfs|webhdfs|https?|oci|hf)://"},
                **{name: {} for name in CONTAINER_FIELDS},  # checked by kubernetes-validate, as a Container
            }},
        }}}},
    },
}
"""The part of KServe's InferenceService (v1beta1 InferenceServiceSpec -> PredictorSpec -> ModelSpec) the manifest uses."""


def _publish(repository: Path, name: str) -> Published:
    """The stored run's model as the publisher lays it out: <repository>/<name>/config.pbtxt and version 1."""
    doc = json.loads((FIXTURES / "report_cnn.json").read_text())
    text, _, spec = prepare_config(TuneResult.from_json(doc["result"]), PublishOptions(repository, name))
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(text)
    (model_dir / "1" / "model.onnx").write_bytes(b"onnx")
    return Published(model_dir, 1, False, [1], config=spec.to_json())


def _model(manifest) -> dict:
    return manifest.body["spec"]["predictor"]["model"]


def _validate(body: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(body, version, strict=True)


def _validate_isvc(body: dict) -> None:
    """The KServe fields against ISVC_SCHEMA; the predictor's container fields as a core/v1 Container, in a Pod."""
    jsonschema.Draft202012Validator(ISVC_SCHEMA).validate(body)
    model = body["spec"]["predictor"]["model"]
    container = {"name": "kserve-container", "image": "nvcr.io/nvidia/tritonserver:" + model["runtimeVersion"]}
    container |= {k: model[k] for k in CONTAINER_FIELDS if k in model}
    _validate({"apiVersion": "v1", "kind": "Pod", "metadata": body["metadata"], "spec": {"containers": [container]}})


# -- the InferenceService ------------------------------------------------------------------------


def test_inference_service_matches_the_published_model(tmp_path: Path):
    published = _publish(tmp_path / "repo", "cnn")
    path = write_manifests(tmp_path / "report", published.model_dir, published.config, "24.10", cores=2)
    assert path == tmp_path / "report" / "kserve" / "inferenceservice.yaml"
    text = path.read_text()
    body = yaml.safe_load(text)
    assert body["apiVersion"] == "serving.kserve.io/v1beta1" and body["kind"] == "InferenceService"
    model = body["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "triton"} and model["protocolVersion"] == "v2"
    assert model["runtimeVersion"] == "24.10-py3"
    # storageUri is the repository root: the folder that holds cnn/config.pbtxt
    assert model["storageUri"] == f"pvc://{PVC_PLACEHOLDER}/repo"
    assert (tmp_path / model["storageUri"].rsplit("/", 1)[1] / "cnn" / "config.pbtxt").is_file()
    # the model clients call is the folder's name, and the only one the server loads
    assert model["args"] == ["--model-control-mode=explicit", "--load-model=cnn"]
    assert body["metadata"]["name"] == "cnn" and body["metadata"]["annotations"]["aitune-export/model-name"] == "cnn"
    # resources: the instance group (1 KIND_CPU instance) x its intra-op threads, requests equal to limits
    group, threads = published.config["instance_group"], int(published.config["parameters"]["intra_op_thread_count"])
    cpu = str(group["count"] * threads)
    assert model["resources"] == {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    assert "/v2/models/cnn/infer" in text and "EDIT BEFORE APPLYING" in text
    _validate_isvc(body)


def test_object_storage_repositories_map_to_storage_uri_as_they_are(tmp_path: Path):
    config = _publish(tmp_path / "repo", "cnn").config
    for model_dir in ("s3://bucket/models/cnn", "gs://bucket/team/models/cnn/"):
        repository, name = manifests.split_model_dir(model_dir)
        manifest = inference_service(repository, name, config, cores=2)
        model = _model(manifest)
        assert model["storageUri"] == model_dir.rstrip("/").rsplit("/", 1)[0] and model["args"][-1] == "--load-model=cnn"
        assert not manifest.needs_edit and "EDIT BEFORE APPLYING" not in manifest.text()
        assert yaml.safe_load(manifest.text()) == manifest.body
        _validate_isvc(manifest.body)


def test_an_s3_endpoint_moves_out_of_the_storage_uri(tmp_path: Path):
    """Triton reads s3://HOST:PORT/BUCKET/PREFIX; KServe reads s3://BUCKET/PREFIX and takes the endpoint from annotations."""
    config = _publish(tmp_path / "repo", "cnn").config
    path = write_manifests(tmp_path / "report", "s3://127.0.0.1:9000/bucket/models/cnn", config, cores=2)
    manifest = yaml.safe_load(path.read_text())
    assert manifest["spec"]["predictor"]["model"]["storageUri"] == "s3://bucket/models"
    assert "serving.kserve.io/s3-endpoint: '127.0.0.1:9000' and serving.kserve.io/s3-usehttps: '0'" in path.read_text()


def test_a_model_folder_given_as_the_repository_is_refused(tmp_path: Path):
    """Mistake 1: storageUri one level too deep. The model folder (or its version folder) is never a repository."""
    published = _publish(tmp_path / "repo", "cnn")
    with pytest.raises(PublishError, match="one level too deep") as err:
        inference_service(published.model_dir, "cnn", published.config)
    assert str(tmp_path / "repo") in str(err.value)  # the fix: the folder that holds it
    with pytest.raises(PublishError, match="one level too deep"):
        write_manifests(tmp_path / "report", published.model_dir / "1", published.config)
    with pytest.raises(PublishError, match="not in the repository"):  # the repository given as the model's folder
        write_manifests(tmp_path / "report", tmp_path / "repo", published.config)
    assert not (tmp_path / "report").exists()


def test_a_model_name_that_differs_from_its_folder_is_refused(tmp_path: Path):
    """Mistake 2: the config's name and the folder's disagree (Triton refuses it; clients ask for the wrong name)."""
    published = _publish(tmp_path / "repo", "cnn")
    renamed = published.model_dir.rename(tmp_path / "repo" / "classifier")  # config.pbtxt still says "cnn"
    with pytest.raises(PublishError, match="'cnn' but lies in the folder 'classifier'"):
        write_manifests(tmp_path / "report", renamed, {**published.config, "name": None})
    with pytest.raises(PublishError, match="--name 'classifier'"):  # the published record disagrees too (object storage: no file to read)
        inference_service("s3://bucket/models", "classifier", published.config)


def test_a_name_kserve_refuses_is_converted_while_clients_keep_the_folder_name(tmp_path: Path):
    published = _publish(tmp_path / "repo", "Bert_Large.v2")
    manifest = inference_service(tmp_path / "repo", "Bert_Large.v2", published.config, cores=2)
    assert manifest.body["metadata"]["name"] == "bert-large-v2"
    assert _model(manifest)["args"][-1] == "--load-model=Bert_Large.v2"
    assert manifest.body["metadata"]["annotations"]["aitune-export/model-name"] == "Bert_Large.v2"
    assert "/v2/models/Bert_Large.v2/infer" in manifest.text()
    _validate_isvc(manifest.body)


def test_the_inference_service_check_sees_mistakes(tmp_path: Path):
    """The checks can fail: a name KServe refuses, a misspelled KServe field, a storageUri KServe cannot read, and
    container fields a Container does not have (args as one string, `limit` for `limits`)."""
    body = inference_service("s3://bucket/models", "cnn", _publish(tmp_path / "repo", "cnn").config, cores=2).body
    model = body["spec"]["predictor"]["model"]
    for broken in ({**body, "metadata": {"name": "Bert_Large"}},
                   {**body, "spec": {"predictor": {"model": {**{k: v for k, v in model.items() if k != "storageUri"}, "storageURI": "s3://b/m"}}}},
                   {**body, "spec": {"predictor": {"model": {**model, "storageUri": "/models"}}}},
                   {**body, "spec": {"predictor": {"model": {**model, "args": "--load-model=cnn"}}}},
                   {**body, "spec": {"predictor": {"model": {**model, "resources": {"limit": {"cpu": "2"}}}}}}):
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            _validate_isvc(broken)


@given(st.text(min_size=1, max_size=200))
def test_every_name_becomes_a_name_kserve_accepts(name: str):
    label = dns_label(name, MAX_SERVICE_NAME)
    assert ISVC_NAME.match(label) and len(label) <= MAX_SERVICE_NAME


def test_long_names_stay_apart():
    a, b = "resnet" * 20 + "_a", "resnet" * 20 + "_b"
    assert dns_label(a, MAX_SERVICE_NAME) != dns_label(b, MAX_SERVICE_NAME)


def test_a_gpu_model_asks_for_its_gpus_and_a_core_per_instance(tmp_path: Path):
    config = _publish(tmp_path / "repo", "cnn").config
    config = {**config, "template": "tensorrt_plan", "platform": "tensorrt_plan", "parameters": {},
              "instance_group": {"kind": "KIND_GPU", "count": 2, "gpus": [0], "profile": ["0"]}}
    manifest = inference_service("s3://bucket/models", "cnn", config)
    resources = _model(manifest)["resources"]
    assert resources["limits"] == {"cpu": "2", "nvidia.com/gpu": "1"} and resources["requests"] == resources["limits"]
    assert "WARNING" not in manifest.text()
    _validate_isvc(manifest.body)
    pinned = inference_service("s3://bucket/models", "cnn", {**config, "instance_group": {**config["instance_group"], "gpus": [1]}})
    assert "WARNING: config.pbtxt pins GPU(s) [1]" in pinned.text()  # a pod numbers its GPUs from 0


def test_a_cpu_model_without_thread_counts_asks_for_the_measured_cores(tmp_path: Path):
    config = {**_publish(tmp_path / "repo", "cnn").config, "parameters": {}}
    assert _model(inference_service("s3://bucket/models", "cnn", config, cores=6))["resources"]["limits"] == {"cpu": "6"}


def test_runtime_version_is_the_release_image_tag():
    assert runtime_version("24.10") == "24.10-py3"
    for bad in ("24.10-py3", "2.51", "latest", ""):
        with pytest.raises(SettingsError, match="--triton-release"):
            runtime_version(bad)


def test_default_release_is_the_dockerfiles():
    """The InferenceService's runtime and the image docker/Dockerfile builds are one Triton release."""
    arg = re.search(r"^ARG RELEASE=(\S+)$", (ROOT / "docker" / "Dockerfile").read_text(), re.MULTILINE)
    assert arg and arg.group(1) == DEFAULT_RELEASE
    assert _model(inference_service("s3://bucket/models", "cnn", {"name": "cnn"}, cores=1))["runtimeVersion"] == f"{DEFAULT_RELEASE}-py3"


def test_the_local_placeholder_cannot_be_applied_unedited(tmp_path: Path):
    published = _publish(tmp_path / "repo", "cnn")
    manifest = inference_service(tmp_path / "repo", "cnn", published.config, cores=2)
    claim = _model(manifest)["storageUri"].removeprefix("pvc://").split("/")[0]
    assert manifest.needs_edit and claim == PVC_PLACEHOLDER
    assert not DNS1123_SUBDOMAIN.match(claim)  # the API server refuses a volume with this claim name
    assert manifest.text().index("EDIT BEFORE APPLYING") < manifest.text().index("apiVersion")


def test_an_unknown_storage_scheme_is_refused():
    with pytest.raises(PublishError, match="cannot read ftp://"):
        inference_service("ftp://host/models", "cnn", {"name": "cnn"}, cores=1)


def test_the_export_records_the_manifest_and_the_report_links_it(tmp_path: Path):
    published = _publish(tmp_path / "repo", "cnn")
    record_manifests(tmp_path / "report", published)
    assert published.kserve_manifest == str(tmp_path / "report" / "kserve" / "inferenceservice.yaml")
    assert published.to_json()["kserve_manifest"] == published.kserve_manifest
    doc = json.loads((FIXTURES / "report_cnn.json").read_text())
    md = render_markdown(TuneResult.from_json(doc["result"]), doc["settings"], published.to_json())
    assert f"KServe manifest: `{published.kserve_manifest}`" in md


def test_a_positional_model_behind_an_ensemble_is_served_under_the_public_name_and_loaded_first(tmp_path: Path):
    """A torch-aoti export: the public folder holds the ensemble, the positional model beside it does the work (its
    config is the one the export records). The manifest loads both and sizes the pod from the positional model."""
    inner = _publish(tmp_path / "repo", "tx__positional")
    (tmp_path / "repo" / "tx" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "tx" / "config.pbtxt").write_text('name: "tx"\nplatform: "ensemble"\n')
    published = Published(tmp_path / "repo" / "tx", 1, False, [1], config=inner.config, composing=["tx__positional"])
    record_manifests(tmp_path / "report", published)
    assert published.kserve_manifest is not None
    model = yaml.safe_load(Path(published.kserve_manifest).read_text())["spec"]["predictor"]["model"]
    assert model["args"] == ["--model-control-mode=explicit", "--load-model=tx__positional", "--load-model=tx"]
    group, threads = inner.config["instance_group"], int(inner.config["parameters"]["intra_op_thread_count"])
    assert model["resources"]["limits"]["cpu"] == str(group["count"] * threads)


def test_a_manifest_that_cannot_be_written_does_not_stop_the_export(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    published = _publish(tmp_path / "repo", "cnn")
    (tmp_path / "report").write_text("a file where the report folder should be")
    record_manifests(tmp_path / "report", published)
    assert published.kserve_manifest is None and "no KServe manifest was written" in caplog.text


# -- the Indexed Job -----------------------------------------------------------------------------


def test_the_job_runs_one_plan_entry_per_index():
    models = ["cnn", "Bert_Large.v2", "mlp"]
    manifest = indexed_job(models, "registry.example.com/aitune-export:1", "/plans/fleet.toml",
                           resources={"cpu": 4, "memory": "16Gi"}, parallelism=2)
    job = yaml.safe_load(manifest.text())
    assert job == manifest.body
    _validate(job)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 3 and spec["parallelism"] == 2
    assert json.loads(job["metadata"]["annotations"]["aitune-export/models"]) == models
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"] == ["aitune-export", "export-many", "/plans/fleet.toml", "--index", "$(JOB_COMPLETION_INDEX)"]
    assert container["env"][0]["name"] == "JOB_COMPLETION_INDEX"  # defined, so Kubernetes expands $(JOB_COMPLETION_INDEX)
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # required by backoffLimitPerIndex
    for i, model in enumerate(models):
        assert f"index {i}: {model}" in manifest.text()


def test_a_job_without_resources_or_with_a_gpu_is_still_valid():
    _validate(indexed_job(["cnn"], "img:1", "/plan.toml").body)
    _validate(indexed_job(["cnn"], "img:1", "/plan.toml", name="Fleet_Of_Models", resources={"nvidia.com/gpu": 1, "cpu": "500m"}).body)


def test_the_validator_sees_a_broken_job():
    """The check can fail: a Job with a field the schema does not have is refused."""
    body = indexed_job(["cnn"], "img:1", "/plan.toml").body
    body["spec"]["completionsMode"] = "Indexed"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(body)


def test_an_empty_plan_has_no_job():
    with pytest.raises(SettingsError, match="no entries"):
        indexed_job([], "img:1", "/plan.toml")


def test_the_kserve_manifest_takes_its_replicas_and_autoscaling_target_from_the_capacity():
    from optimizer.records.capacity import Capacity

    config = {"name": "bert", "instance_group": {"count": 2, "kind": "KIND_CPU"}}
    cap = Capacity(256.0, 20.0, 95, "poisson", 3, target_rate=1000.0, headroom=0.2).to_json()
    predictor = inference_service("s3://bucket/repo", "bert", config, "26.07", cores=2, capacity=cap).body["spec"]["predictor"]
    assert predictor["minReplicas"] == 5 and predictor["maxReplicas"] == 10  # ceil(1000 / (256 x 0.8))
    assert predictor["scaleMetric"] == "rps" and predictor["scaleTarget"] == 204
    plain = inference_service("s3://bucket/repo", "bert", config, "26.07", cores=2).body["spec"]["predictor"]
    assert set(plain) == {"model"}  # no capacity measured: KServe's defaults
