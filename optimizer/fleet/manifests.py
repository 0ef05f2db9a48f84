"""Deployment manifests written beside the report: a KServe InferenceService that serves the published model, and a
Kubernetes Indexed Job that runs one entry of a plan per index.

KServe's Triton runtime (the ClusterServingRuntime kserve-tritonserver) copies `storageUri` to /mnt/models and starts
`tritonserver --model-store=/mnt/models`, so storageUri must be the repository root, the folder that holds
<name>/config.pbtxt; clients then call /v2/models/<name>/infer with the model's folder name, whatever the
InferenceService is called. The two mistakes KServe users hit most are a storageUri one level too deep (the model
folder: Triton then finds a config.pbtxt and a version folder where it expects models) and a model name that differs
from its folder (Triton refuses a config whose `name` is not its folder's, and clients ask for the wrong name). Here
neither can happen: storageUri and the model name both come from the published model's folder (its parent and its
own name); a local repository with a config.pbtxt at its top, or a config that names another model, is refused.
The InferenceService's own name is the model name made a DNS-1035 label (KServe's rule). The server runs with
`--model-control-mode=explicit --load-model=<name>` (KServe appends the predictor's args to the runtime's), so it
loads exactly the published model under its folder name and does not start when that model cannot load.

A local repository has no URI a cluster can read. Its manifest is still written, with a PersistentVolumeClaim
placeholder no cluster accepts unedited (`pvc://REPLACE-WITH-YOUR-PVC/<folder>`: a claim name may not contain
capitals) and a comment at the top that says what to copy where and what to replace; s3:// and gs:// repositories
map to storageUri as they are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.errors import OptimizerError, PublishError, SettingsError
from optimizer.records.triton_platforms import PLATFORMS
from optimizer.records.triton_releases import DEFAULT_RELEASE
from optimizer.triton.repository.model_analyzer import to_yaml

if TYPE_CHECKING:
    from optimizer.triton.repository.atomic import Published

log = logging.getLogger(__name__)

KSERVE_DIR = "kserve"
INFERENCE_SERVICE_FILE = "inferenceservice.yaml"
JOB_FILE = "export-many-job.yaml"
PVC_PLACEHOLDER = "REPLACE-WITH-YOUR-PVC"
MAX_SERVICE_NAME = 45
"""KServe names the predictor <name>-predictor and Knative its revisions <name>-predictor-00001; a DNS label holds 63."""
MAX_JOB_NAME = 50
"""An Indexed Job's pods are named <job>-<index>-<suffix> and their hostnames <job>-<index>, within 63 characters."""
STORAGE_SCHEMES = frozenset({"s3", "gs", "pvc", "hdfs", "webhdfs", "https", "http", "oci", "hf"})
"""URI schemes KServe's storage initializer reads (its SupportedStorageURIPrefixList, less file://, which is a path
inside the pod)."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "aitune-export"}
_RELEASE_RE = re.compile(r"^\d{2}\.\d{2}$")
_CONFIG_NAME_RE = re.compile(r'^name:\s*"((?:[^"\\]|\\.)*)"', re.MULTILINE)


@dataclass(frozen=True)
class StorageLocation:
    """Where the cluster reads the repository root from, as KServe's storageUri."""

    uri: str
    placeholder: bool = False  # True: a local repository; the URI must be edited before `kubectl apply`
    note: str = ""


@dataclass
class Manifest:
    """One Kubernetes object and the comments written above it (what it serves, what to edit before applying)."""

    body: dict[str, Any]
    comments: list[str] = field(default_factory=list)
    needs_edit: bool = False  # a placeholder must be replaced before `kubectl apply`

    def text(self) -> str:
        """The YAML document: the comments as `#` lines, then the object."""
        head = "".join(f"# {' '.join(line.splitlines())}\n" if line else "#\n" for line in self.comments)
        return head + to_yaml(self.body) + "\n"


# -- names, releases, storage --------------------------------------------------------------------


def dns_label(text: str, max_len: int = 63) -> str:
    """A DNS-1035 label (lowercase letters, digits and '-', starting with a letter: what KServe requires of an
    InferenceService name) made from any model name; a label cut short keeps a hash of the whole name, so two long
    names stay apart."""
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not label[:1].isalpha():
        label = f"model-{label}".rstrip("-")
    if len(label) > max_len:
        digest = hashlib.sha1(text.encode()).hexdigest()[:6]
        label = f"{label[: max_len - 7].rstrip('-')}-{digest}"
    return label


def default_release() -> str:
    """The Triton release to serve when none is asked for: --triton-release's default, the release docker/Dockerfile
    builds on, so the image it builds and the InferenceService's runtime are one release."""
    return DEFAULT_RELEASE


def runtime_version(release: str) -> str:
    """KServe's runtimeVersion: the tag of NVIDIA's tritonserver image for a release (24.10 -> 24.10-py3)."""
    if not _RELEASE_RE.match(release or ""):
        raise SettingsError(f"Triton release {release!r} is not YY.MM; KServe's runtimeVersion is the tritonserver image tag "
                            f"<YY.MM>-py3. Give a release such as --triton-release {DEFAULT_RELEASE}.")
    return f"{release}-py3"


def split_model_dir(model_dir: str | Path) -> tuple[str | Path, str]:
    """(repository root, model name) of a published model's folder: a path, or an object-storage URI."""
    text = _uri_text(model_dir).rstrip("/")
    if "://" in text and not text.startswith("file://"):
        root, _, name = text.rpartition("/")
        if not name or root.endswith(":/"):
            raise PublishError(f"{str(model_dir)!r} names a bucket, not a model folder inside a repository; "
                               "give the model's folder (e.g. s3://bucket/models/cnn).")
        return root, name
    path = Path(text.removeprefix("file://"))
    return path.parent, path.name


def storage_location(repository: str | Path) -> StorageLocation:
    """storageUri of a repository root: an object-storage URI as it is; a local folder as a volume placeholder."""
    text = _uri_text(repository).rstrip("/")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme and scheme != "file":
        if scheme not in STORAGE_SCHEMES:
            raise PublishError(f"repository {text!r}: KServe cannot read {scheme}:// URIs (it reads {', '.join(sorted(STORAGE_SCHEMES))}); "
                               "publish into an s3:// or gs:// repository, or a folder you copy onto a volume.")
        return _s3_location(text) if scheme == "s3" else StorageLocation(text)
    path = Path(text.removeprefix("file://")).resolve()
    folder = path.name or "models"
    note = (f"The repository {path} is a local folder, which no cluster can read. Copy it onto a volume so that "
            f"<volume>/{folder}/<model>/config.pbtxt exists, then replace {PVC_PLACEHOLDER} below with that volume's "
            "PersistentVolumeClaim, or set storageUri to an s3:// or gs:// copy of the repository (the folder, not the model).")
    return StorageLocation(f"pvc://{PVC_PLACEHOLDER}/{folder}", placeholder=True, note=note)


def _uri_text(value: str | Path) -> str:
    """The text of a path or URI; an s3:// URL that went through Path() (`s3:/bucket/...`) gets its slash back."""
    from optimizer.triton.repository.object_store.location import store_url

    return store_url(value) or str(value)


def _s3_location(url: str) -> StorageLocation:
    """KServe reads s3://BUCKET/PREFIX only: the endpoint of Triton's s3://HOST:PORT/BUCKET/PREFIX form moves to the
    annotations KServe reads on the predictor's ServiceAccount (or the credentials Secret it lists)."""
    from optimizer.triton.repository.object_store.location import parse_location

    location = parse_location(url, "the repository")
    where = "the predictor's ServiceAccount (spec.predictor.serviceAccountName) or the credentials Secret it lists"
    if location.endpoint is None:
        return StorageLocation(location.url_for(None), note=f"KServe reads the S3 credentials, region and endpoint from {where}.")
    host = location.endpoint.split("://", 1)[1]
    https = "1" if location.endpoint.startswith("https") else "0"
    return StorageLocation(location.url_for(None), note=(
        f"The repository's S3 endpoint {host} cannot be part of a KServe storageUri: annotate {where} with "
        f"serving.kserve.io/s3-endpoint: {host!r} and serving.kserve.io/s3-usehttps: {https!r}."))


def check_repository_root(repository: Path, model_name: str) -> None:
    """Refuse, for a local repository, the two mistakes: a model folder given as the repository (storageUri one level
    too deep), and a config.pbtxt that names another model than its folder."""
    if (repository / "config.pbtxt").is_file():
        raise PublishError(f"{str(repository)!r} holds a config.pbtxt: it is a model folder, not a model repository, and KServe "
                           f"would serve it one level too deep. Give the folder that holds it ({str(repository.parent)!r}) as the repository.")
    config = repository / model_name / "config.pbtxt"
    if not config.is_file():
        raise PublishError(f"model {model_name!r} is not in the repository {str(repository)!r} (no {config}); publish it there first, "
                           "or give the repository that holds it.")
    match = _CONFIG_NAME_RE.search(config.read_text())
    if match and match.group(1) != model_name:
        raise PublishError(f"{config} names the model {match.group(1)!r} but lies in the folder {model_name!r}; Triton refuses the "
                           f"model and clients would ask for the wrong name. Rename the folder to {match.group(1)!r}, or republish "
                           f"the model with --name {model_name!r}.")


# -- the InferenceService ------------------------------------------------------------------------


def serving_resources(config: Mapping[str, Any], cores: int) -> tuple[dict[str, dict[str, str]], str]:
    """CPU (and GPUs) of the served operating point, requests equal to limits so the pod gets what was measured
    (Guaranteed QoS), and a sentence saying where the numbers come from.

    `config` is the published ConfigSpec (report.json's published.config); `cores` the cores the operating point was
    measured on, used for a CPU model whose instances set no thread count (they then use every core they see).
    """
    group = config.get("instance_group") or {}
    count = max(1, int(group.get("count") or 1))
    platform = PLATFORMS.get(str(config.get("template") or config.get("platform") or ""))
    raw = (config.get("parameters") or {}).get(platform.thread_parameter) if platform and platform.thread_parameter else None
    threads = int(raw) if str(raw).isdigit() and int(raw) > 0 else None
    amounts: dict[str, str] = {}
    if group.get("kind") == "KIND_GPU":
        gpus = len(group.get("gpus") or [0])
        amounts = {"cpu": str(count), "nvidia.com/gpu": str(gpus)}
        why = f"{count} KIND_GPU instance(s) on {gpus} GPU(s), one core each to feed them"
    elif threads:
        amounts = {"cpu": str(count * threads)}
        why = f"{count} KIND_CPU instance(s) x {threads} thread(s), as measured"
    else:
        amounts = {"cpu": str(cores)}
        why = f"{count} KIND_CPU instance(s) with no thread count, so the {cores} core(s) they were measured on"
    return {"requests": dict(amounts), "limits": dict(amounts)}, why


def autoscaling(capacity: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The predictor's replica and autoscaling fields from the published config's open-loop capacity (report.json's
    `capacity`), and the comments that say where they come from; nothing without a capacity.

    KServe's ComponentExtensionSpec: `scaleMetric: rps` with `scaleTarget` the rate each replica is planned at (its capacity
    less the headroom; Knative's autoscaler in KServe's Serverless mode), `minReplicas` the replicas the target rate needs, so
    the fleet holds it before any scale-up, and `maxReplicas` twice that for bursts above it."""
    if not capacity or not capacity.get("rate_per_s"):
        return {}, []
    target = max(1, int(float(capacity.get("per_replica_target") or capacity["rate_per_s"])))
    fields: dict[str, Any] = {"scaleMetric": "rps", "scaleTarget": target}
    budget = capacity.get("latency_budget_ms")
    within = f"p{capacity.get('percentile', 95)} <= {float(budget):g} ms" if budget is not None else "no latency target"
    headroom = float(capacity.get("headroom") or 0.0)
    comments = [f"Autoscaling: each replica held {float(capacity['rate_per_s']):g} requests/s open-loop ({capacity.get('arrivals')} arrivals, "
                f"{within}); scaleTarget {target} rps keeps {headroom:.0%} of it free (--headroom). scaleMetric rps needs KServe's "
                "Serverless mode (Knative); in RawDeployment mode set an HPA on your own metric instead."]
    replicas, rate = capacity.get("replicas"), capacity.get("target_rate")
    if replicas:
        fields |= {"minReplicas": int(replicas), "maxReplicas": 2 * int(replicas)}
        comments.append(f"Replicas: {rate:g} requests/s need {replicas} (minReplicas, so the rate is held before any scale-up); "
                        "maxReplicas is twice that, for bursts above it.")
    else:
        fields["minReplicas"] = 1
    return fields, comments


def inference_service(repository: str | Path, model_name: str, config: Mapping[str, Any], release: str | None = None, *,
                      cores: int | None = None, namespace: str | None = None, capacity: Mapping[str, Any] | None = None,
                      composing: Sequence[str] = ()) -> Manifest:
    """The InferenceService that serves `model_name` from the repository root `repository` (a local folder or an
    object-storage URI) with KServe's Triton runtime at `release` (None: DEFAULT_RELEASE). `composing`: the models
    behind it (the positional model behind an ensemble), loaded first; `config` is then the one that does the work.

    Raises PublishError for the two mistakes (see the module docstring) and SettingsError for a release not YY.MM.
    `cores` (None: this machine's) counts only for a CPU model whose config sets no thread count. `model_name` is a
    published model's folder name, checked before it was published.
    """
    version = runtime_version(release or default_release())
    storage = storage_location(repository)
    if storage.placeholder:
        check_repository_root(Path(str(repository).removeprefix("file://")), model_name)
    named = config.get("name")
    if named and named != model_name:
        raise PublishError(f"the config names the model {named!r} but it is published in the folder {model_name!r}; Triton serves a "
                           f"model under its folder name only. Republish it with --name {model_name!r}.")
    if cores is None:
        from optimizer.machine import cpu_cores

        cores = cpu_cores()
    resources, why = serving_resources(config, cores)
    service = dns_label(model_name, MAX_SERVICE_NAME)
    metadata: dict[str, Any] = {"name": service}
    if namespace:
        metadata["namespace"] = namespace
    metadata |= {"labels": dict(MANAGED_BY), "annotations": {"aitune-export/model-name": model_name}}
    body = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": {"model": {
            "modelFormat": {"name": "triton"},
            "protocolVersion": "v2",
            "runtimeVersion": version,
            "storageUri": storage.uri,
            "args": ["--model-control-mode=explicit", *(f"--load-model={m}" for m in composing), f"--load-model={model_name}"],
            "resources": resources,
        }}},
    }
    scaling, scaling_comments = autoscaling(capacity)
    body["spec"]["predictor"] = {**scaling, **body["spec"]["predictor"]}
    comments = [
        f"KServe InferenceService {service!r} serving the Triton model {model_name!r}; written by aitune-export.",
        f"storageUri is the repository root (the folder that holds {model_name}/config.pbtxt), never the model folder.",
        f"Clients call <the service's URL>/v2/models/{model_name}/infer: the model's folder name; the server loads only it"
        + (f" and the model(s) behind it ({', '.join(composing)})." if composing else "."),
        f"runtimeVersion {version}: the tritonserver image of Triton {release or default_release()} (the release the model was built for).",
        f"Resources: {why}. Memory is left to KServe's default (2Gi unless your cluster sets another): raise it for a large model.",
    ]
    comments += scaling_comments
    gpus = (config.get("instance_group") or {}).get("gpus") or []
    if any(int(g) != i for i, g in enumerate(gpus)):
        comments.append(f"WARNING: config.pbtxt pins GPU(s) {gpus}, but a pod numbers its GPUs from 0 and the model will not load; "
                        "republish with --device cuda (GPU 0).")
    if storage.placeholder:
        comments += ["", f"EDIT BEFORE APPLYING: {storage.note}"]
    elif storage.note:
        comments.append(f"Storage: {storage.note}")
    comments += ["", "Apply: kubectl apply -f inferenceservice.yaml"]
    return Manifest(body, comments, needs_edit=storage.placeholder)


# -- the Indexed Job -----------------------------------------------------------------------------


def indexed_job(model_names: Sequence[str], image: str, plan_path: str, *, name: str = "aitune-export-many",
                resources: Mapping[str, str | int] | None = None, parallelism: int | None = None,
                namespace: str | None = None) -> Manifest:
    """A batch/v1 Job in Indexed completion mode that runs `aitune-export export-many PLAN --index I` for each plan
    entry I (one pod per model, index I = `model_names[I]`).

    `image` holds aitune-export and the models' code; `plan_path` is the plan's path inside it. `resources` (e.g.
    {"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": 1}) is what one export measures on: requests equal limits, so pods
    measured side by side do not share cores. `parallelism` None runs every index at once. A failed index is retried
    once on its own and does not stop the others (backoffLimitPerIndex).
    """
    if not model_names:
        raise SettingsError("the plan has no entries, so there is no Job to run; add models to the plan.")
    if not image or not plan_path:
        raise SettingsError("an export-many Job needs the image that holds aitune-export and the plan's path inside it.")
    if parallelism is not None and parallelism < 1:
        raise SettingsError(f"parallelism {parallelism} must be >= 1.")
    job = dns_label(name, MAX_JOB_NAME)
    amounts = {key: str(value) for key, value in (resources or {}).items()}
    container: dict[str, Any] = {
        "name": "export",
        "image": image,
        "command": ["aitune-export", "export-many", plan_path, "--index", "$(JOB_COMPLETION_INDEX)"],
        # Kubernetes sets it too; declaring it makes the $(...) expansion above visibly defined.
        "env": [{"name": "JOB_COMPLETION_INDEX",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}],
    }
    if amounts:
        container["resources"] = {"requests": dict(amounts), "limits": dict(amounts)}
    metadata: dict[str, Any] = {"name": job}
    if namespace:
        metadata["namespace"] = namespace
    metadata |= {"labels": dict(MANAGED_BY), "annotations": {"aitune-export/models": json.dumps(list(model_names))}}
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "completionMode": "Indexed",
            "completions": len(model_names),
            "parallelism": min(parallelism or len(model_names), len(model_names)),
            "backoffLimitPerIndex": 1,
            "template": {
                "metadata": {"labels": dict(MANAGED_BY) | {"app.kubernetes.io/name": job}},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }
    comments = [f"Kubernetes Indexed Job {job!r}: one pod per plan entry, written by aitune-export.",
                *(f"index {i}: {model}" for i, model in enumerate(model_names)),
                "Each pod publishes into the plan's repository: make it object storage (s3://) or a volume every pod mounts.",
                f"Apply: kubectl apply -f {JOB_FILE}"]
    return Manifest(body, comments)


# -- files ---------------------------------------------------------------------------------------


def write_manifest(path: Path, manifest: Manifest) -> Path:
    """Write one manifest atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(manifest.text())
    os.replace(tmp, path)
    return path


def write_manifests(report_dir: Path, model_dir: str | Path, config: Mapping[str, Any], release: str | None = None, *,
                    cores: int | None = None, capacity: Mapping[str, Any] | None = None, composing: Sequence[str] = ()) -> Path:
    """Write <report_dir>/kserve/inferenceservice.yaml for the model published in `model_dir` (its folder: the
    repository root and the model name are both taken from it, so they cannot disagree); returns the path. When
    `config` is that of a model in `composing` (the positional model behind the public ensemble: its instances and
    threads size the pod), the public model is served under its own name with them."""
    repository, name = split_model_dir(model_dir)
    composing = [m for m in composing if m != name]
    if config.get("name") in composing:
        config = {**config, "name": name}
    manifest = inference_service(repository, name, config, release, cores=cores, capacity=capacity, composing=composing)
    path = write_manifest(Path(report_dir) / KSERVE_DIR / INFERENCE_SERVICE_FILE, manifest)
    if manifest.needs_edit:
        log.info("%s | KServe manifest %s: replace %s with the volume that holds the repository before applying it", name, path, PVC_PLACEHOLDER)
    return path


def record_manifests(report_dir: Path, published: Published, release: str | None = None) -> None:
    """After publishing: write the manifests and record where in `published`. A manifest is a by-product, so a failure
    is logged and the export goes on (published.kserve_manifest stays None)."""
    try:
        capacity = (published.served_search or {}).get("capacity")
        published.kserve_manifest = str(write_manifests(report_dir, published.model_dir, published.config or {}, release, capacity=capacity,
                                                        composing=published.composing))
    except (OptimizerError, OSError) as err:
        log.warning("no KServe manifest was written: %s", err)
