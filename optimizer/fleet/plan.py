"""A fleet plan: one TOML file naming many models, the repository and where to run them (`export-many PLAN`).

Each `[models.NAME]` table takes the keys of the settings file (optimizer/settings.py); settings keys at the
top of the plan apply to every model unless a model sets its own. The whole plan is checked before anything
runs: a typo in the tenth model's table would otherwise surface only when its turn comes, an hour later.

```toml
repository = "s3://models/prod"   # or a local folder; any settings key here is every model's default
executor = "ray"                  # or "local" (the default)
address = "auto"                  # ray only; absent = a local Ray instance started for this run
image = "registry.example/team/aitune:1"  # optional: the image of the Kubernetes Indexed Job written beside the report
[models.cnn]
model = "optimizer.examples.cnn:build"
[models.encoder]
model = "optimizer.examples.transformer:build"
input = ["input_ids:int64:1-128"]
value-range = ["input_ids:0:999"]
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from optimizer.errors import PublishError, SettingsError, UsageError
from optimizer.settings import ExportSettings, read_toml, settings_from, settings_values
from optimizer.triton.repository.atomic import check_model_name
from optimizer.vocab import Device

EXECUTORS = ("local", "ray")
PLAN_KEYS = ("executor", "address", "image", "models")
"""Top-level keys that are the plan's own; every other top-level key is a settings key (a default for every model)."""
DEFAULT_REPORT_DIR = "aitune-reports/fleet"
"""The fleet report's folder when neither --report-dir nor the plan's report-dir says; each model reports into NAME/ below it."""


@dataclass(frozen=True)
class PlannedModel:
    """One entry of the plan: its key in [models], its position (for --index) and the settings its export runs with."""

    key: str
    index: int
    settings: ExportSettings

    @property
    def name(self) -> str:
        """The model's name in the repository: its `name` key, else the table's key."""
        return self.settings.name or self.key

    @property
    def gpu(self) -> bool:
        """Whether its measurement needs a GPU (device cuda or cuda:N): the executor reserves one for it."""
        return Device.parse(self.settings.device).is_cuda


@dataclass(frozen=True)
class FleetPlan:
    """A checked plan: where to run, where the fleet report goes, and every model's settings in plan order."""

    path: Path
    executor: str
    address: str | None
    report_dir: Path
    models: tuple[PlannedModel, ...]
    image: str | None = None  # the container image of the Indexed Job manifest (none written without it)

    def entry(self, index: int) -> PlannedModel:
        """The model at 0-based position `index` (a Kubernetes Indexed Job's JOB_COMPLETION_INDEX)."""
        if not 0 <= index < len(self.models):
            raise SettingsError(f"--index {index} is outside plan {str(self.path)!r}, which has {len(self.models)} model(s) "
                                f"(0 to {len(self.models) - 1}, in the order of its [models.*] tables).")
        return self.models[index]


def load_plan(path: Path, report_dir: str | None = None, check: Callable[[ExportSettings], None] | None = None) -> FleetPlan:
    """Read and check PLAN; `report_dir` (--report-dir) overrides the plan's report-dir. Raises SettingsError in one line.

    `check` is called with every model's settings (app/plan.py's check_settings: what an export checks before it loads its
    model), so a bad value in the tenth model's table stops the plan before the first model runs.
    """
    where = str(path)
    data = read_toml(path, f"plan {where!r}", "give the TOML file that names the models ([models.NAME] tables).")
    executor = data.get("executor", "local")
    if executor not in EXECUTORS:
        raise SettingsError(f"plan {where!r}: executor {executor!r} is not one of {', '.join(EXECUTORS)}; "
                            "local runs the models one after another, ray runs each as a Ray task.")
    address = data.get("address")
    if address is not None and (executor != "ray" or not isinstance(address, str)):
        raise SettingsError(f"plan {where!r}: address {address!r} is for executor = \"ray\" (a Ray cluster address such as "
                            "\"auto\" or \"10.0.0.1:6379\"); remove it or set executor = \"ray\".")
    image = data.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise SettingsError(f"plan {where!r}: image {image!r} must be the container image that holds aitune-export and the models' "
                            "code (e.g. image = \"registry.example/team/aitune:1\"), or be left out.")
    common = _settings_values({k: v for k, v in data.items() if k not in PLAN_KEYS}, where, "the plan's top level")
    if "name" in common:
        raise SettingsError(f"plan {where!r}: name at the top level would give every model one name; set name in a [models.NAME] table.")
    plan_report_dir = common.pop("report_dir", None)  # the fleet report's folder, not a per-model default
    fleet_dir = Path(report_dir or plan_report_dir or DEFAULT_REPORT_DIR)
    tables = data.get("models")
    if not isinstance(tables, dict) or not tables:
        raise SettingsError(f"plan {where!r} names no models; add a table per model, e.g. [models.cnn] with "
                            "model = \"optimizer.examples.cnn:build\".")
    models = []
    for index, (key, table) in enumerate(tables.items()):
        models.append(_planned_model(key, table, index, common, fleet_dir, where, check))
    _check_unique(models, where)
    return FleetPlan(path, executor, address, fleet_dir, tuple(models), image)


def _planned_model(key: str, table: Any, index: int, common: dict[str, Any], fleet_dir: Path, where: str,
                   check: Callable[[ExportSettings], None] | None) -> PlannedModel:
    """One [models.KEY] table over the plan's defaults; its report folder defaults to <fleet report dir>/<name>."""
    label = f"model {key!r}"
    if not isinstance(table, dict):
        raise SettingsError(f"plan {where!r}: models.{key} must be a table ([models.{key}] with model = ...), not {type(table).__name__}.")
    values = {**common, **_settings_values(table, where, label)}
    if not values.get("model"):
        raise SettingsError(f"plan {where!r}: {label} has no model key; add model = \"package.module:callable\" (or a .onnx/.pt/.pt2 file).")
    values.setdefault("name", key)
    if not isinstance(values["name"], str):
        raise SettingsError(f"plan {where!r}: {label}: name must be a string, not {values['name']!r}.")
    try:
        check_model_name(values["name"])
    except PublishError as err:
        raise SettingsError(f"plan {where!r}: {label}: {err}") from err
    values.setdefault("report_dir", str(fleet_dir / values["name"]))
    try:
        settings = settings_from(values)
        Device.parse(settings.device)
        if check is not None:
            check(settings)
    except (UsageError, TypeError, ValueError) as err:
        raise SettingsError(f"plan {where!r}: {label}: {err}") from err
    return PlannedModel(key, index, settings)


def _settings_values(table: dict[str, Any], where: str, label: str) -> dict[str, Any]:
    """Field values from one table of the plan: the settings file's keys (at the top level, beside the plan's own)."""
    also = f"; the plan's own keys are {', '.join(PLAN_KEYS)}" if label.startswith("the plan") else ""
    return settings_values(table, f"plan {where!r}: {label}", also)


def _check_unique(models: list[PlannedModel], where: str) -> None:
    """Two entries may not publish the same model name or share a report folder (one would overwrite the other)."""
    for attr, what in (("name", "name"), ("report_dir", "report-dir")):
        seen: dict[str, str] = {}
        for m in models:
            value = m.name if attr == "name" else str(Path(m.settings.report_dir or ""))
            if value in seen:
                raise SettingsError(f"plan {where!r}: models {seen[value]!r} and {m.key!r} have the same {what} {value!r}; "
                                    f"each model needs its own (set {what} in one of the tables).")
            seen[value] = m.key
