"""config.pbtxt as text: a ConfigSpec (spec.py) rendered by the platform's Jinja2 template, parsed into
Triton's real schema (`tritonclient.grpc.model_config_pb2.ModelConfig`, plus the top-level fields newer
Triton releases define that its 2.51 proto lacks: NEWER_FIELDS) and written in canonical text form.
The spec, its rendering and this parse are one round trip that must agree field by field; the load-time
rules the parsed config is checked against live apart, in rules/.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.errors import TemplateError

if TYPE_CHECKING:
    from optimizer.triton.config.spec import ConfigSpec

log = logging.getLogger(__name__)

TEMPLATE_SUFFIX = ".pbtxt.j2"



def packaged_template_dir() -> Path:
    """The templates shipped in the package (model_repository_templates/ at the repository root, mapped to
    optimizer.model_repository_templates by pyproject.toml)."""
    from importlib.resources import files

    return Path(str(files("optimizer.model_repository_templates")))


def _pbtxt_string(value: Any) -> str:
    """A text-proto string literal (quotes and backslashes escaped)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _environment(template_dir: Path | None):
    import jinja2

    loaders: list[Any] = []
    if template_dir is not None:
        if not template_dir.is_dir():
            raise TemplateError(f"--template-dir {str(template_dir)!r} is not a directory; point it at a folder of *{TEMPLATE_SUFFIX} files.")
        loaders.append(jinja2.FileSystemLoader(str(template_dir)))
        _warn_unused_overrides(template_dir)
    loaders.append(jinja2.FileSystemLoader(str(packaged_template_dir())))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = _pbtxt_string
    return env


def _warn_unused_overrides(template_dir: Path) -> None:
    packaged = {p.relative_to(packaged_template_dir()).as_posix() for p in packaged_template_dir().rglob(f"*{TEMPLATE_SUFFIX}")}
    for p in template_dir.rglob(f"*{TEMPLATE_SUFFIX}"):
        rel = p.relative_to(template_dir).as_posix()
        if rel not in packaged:
            log.warning("template %s overrides nothing (packaged templates: %s)", p, ", ".join(sorted(packaged)))


def _template_line(err: BaseException) -> tuple[str | None, int | None]:
    """Where in a template a render error happened: jinja2 rewrites tracebacks so template frames carry template lines."""
    lineno = getattr(err, "lineno", None)
    filename = getattr(err, "filename", None) or getattr(err, "name", None)
    if lineno:
        return filename, lineno
    tb = err.__traceback__
    found: tuple[str | None, int | None] = (None, None)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(TEMPLATE_SUFFIX):
            found = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def render(spec: ConfigSpec, template_dir: Path | None = None) -> str:
    """The template's text for `spec` (templates in `template_dir` override the packaged ones, partials included)."""
    import jinja2

    env = _environment(template_dir)
    name = f"{spec.template}{TEMPLATE_SUFFIX}"
    try:
        return env.get_template(name).render(**spec.context())
    except jinja2.TemplateNotFound as err:
        raise TemplateError(f"no template {err.name!r} for platform {spec.template!r}; add it to --template-dir or remove the include.") from err
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as err:
        filename, lineno = _template_line(err)
        where = f"{filename or name}:{lineno}" if lineno else (filename or name)
        message = " ".join(str(err).split())
        raise TemplateError(f"template {where} failed to render: {message}; fix the template (any packaged template can be overridden with --template-dir).") from err


NEWER_FIELDS = ("model_metrics",)
"""Top-level ModelConfig fields newer Triton releases define that the proto bundled in tritonclient 2.51 lacks.
`model_config_class` adds them (same names and numbers as triton-inference-server/common's model_config.proto),
so a template may set them and a typo in any field, theirs included, is still a parse error. Triton 2.51 itself
cannot read them: rules/ warns."""


@functools.lru_cache(maxsize=1)
def model_config_class() -> Any:
    """tritonclient's `ModelConfig`, extended with NEWER_FIELDS it lacks (a private descriptor pool; same wire format)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tritonclient.grpc import model_config_pb2

    known = {f.name for f in model_config_pb2.ModelConfig.DESCRIPTOR.fields}
    if all(name in known for name in NEWER_FIELDS):
        return model_config_pb2.ModelConfig
    proto = descriptor_pb2.FileDescriptorProto()
    model_config_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = "aitune_export/model_config_extended.proto"
    F = descriptor_pb2.FieldDescriptorProto
    if "model_metrics" not in known:
        # common/protobuf/model_config.proto: message ModelMetrics { repeated MetricControl metric_control = 1; }, ModelConfig field 26
        metrics = proto.message_type.add(name="ModelMetrics")
        control = metrics.nested_type.add(name="MetricControl")
        control.nested_type.add(name="MetricIdentifier").field.add(name="family", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        control.nested_type.add(name="HistogramOptions").field.add(name="buckets", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_REPEATED)
        control.oneof_decl.add(name="metric_options")
        control.field.add(name="metric_identifier", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                          type_name=".inference.ModelMetrics.MetricControl.MetricIdentifier")
        control.field.add(name="histogram_options", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, oneof_index=0,
                          type_name=".inference.ModelMetrics.MetricControl.HistogramOptions")
        metrics.field.add(name="metric_control", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                          type_name=".inference.ModelMetrics.MetricControl")
        config = next(m for m in proto.message_type if m.name == "ModelConfig")
        config.field.add(name="model_metrics", number=26, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".inference.ModelMetrics")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


def parse(text: str, where: str = "config.pbtxt", template_dir: Path | None = None) -> Any:
    """Parse text into `ModelConfig` (with NEWER_FIELDS); a field Triton does not know is an error naming the parser's line and column."""
    from google.protobuf import text_format

    config = model_config_class()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        line, column = err.GetLine(), err.GetColumn()
        lines = text.splitlines()
        raw = lines[line - 1] if line and 0 < line <= len(lines) else ""
        source = raw.strip()
        origin = _template_origin(raw[max(column - 1, 0):] if column else source, template_dir)
        detail = str(err).split(" : ", 1)[-1].strip() if " : " in str(err) else str(err)
        raise TemplateError(
            f"{where} does not parse as Triton's ModelConfig at line {line}, column {column}: {detail} "
            f"(text: {source!r}{origin}); Triton would skip this model with 'failed to read text proto'."
        ) from err
    return config


def _template_origin(at_error: str, template_dir: Path | None) -> str:
    """Best effort: the template file and line that wrote the field the parser stopped at (user templates first)."""
    m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", at_error)
    if not m:
        return ""
    token = m.group(1)
    dirs = ([template_dir] if template_dir else []) + [packaged_template_dir()]
    for d in dirs:
        for path in sorted(d.rglob(f"*{TEMPLATE_SUFFIX}")):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(rf"(^|[^A-Za-z0-9_]){re.escape(token)}\s*[:{{\[]", line):
                    return f", from {path}:{i}"
    return ""


HEADER_FIELDS = ("name", "platform", "backend", "runtime", "max_batch_size", "version_policy", "default_model_filename")
"""Fields canonical text puts first (what a reader looks for); the rest follow model_config.proto's order."""


def canonical(config: Any) -> str:
    """Canonical text: the header fields, then model_config.proto's order; one field per line; max_batch_size always shown."""
    from google.protobuf import text_format

    text = text_format.MessageToString(config, use_short_repeated_primitives=True)
    entries: list[list[str]] = []
    for line in text.splitlines():
        if line and not line[0].isspace() and line != "}":
            entries.append([line])
        else:
            entries[-1].append(line)
    if config.max_batch_size == 0:
        # proto3 drops zero scalars; say it explicitly so nobody wonders whether batching was forgotten
        entries.append(["max_batch_size: 0"])
    numbers = {f.name: f.number for f in config.DESCRIPTOR.fields}

    def rank(entry: list[str]) -> tuple[int, int]:
        name = re.match(r"[A-Za-z_0-9]+", entry[0]).group(0)
        return (HEADER_FIELDS.index(name), 0) if name in HEADER_FIELDS else (len(HEADER_FIELDS), numbers.get(name, 1 << 30))

    return "".join(line + "\n" for entry in sorted(entries, key=rank) for line in entry)
