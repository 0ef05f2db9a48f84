"""ExportSettings: one dataclass that CLI flags, a TOML settings file and the Python API all map onto.

Each field's metadata names its option (`flag`), its help and whether it repeats; the CLI builds
its options from this table and the settings file accepts exactly these keys, so the three
entry points cannot drift apart.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import tomllib

from optimizer.errors import SettingsError
from optimizer.vocab import ARRIVALS, EAGER_GATES, MAX_BATCH_SIZE_LIMIT, PERCENTILES, PRECISION_CHOICES, STRATEGY_NAMES, WORKFLOWS

MAX_CONCURRENCY = 4096
"""The most concurrent requests --concurrency may name."""
DEFAULT_TRITON_RELEASE = "26.07"
"""--triton-release's default: the `ARG RELEASE` docker/Dockerfile builds on, a row of records/triton_releases.py
(tests keep the three equal). Its PyTorch backend's torch is the minor this project is developed with."""


def _opt(default: Any, flag: str, help: str, *, multiple: bool = False, choices: tuple[str, ...] | None = None,
         secondary: str | None = None, metavar: str | None = None, group: str = "Optional") -> Any:
    meta = {"flag": flag, "help": help, "multiple": multiple, "choices": choices, "secondary": secondary, "metavar": metavar, "group": group}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ExportSettings:
    """Every option of `aitune-export export`; defaults are what a run without flags does."""

    model: str | None = _opt(None, "MODEL", "package.module:callable, path/to/file.py:callable, a TorchScript .pt, a torch.export .pt2 or an .onnx file (default: the bundled example CNN).", group="Model")
    input: list[str] = _opt([], "--input", "Input spec NAME:DTYPE:DIMS, per-sample dims without the batch axis; ranges mark dynamic axes (input_ids:int64:1-128). Repeat per input.", multiple=True, metavar="SPEC", group="Model")
    value_range: list[str] = _opt([], "--value-range", "Sample value range NAME:LOW:HIGH for generated integer inputs (input_ids:0:999).", multiple=True, metavar="SPEC", group="Model")
    output_names: list[str] = _opt([], "--output-names", "Output names, comma-separated or repeated (default output__0, output__1, ...).", multiple=True, metavar="NAMES", group="Model")
    batching: bool = _opt(True, "--batching", "Axis 0 of every tensor is the batch axis (--no-batching for models that do not batch).", secondary="--no-batching", group="Model")
    samples: str | None = _opt(None, "--samples", "An .npz of real inputs (keys are input names, or NAME.K for several recorded requests).", metavar="FILE", group="Model")
    traffic: str | None = _opt(None, "--traffic", "The requests the model will serve, as perf_analyzer's --input-data JSON (one entry per request, each with its own \"shape\"): profiling, the served search and validate send them in their ratios (default: the requests in --samples, else a generated spread of every dynamic axis, log-uniform over its range).", metavar="FILE", group="Model")
    repository: str = _opt("model_repository", "--repository", "The Triton model repository to publish into: a folder (created if missing) or s3://BUCKET/PREFIX, s3://HOST:PORT/BUCKET/PREFIX (endpoint and credentials as for the aws CLI).", metavar="DIR|URL", group="Publish")
    name: str | None = _opt(None, "--name", "Model name in the repository (default: from MODEL).", metavar="NAME", group="Publish")
    version: int | None = _opt(None, "--version", "Add this version to an existing model, leaving its other versions alone.", metavar="N", group="Publish")
    overwrite: bool = _opt(False, "--overwrite", "Replace an existing model of the same name (an atomic swap).", secondary="--no-overwrite", group="Publish")
    warmup: bool = _opt(False, "--warmup", "Add model_warmup at batch 1 and the max batch, from a real sample.", secondary="--no-warmup", group="Publish")
    io_names: str = _opt("names", "--io-names", "names: clients send the forward() argument names and read output__<i> (or --output-names) whatever backend wins; a positional backend (torch-aoti) is published behind an ensemble that keeps them. positional: publish the bare model (torch-aoti's INPUT__<i>/OUTPUT__<i>).", choices=("names", "positional"), group="Publish")
    template_dir: str | None = _opt(None, "--template-dir", "A folder of *.pbtxt.j2 templates overriding the packaged ones.", metavar="DIR", group="Publish")
    report_dir: str | None = _opt(None, "--report-dir", "Where report.json, samples and work files go (default: aitune-reports/NAME; never inside the repository).", metavar="DIR", group="Publish")
    strategy: str = _opt("max-throughput", "--strategy", "How the winner is chosen.", choices=STRATEGY_NAMES, group="Tuning")
    backend: list[str] = _opt([], "--backend", "A candidate backend; repeat to give several (default: the strategy's defaults; see `aitune-export backends`).", multiple=True, metavar="NAME", group="Tuning")
    workflow: str = _opt("aot", "--workflow", "aot: search the max batch size; jit: measure only the batch sizes recorded in --samples.", choices=WORKFLOWS, group="Tuning")
    device: str = _opt("cpu", "--device", "Where to tune and serve: cpu or cuda[:N].", metavar="DEVICE", group="Tuning")
    precision: str = _opt("auto", "--precision", "Compute precision of the candidates; each (backend, precision) pair is a candidate. auto: on the CPU fp32, plus bf16 where the CPU computes it natively (AVX512-BF16/AMX), plus int8 when --samples or --calibration-samples are given; on CUDA fp32. A named one restricts the search to it (fp16 needs --device cuda; int8 needs real samples). bf16 and int8 candidates are judged by the accuracy gate, fp32 ones by --tolerance.", choices=PRECISION_CHOICES, group="Tuning")
    calibration_samples: str | None = _opt(None, "--calibration-samples", "An .npz of real inputs (as --samples) that INT8 candidates are calibrated on (default: --samples).", metavar="FILE", group="Tuning")
    accuracy_budget: str | None = _opt(None, "--accuracy-budget", "The accuracy gate for bf16 and int8 candidates, against fp32 eager: least cosine similarity per output and, for class-score outputs, top-1 agreement, each in (0, 1] (default 0.999,0.99).", metavar="COSINE[,TOP1]", group="Tuning")
    accuracy_check: str | None = _opt(None, "--accuracy-check", "Score bf16 and int8 candidates your own way: module:function or path/to/file.py:function, called with (reference, candidate), two lists of {output: array}, returning (score, passed); it decides instead of the budget.", metavar="MODULE:FUNCTION", group="Tuning")
    tolerance: list[str] = _opt([], "--tolerance", "Accept this error against the reference: ATOL[,RTOL] for every output, or NAME=ATOL[,RTOL] for one (default per dtype: fp32 1e-4,1e-4). Repeatable.", multiple=True, metavar="[NAME=]ATOL[,RTOL]", group="Tuning")
    eager_gate: str = _opt("enabled", "--eager-gate", "enabled: a winner must beat eager PyTorch (else the best deployable one is published with a warning); diagnostic: report only; disabled: do not measure eager.", choices=EAGER_GATES, group="Tuning")
    triton_release: str = _opt(DEFAULT_TRITON_RELEASE, "--triton-release", "The Triton release (YY.MM) that will serve the model: candidates it cannot load are skipped with the reason, and an explicit --backend whose artifact it cannot load (torch for .pt2, ONNX opset and IR, OpenVINO, TensorRT major.minor) is refused before anything is built (default: the release docker/Dockerfile builds on).", metavar="YY.MM", group="Tuning")
    allow_version_mismatch: bool = _opt(False, "--allow-version-mismatch", "Build and publish even when the local toolchain does not match --triton-release (or the release's version is unconfirmed); the report records a warning.", secondary="--no-allow-version-mismatch", group="Tuning")
    max_batch_size: str = _opt("auto", "--max-batch-size", "The largest batch to publish: a number, or auto to search it per candidate.", metavar="N|auto", group="Measurement")
    latency_budget_ms: float | None = _opt(None, "--latency-budget-ms", "Latency budget per request in milliseconds (at --percentile).", metavar="MS", group="Measurement")
    percentile: int = _opt(95, "--percentile", "Latency percentile the budget applies to.", choices=tuple(map(str, PERCENTILES)), group="Measurement")
    memory_budget: str = _opt("auto", "--memory-budget", "Memory a candidate may add while probing batch sizes (e.g. 2GiB, 512MiB; auto = a quarter of available memory, at most 8 GiB).", metavar="SIZE", group="Measurement")
    time_budget_s: float | None = _opt(None, "--time-budget", "Stop measuring after this many seconds of tuning and use what was measured.", metavar="SECONDS", group="Measurement")
    build_timeout_s: float = _opt(900.0, "--build-timeout", "Seconds a candidate may spend building and checking before it is stopped.", metavar="SECONDS", group="Measurement")
    profile_timeout_s: float = _opt(900.0, "--profile-timeout", "Seconds a candidate may spend being measured before it is stopped.", metavar="SECONDS", group="Measurement")
    cache: bool = _opt(True, "--cache", "Reuse builds and measurements of an identical earlier run (--no-cache rebuilds and re-measures everything).", secondary="--no-cache", group="Measurement")
    cache_dir: str | None = _opt(None, "--cache-dir", "The one cache root: builds, measurements, TensorRT timing caches and the local tritonserver's home (default: $AITUNE_EXPORT_CACHE_DIR, else $XDG_CACHE_HOME/aitune-export or ~/.cache/aitune-export).", metavar="DIR", group="Measurement")
    serve_search: str = _opt("on", "--serve-search", "on: choose max batch, preferred sizes, queue delay and instances by measuring variants in the local tritonserver with perf_analyzer; off: publish the in-process rules.", choices=("on", "off"), group="Serving")
    concurrency: int | str | None = _opt(None, "--concurrency", "The load the served config is tuned for: N concurrent requests, or LOW:HIGH for every load of that range (default: none; with --latency-budget-ms the most throughput within the budget at any load, else the config whose worst score over the loads 1, 4, 16, 64, ... is highest, a load's score weighing its throughput and its p95 latency against the best variant there).", metavar="N|LOW:HIGH", group="Serving")
    rate: str | None = _opt(None, "--rate", "The request rate the served config must hold, in requests per second, or max: variants are measured open-loop (perf_analyzer's request-rate mode, --arrivals) and the one with the highest capacity within --latency-budget-ms is published (R without a budget: the lowest percentile latency at R; max needs a budget). The report states the capacity and, for R, the replicas R needs (default: none; the load is --concurrency's).", metavar="R|max", group="Serving")
    arrivals: str = _opt("poisson", "--arrivals", "How requests arrive when a rate is measured: poisson (independent arrivals, the bursts real traffic has) or constant (evenly spaced). A --traffic file whose entries carry timestamps is replayed on its own schedule instead.", choices=ARRIVALS, group="Serving")
    headroom: float = _opt(0.2, "--headroom", "The share of a replica's measured capacity kept free when --rate R is turned into replicas: replicas = ceil(R / (capacity x (1 - headroom))).", metavar="FRACTION", group="Serving")
    serve_search_seconds: float | None = _opt(None, "--serve-search-seconds", "Time the served search may take, server start included; it stops with the best variant measured so far (default: 40% of the tuning time, at least 90 s). Repeating measurements other processes' load reached adds up to a quarter.", metavar="SECONDS", group="Serving")
    url: str | None = _opt(None, "--url", "Run the served search on this running Triton (HOST:PORT, started with --model-control-mode=explicit) instead of the bundled one: each variant is loaded there under a private name with its config and the model's files in the request (no shared disk needed) and unloaded afterwards; the published repository is written as usual.", metavar="HOST:PORT", group="Serving")
    protocol: str = _opt("http", "--protocol", "How the served search talks to --url: http or grpc (the port must speak it). The bundled server is always measured over gRPC (Model Analyzer's default client protocol; perf_analyzer 2.51's HTTP client can stall with dozens of clients on a few cores). validate measures a local server over gRPC too.", choices=("http", "grpc"), group="Serving")
    wait_for_cores_s: float = _opt(0.0, "--wait-for-cores", "When other processes keep cores busy as the served search begins, wait up to this many seconds for them before measuring beside them (default 0: measure at once, every variant beside the same load; the report says how busy the machine was).", metavar="SECONDS", group="Serving")
    validate: bool = _opt(False, "--validate", "After publishing, load the model into a local tritonserver, check answers and run perf_analyzer.", secondary="--no-validate", group="Validation")
    validate_concurrency: str = _opt("auto", "--validate-concurrency", "perf_analyzer's concurrency sweep for --validate, START:END[:STEP]; auto: 1:8, or four levels up to the served search's concurrency.", metavar="RANGE", group="Validation")

    # -- derived values, checked before any work -----------------------------------------------
    def memory_budget_mb(self) -> float | None:
        """The memory budget in MiB (None: no limit)."""
        return parse_size_mb(self.memory_budget)

    def batch_cap(self) -> int | None:
        """The user's cap on the published max_batch_size: None for auto (searched per candidate)."""
        if self.max_batch_size == "auto":
            return None
        try:
            value = int(self.max_batch_size)
        except ValueError:
            raise SettingsError(f"--max-batch-size {self.max_batch_size!r} is not a number or 'auto'; give the largest batch to publish "
                                f"(a whole number from 1 to {MAX_BATCH_SIZE_LIMIT}, e.g. 8) or auto to search it per candidate.") from None
        if not 1 <= value <= MAX_BATCH_SIZE_LIMIT:
            raise SettingsError(f"--max-batch-size {value} must be from 1 to {MAX_BATCH_SIZE_LIMIT} (Triton's int32), or 'auto'.")
        return value

    def load(self) -> tuple[int | None, tuple[int, int] | None]:
        """--concurrency as (one load, None) or (None, (low, high)); (None, None) when not given."""
        if self.concurrency is None:
            return None, None
        text = str(self.concurrency).strip()
        low, sep, high = text.partition(":")
        try:
            values = [int(low)] + ([int(high)] if sep else [])
        except ValueError:
            raise SettingsError(f"--concurrency {text!r} is not N or LOW:HIGH; give the concurrent requests the config is for, "
                                "e.g. 16, or a range such as 1:64.") from None
        if not all(1 <= v <= MAX_CONCURRENCY for v in values):
            raise SettingsError(f"--concurrency {text} must be from 1 to {MAX_CONCURRENCY} concurrent requests.")
        if len(values) == 1 or values[0] == values[1]:
            return values[0], None
        if values[0] > values[1]:
            raise SettingsError(f"--concurrency {text}: LOW is above HIGH; give the range as LOW:HIGH, e.g. {values[1]}:{values[0]}.")
        return None, (values[0], values[1])

    def rate_target(self) -> tuple[float | None, bool]:
        """--rate as (requests per second, False), (None, True) for max, or (None, False) when not given."""
        if self.rate is None:
            return None, False
        text = str(self.rate).strip().lower()
        if text == "max":
            return None, True
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value > 0 and value < float("inf")):
            raise SettingsError(f"--rate {self.rate!r} is not a positive number of requests per second or max; give the rate the config "
                                "must hold, e.g. --rate 200, or --rate max with --latency-budget-ms for the highest it holds.")
        return value, False

    def check_serving(self) -> None:
        """--concurrency, --rate and --serve-search-seconds as values the search can use, and not at odds with each other."""
        self.load()
        rate, most = self.rate_target()
        if (rate is not None or most) and self.concurrency is not None:
            raise SettingsError(f"--rate {self.rate} and --concurrency {self.concurrency} both give the load: --rate measures requests "
                                "arriving on their own (open-loop), --concurrency N clients that each wait for an answer; keep one.")
        if most and self.latency_budget_ms is None:
            raise SettingsError("--rate max asks for the highest rate held within a latency target; add --latency-budget-ms MS "
                                "(at --percentile), or give the rate itself, e.g. --rate 200.")
        if self.latency_budget_ms is not None and not self.latency_budget_ms > 0:
            raise SettingsError(f"--latency-budget-ms {self.latency_budget_ms:g} must be a positive number of milliseconds.")
        if not 0 <= self.headroom < 1:
            raise SettingsError(f"--headroom {self.headroom:g} must be from 0 to below 1 (the share of a replica's capacity kept free, e.g. 0.2).")
        if self.arrivals not in ARRIVALS:
            raise SettingsError(f"--arrivals {self.arrivals!r} is not one of {', '.join(ARRIVALS)}.")
        if self.serve_search_seconds is not None and not self.serve_search_seconds > 0:
            raise SettingsError(f"--serve-search-seconds {self.serve_search_seconds:g} must be positive; use --serve-search off to skip the search.")
        if not self.wait_for_cores_s >= 0:
            raise SettingsError(f"--wait-for-cores {self.wait_for_cores_s:g} must be 0 or more seconds.")
        if self.serve_search not in ("on", "off"):
            raise SettingsError(f"--serve-search {self.serve_search!r} is not on or off.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_toml(self) -> str:
        """The settings as a TOML file that `--config` reads back (None values are left out)."""
        lines = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == []:
                continue
            lines.append(f"{key_of(f.name)} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def key_of(field_name: str) -> str:
    """The settings-file key (and long option name) of a field."""
    for f in fields(ExportSettings):
        if f.name == field_name:
            flag = f.metadata["flag"]
            return "model" if flag == "MODEL" else flag.lstrip("-")
    raise KeyError(field_name)


KEYS: dict[str, str] = {}
"""Settings-file key -> field name."""
for _f in fields(ExportSettings):
    KEYS["model" if _f.metadata["flag"] == "MODEL" else _f.metadata["flag"].lstrip("-")] = _f.name


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_toml(path: Path, what: str, missing: str) -> dict[str, Any]:
    """A TOML file's tables, or one SettingsError line naming `what` (e.g. "settings file 'x.toml'") and, when the
    file is absent, the fix `missing`; shared by the settings file and the fleet plan."""
    if not path.is_file():
        raise SettingsError(f"{what} does not exist; {missing}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{what} is not valid TOML: {err}.") from err
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsError(f"{what} cannot be read: {err}.") from err


def load_settings_file(path: Path) -> dict[str, Any]:
    """Field values from a TOML file (its [tool.aitune-export] table when it is a pyproject.toml)."""
    data = read_toml(path, f"settings file {str(path)!r}", "check --config.")
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("aitune-export", {})
    return settings_values(data, f"settings file {str(path)!r}")


def settings_values(data: dict[str, Any], where: str, also: str = "") -> dict[str, Any]:
    """Field values from a table of settings-file keys (a settings file, a table of a fleet plan); a repeatable key
    takes a string or a list of strings. Errors start with `where`; `also` adds to the list of valid keys."""
    values = {}
    types = {f.name: f for f in fields(ExportSettings)}
    for key, value in data.items():
        if key not in KEYS:
            raise SettingsError(f"{where}: unknown key {key!r}; valid keys are the long option names: {', '.join(sorted(KEYS))}{also}.")
        f = types[KEYS[key]]
        if f.metadata["multiple"]:
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SettingsError(f"{where}: {key!r} must be a string or a list of strings.")
        values[f.name] = value
    return values


def settings_from(values: dict[str, Any]) -> ExportSettings:
    """ExportSettings from field values, rejecting unknown fields with the known ones."""
    names = {f.name for f in fields(ExportSettings)}
    unknown = set(values) - names
    if unknown:
        import difflib

        near = [m for u in sorted(unknown) for m in difflib.get_close_matches(u, names, n=1)]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise SettingsError(f"unknown setting(s) {', '.join(sorted(unknown))}{hint}; known: {', '.join(sorted(names))}.")
    multiple = {f.name for f in fields(ExportSettings) if f.metadata["multiple"]}
    s = ExportSettings(**{k: [v] if k in multiple and isinstance(v, str) else v for k, v in values.items()})
    s.percentile = int(s.percentile)
    if s.max_batch_size is not None and not isinstance(s.max_batch_size, str):
        s.max_batch_size = str(s.max_batch_size)
    if s.rate is not None and not isinstance(s.rate, str):  # rate = 200 in a settings file
        s.rate = str(s.rate)
    return s


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1 / 2**20, "k": 1 / 1024, "kb": 1 / 1024, "kib": 1 / 1024, "m": 1, "mb": 1, "mib": 1,
          "g": 1024, "gb": 1024, "gib": 1024, "t": 2**20, "tb": 2**20, "tib": 2**20}


def parse_size_mb(text: str | None) -> float | None:
    """"2GiB" -> 2048; a bare number is MiB; "auto" -> a quarter of available memory, at most 8 GiB; "none" -> None."""
    if text is None or str(text).lower() == "none":
        return None
    if str(text).lower() == "auto":
        import psutil

        return min(psutil.virtual_memory().available / 2**20 / 4, 8192.0)
    m = _SIZE.match(str(text))
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise SettingsError(f"--memory-budget {text!r} is not a size; use e.g. 512MiB, 2GiB, auto or none.")
    mb = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if mb <= 0:
        raise SettingsError(f"--memory-budget {text!r} must be positive.")
    return mb
