"""config.pbtxt: rendered from the platform's Jinja2 template, parsed into Triton's real schema
(`tritonclient.grpc.model_config_pb2.ModelConfig`), checked against Triton's load-time rules and
written in canonical text form. Nothing is written when any of that fails.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from optimizer.backend.base import Artifact, device_kind
from optimizer.backend.triton_platforms import PLATFORMS, TritonPlatform
from optimizer.errors import PublishError, TemplateError
from optimizer.model.signature import Signature, TensorSpec

if TYPE_CHECKING:
    from optimizer.task.find_max_batch_size import MaxBatchDecision
    from optimizer.tune_strategy.result import TuneResult

log = logging.getLogger(__name__)

MIN_QUEUE_DELAY_US = 100
MAX_QUEUE_DELAY_US = 50_000


@dataclass
class ConfigSpec:
    """Everything a template needs; plain data so a user template can use any of it."""

    name: str
    platform: str | None
    backend: str | None
    max_batch_size: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    instance_group: dict[str, Any]
    dynamic_batching: dict[str, Any] | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    warmup: list[dict[str, Any]] = field(default_factory=list)
    version_policy: dict[str, Any] | None = None
    default_model_filename: str | None = None
    template: str = ""  # template stem (the platform key)

    def context(self) -> dict[str, Any]:
        return asdict(self)


def tensor_entry(spec: TensorSpec, batching: bool) -> dict[str, Any]:
    """A config input/output: dims without the batch axis; a per-sample scalar becomes dims [1] with an empty reshape."""
    dims = spec.triton_dims
    if not dims:
        if not batching:
            raise PublishError(
                f"tensor {spec.name!r} is a scalar in a non-batching model; Triton cannot serve scalar tensors "
                "without a batch axis (\"cannot have empty reshape for non-batching model\"). Return at least one dim."
            )
        return {"name": spec.name, "data_type": spec.dtype.triton, "dims": [1], "reshape": []}
    return {"name": spec.name, "data_type": spec.dtype.triton, "dims": dims, "reshape": None}


def queue_delay_us(decision: MaxBatchDecision, latency_budget_ms: float | None, percentile: int) -> int:
    """max_queue_delay_microseconds = half the p50 of a knee-sized batch, clamped to [100 us, 50 ms] and,
    with a latency budget, to what the budget leaves after the max batch's percentile latency.

    Waiting about half a knee batch's compute time lets requests gather into the batch that already
    reaches near-peak throughput, without doubling the latency of a lone request.
    """
    knee = decision.profile_at(decision.knee) or decision.best
    delay = int(round(knee.p50_ms * 1000 / 2))
    delay = max(MIN_QUEUE_DELAY_US, min(MAX_QUEUE_DELAY_US, delay))
    if latency_budget_ms is not None:
        worst = decision.profile_at(decision.max_batch_size) or decision.best
        room = int((latency_budget_ms - worst.percentile_ms(percentile)) * 1000)
        delay = max(0, min(delay, room))
    return delay


def preferred_batch_sizes(decision: MaxBatchDecision) -> list[int]:
    """The knee (near-peak throughput at the lowest latency) and the max batch, when they differ from 1."""
    return sorted({b for b in (decision.knee, decision.max_batch_size) if 1 < b <= decision.max_batch_size})


def instance_group_for(artifact: Artifact, count: int = 1) -> dict[str, Any]:
    """Explicit placement: KIND_CPU for CPU artifacts, KIND_GPU on the tuned GPU for CUDA ones."""
    if device_kind(artifact.device) == "cuda":
        index = int(artifact.device.split(":")[1]) if ":" in artifact.device else 0
        return {"kind": "KIND_GPU", "count": count, "gpus": [index], "profile": []}
    return {"kind": "KIND_CPU", "count": count, "gpus": [], "profile": []}


def build_spec(result: TuneResult, name: str, warmup: list[dict[str, Any]] | None = None, version_policy: dict[str, Any] | None = None) -> ConfigSpec:
    """The config of the selected candidate of a tuning result."""
    cand = result.selected_candidate
    artifact = cand.artifact
    if artifact is None or artifact.platform is None or cand.decision is None:
        raise PublishError(f"candidate {cand.name} has no publishable artifact.")
    platform: TritonPlatform = artifact.platform
    sig: Signature = artifact.sig
    batching = sig.batching
    mbs = result.max_batch_size if batching else 0
    settings = dict(artifact.triton_settings)
    parameters = dict(settings.pop("parameters", {}))
    dyn = None
    if batching and mbs > 1:
        dyn = {
            "preferred_batch_size": preferred_batch_sizes(cand.decision),
            "max_queue_delay_microseconds": queue_delay_us(cand.decision, result.latency_budget_ms, result.percentile),
        }
    return ConfigSpec(
        name=name,
        platform=platform.platform,
        backend=None if platform.platform else platform.backend,
        max_batch_size=mbs,
        inputs=[tensor_entry(t, batching) for t in sig.inputs],
        outputs=[tensor_entry(t, batching) for t in sig.outputs],
        instance_group=instance_group_for(artifact),
        dynamic_batching=dyn,
        parameters=parameters,
        settings=settings,
        warmup=warmup or [],
        version_policy=version_policy,
        default_model_filename=None,
        template=platform.key,
    )


def packaged_template_dir() -> Path:
    """The templates shipped with the package (model_repository_templates/ at the repository root)."""
    from importlib.resources import files

    return Path(str(files("optimizer.model_repository_templates")))


def _environment(template_dir: Path | None):
    import jinja2

    loaders: list[Any] = []
    if template_dir is not None:
        if not template_dir.is_dir():
            raise TemplateError(f"--template-dir {str(template_dir)!r} is not a directory; point it at a folder of *.pbtxt.j2 files.")
        loaders.append(jinja2.FileSystemLoader(str(template_dir)))
    loaders.append(jinja2.FileSystemLoader(str(packaged_template_dir())))
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(spec: ConfigSpec, template_dir: Path | None = None) -> str:
    """The template's text for `spec` (user templates in `template_dir` override the packaged ones)."""
    import jinja2

    env = _environment(template_dir)
    name = f"{spec.template}.pbtxt.j2"
    try:
        return env.get_template(name).render(**spec.context())
    except jinja2.TemplateNotFound as err:
        raise TemplateError(f"no template {err.name!r} for platform {spec.template!r}; add it to --template-dir or remove the override.") from err
    except jinja2.TemplateError as err:
        where = f"{getattr(err, 'filename', None) or name}:{getattr(err, 'lineno', '?')}"
        raise TemplateError(f"template {where} failed to render: {err}") from err


def parse(text: str, where: str = "config.pbtxt") -> Any:
    """Parse text into `ModelConfig`; a field Triton does not know is an error with its line and column."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise TemplateError(f"{where} does not parse as Triton's ModelConfig at line {err.GetLine()}, column {err.GetColumn()}: {err}") from err
    return config


def canonical(config: Any) -> str:
    """Canonical text form: the order of model_config.proto, one field per line; max_batch_size always shown."""
    from google.protobuf import text_format

    text = text_format.MessageToString(config, use_short_repeated_primitives=True)
    if config.max_batch_size == 0:
        # proto3 drops zero scalars; say it explicitly so nobody wonders whether batching was forgotten
        lines = text.splitlines()
        at = next((i + 1 for i, l in enumerate(lines) if l.startswith(("platform:", "backend:"))), 1)
        lines.insert(at, "max_batch_size: 0")
        text = "\n".join(lines) + "\n"
    return text


def warmup_entries(sig: Signature, feed: dict[str, np.ndarray], max_batch_size: int, directory: Path) -> list[dict[str, Any]]:
    """model_warmup at batch 1 and at the max batch from a real sample; writes <model>/warmup/<input>.data."""
    directory.mkdir(parents=True, exist_ok=True)
    inputs = {}
    for spec in sig.inputs:
        sample = feed[spec.name][0] if sig.batching else feed[spec.name]
        (directory / f"{spec.name}.data").write_bytes(np.ascontiguousarray(sample).tobytes())
        inputs[spec.name] = {"data_type": spec.dtype.triton, "dims": list(sample.shape) or [1], "input_data_file": f"{spec.name}.data"}
    batches = [1] if not sig.batching else sorted({1, max(1, max_batch_size)})
    return [{"name": f"warmup_batch_{b}", "batch_size": b, "count": 1, "inputs": inputs} for b in batches]


def elements(dims: list[int]) -> int:
    return math.prod(dims) if dims else 1
