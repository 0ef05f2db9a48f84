"""The served benchmarks' one way to load and measure a config variant: the served search's own parts around a private server.

benchmarks/served_grid.py and benchmarks/served_throughput.py measure with these (issue 27 item 5): a variant is an
`OperatingPoint` rendered by `publish.prepare_config` as the export would publish it (or the published config itself),
loaded under a private name with the config in the load request (`VariantLoader`: the published repository is never
written), warmed by `warm_up` and measured by `measure_level` (`Bench`), a few loaded at a time and never while
another is measured.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.errors import ConfigRuleError, PublishError, TemplateError, ValidationError  # noqa: E402
from optimizer.records.report_file import read_report  # noqa: E402
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch, point_label  # noqa: E402
from optimizer.records.tune_result import TuneResult  # noqa: E402
from optimizer.settings import ExportSettings  # noqa: E402
from optimizer.triton.config.front import front_step  # noqa: E402
from optimizer.triton.runtime.local_serving import local_config, needs_translation  # noqa: E402
from optimizer.triton.runtime.perf_analyzer import find_perf_analyzer  # noqa: E402
from optimizer.triton.runtime.perf_analyzer_input import write_input_data  # noqa: E402
from optimizer.triton.repository.publish import PublishOptions, prepare_config  # noqa: E402
from optimizer.triton.measure.served_search.loader import VariantLoader, private_name  # noqa: E402
from optimizer.triton.measure.served_search.measure import WARMUP_PER_SLOT, Bench, in_config_names, measure_level, warm_up  # noqa: E402
from optimizer.triton.measure.served_search.objective import Objective  # noqa: E402
from optimizer.triton.measure.served_search.run import LOAD_GROUP  # noqa: E402
from optimizer.triton.measure.served_search.search import request_mix  # noqa: E402
from optimizer.triton.measure.served_search.servers import locally  # noqa: E402
from optimizer.triton.measure.served_search.request import LOCAL_PROTOCOL  # noqa: E402
from optimizer.triton.runtime.install import ServerHome, find_triton, homes_root, prepare_home  # noqa: E402
from optimizer.triton.runtime.server import LocalTritonServer  # noqa: E402
from optimizer.triton.measure.validation import find_export_report, resolve_target  # noqa: E402
from optimizer.triton.measure.target import ModelTarget, local_servability  # noqa: E402

@dataclass(frozen=True)
class Load:
    """The load every point is measured at and how the best is scored there (the export's objective)."""

    concurrency: int
    source: str
    objective: Objective

    def meets(self, level: LoadLevel) -> bool:
        """Whether a measurement counts for the objective: within the export's latency budget, if it had one."""
        return self.objective.score([level])[1]


def point_of(config: Any, thread_parameter: str | None) -> OperatingPoint:
    """The operating point a published config serves at (to label the emitted config as the grid's points are)."""
    threads = config.parameters[thread_parameter].string_value if thread_parameter and thread_parameter in config.parameters else ""
    batching = config.dynamic_batching
    return OperatingPoint(config.max_batch_size, tuple(batching.preferred_batch_size), batching.max_queue_delay_microseconds,
                          sum(g.count or 1 for g in config.instance_group) or 1, int(threads) if threads.isdigit() else None)


@dataclass
class Variant:
    """A config to measure: its label, its operating point, the config text the server loads and the files it names.

    `batching` False: its requests carry the batch axis as an ordinary dim (a config with max_batch_size 0)."""

    label: str
    point: OperatingPoint
    text: str = ""
    extra: dict[str, bytes] = field(default_factory=dict)
    reason: str = ""  # why it could not be rendered (then it is not loaded)
    batching: bool = True
    padded: bool = False  # its requests are the traffic padded to the export's bucket edges (the client contract says so)


class Refused(Exception):
    """Bad input to a benchmark (the repository, the model or its report): one line, exit status 2."""


@dataclass
class Export:
    """A published export as the served benchmarks measure it: the model that runs the artifact (behind the client
    contract's ensemble, if any), the export's report and the publish options its configs were rendered with."""

    public: ModelTarget
    target: ModelTarget
    report: Path
    result: TuneResult
    settings: ExportSettings
    published: dict[str, Any]
    options: PublishOptions
    home: ServerHome

    @property
    def search(self) -> ServedSearch | None:
        """The export's served search (what it measured, for which load), if the report has one."""
        d = self.published.get("served_search")
        return ServedSearch.from_json(d) if d else None

    @property
    def thread_parameter(self) -> str | None:
        platform = self.result.selected_candidate.artifact.platform
        return platform.thread_parameter if platform else None

    @property
    def model_dir(self) -> Path:
        return self.target.repository / self.target.name

    def emitted(self, label: str = "emitted") -> Variant:
        """The published config as published (never re-rendered), with the files it names beside the version folders; its
        requests padded to the export's bucket edges when the export tells clients to pad."""
        files = {str(p.relative_to(self.model_dir)): p.read_bytes() for p in self.model_dir.rglob("*")
                 if p.is_file() and p.name != "config.pbtxt" and not p.relative_to(self.model_dir).parts[0].isdigit()}
        return Variant(label, point_of(self.target.config, self.thread_parameter), locally((self.model_dir / "config.pbtxt").read_text()), files,
                       padded=bool(self.search is not None and self.search.padded))  # sent as its clients are told to send

    def variant(self, point: OperatingPoint, label: str | None = None) -> Variant:
        """A point's config exactly as the export would publish it (publish.prepare_config with the point), as the search renders."""
        try:
            text, extra, _ = prepare_config(self.result, replace(self.options, operating_point=point))
            return Variant(label or point.label, point, locally(text), extra)
        except (ConfigRuleError, TemplateError, PublishError) as err:
            return Variant(label or point.label, point, reason=f"the config is refused: {' '.join(str(err).split())[:300]}")


def open_export(repo: Path, model: str | None, report_hint: Path | None) -> Export:
    """REPO (+ --model, --report) -> the export to measure; Refused with the fix when something is missing."""
    from optimizer.errors import OptimizerError

    try:
        public = resolve_target(repo, model)
        report = find_export_report(public, report_hint)
        if report is None:
            raise Refused(f"no report.json of the export that published {public.name}; pass --report DIR")
        result, settings, doc = read_report(report)
    except OptimizerError as err:
        raise Refused(str(err)) from err
    for key in ("profile_feed", "traffic"):  # report paths are relative to where the export ran
        recorded = getattr(result.reference, key)
        if recorded and not Path(recorded).is_file():
            result.reference = replace(result.reference, **{key: str(report.parent / "samples" / Path(recorded).name)})
            if not Path(getattr(result.reference, key)).is_file():
                raise Refused(f"the export's request mix {recorded} is gone (also not in {report.parent / 'samples'}); re-run the export")
    inner = front_step(public.config)
    target = resolve_target(public.repository, inner) if inner else public
    home = prepare_home(find_triton(), homes_root(None))
    reason = local_servability(replace(target, config=local_config(target.config)) if needs_translation(target.config) else target, home)
    if reason:
        raise Refused(f"the local tritonserver cannot serve {target.name}: {reason}")
    find_perf_analyzer()
    options = PublishOptions(public.repository, public.name, settings.version, settings.overwrite, settings.warmup,
                             Path(settings.template_dir) if settings.template_dir else None, io_names=settings.io_names)
    return Export(public, target, report, result, settings, doc.get("published") or {}, options, home)


def cpu_ticks() -> tuple[int, int]:
    """(busy ticks of the whole machine, ticks of this process tree: us, finished children, the server and its stubs)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    stats = {}
    for entry in Path("/proc").iterdir():
        try:
            parts = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else None
        except OSError:
            continue
        if parts:
            stats[int(entry.name)] = (int(parts[1]), sum(int(x) for x in parts[11:15]))  # ppid, utime+stime+cutime+cstime
    ours, tree = 0, {os.getpid()}
    for pid in sorted(stats):  # children have larger pids, except after pid wrap-around (then they count as others)
        if pid in tree or stats[pid][0] in tree:
            tree.add(pid)
            ours += stats[pid][1]
    return sum(fields) - fields[3] - fields[4], ours


def others_cpu(before: tuple[int, int], seconds: float) -> float:
    """The share of the machine's cores that other processes used since `before` (0..1)."""
    (busy0, ours0), (busy1, ours1) = before, cpu_ticks()
    total = seconds * os.sysconf("SC_CLK_TCK") * (os.cpu_count() or 1)
    return round(min(1.0, max(0.0, (busy1 - busy0 - (ours1 - ours0)) / total)), 2) if total > 0 else 0.0


class Lab:
    """The served search's parts around one private server: variants loaded under private names (a group at a time, or
    side by side for paired rounds), each warmed and measured at the load, never loaded while another is measured.

    A context manager: the server, its private repository (the published version folders linked, the config's files
    written) and every variant loaded are gone when it exits."""

    def __init__(self, export: Export, load: Load, workdir: Path, traffic: Path | None = None) -> None:
        """`traffic`: a perf_analyzer --input-data JSON to send instead of the export's own traffic (checked against its
        signature)."""
        self.export, self.load, self.workdir, self.traffic = export, load, workdir, traffic
        self.extras: dict[str, dict[str, bytes]] = {}  # private name -> the files its config names
        self.count = 0
        self.mix = ""
        self._stack = ExitStack()

    def __enter__(self) -> Lab:
        repo = self.workdir / "repo"
        repo.mkdir(parents=True)
        data, self.mix, rows = self._mix()
        padding = self.export.search.client_padding if self.export.search is not None and self.export.search.padded else None
        padded_data, _, padded_rows = self._mix(padding) if padding else (data, "", rows)
        plain = write_input_data(self.workdir / "perf_analyzer_input_unbatched.json", rows, batching=False)
        try:
            server = self._stack.enter_context(LocalTritonServer(repo, log_path=self.workdir / "tritonserver.log", home=self.export.home))
            self.loader = self._stack.enter_context(VariantLoader(server.grpc_url, protocol=LOCAL_PROTOCOL, place=lambda name, _files: self._place(repo, name),
                                                                  check_alive=server.check_alive))
        except BaseException:
            self._stack.close()
            raise
        self.bench = Bench(server.grpc_url, data, rows, self.workdir, protocol=LOCAL_PROTOCOL)
        self.plain_bench = replace(self.bench, input_data=plain)  # the batch axis as an ordinary dim (max_batch_size 0)
        self.padded_bench = replace(self.bench, input_data=padded_data, rows=padded_rows)
        return self

    def _mix(self, padding: dict[str, Any] | None = None) -> tuple[Path, str, list[dict[str, Any]]]:
        """The requests to send: the given traffic file, else the export's own traffic (padded as its clients are told)."""
        if self.traffic is None:
            return request_mix(self.export.result, self.workdir, padding=padding, name=f"perf_analyzer_input{'_padded' if padding else ''}.json")
        from optimizer.model.signature import Signature
        from optimizer.model.traffic import load_traffic

        sig = Signature.from_json(self.export.result.signature)
        traffic = load_traffic(self.traffic, sig)
        if padding:
            traffic = traffic.padded(sig, list(padding["edges"]))
        feeds = in_config_names(self.export.result, traffic.sent())
        path = write_input_data(self.workdir / f"traffic_input{'_padded' if padding else ''}.json", feeds, sig.batching)
        return path, f"{self.traffic.name}{' padded' if padding else ''} ({len(feeds)} requests)", feeds

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _place(self, repo: Path, name: str) -> None:
        (repo / name).mkdir(exist_ok=True)
        for entry in self.export.model_dir.iterdir():
            if entry.is_dir() and entry.name.isdigit() and not (repo / name / entry.name).exists():
                (repo / name / entry.name).symlink_to(entry.resolve())
        for rel, blob in self.extras.get(name, {}).items():  # written here, never through a link into the published repository
            (repo / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / name / rel).write_bytes(blob)

    def _names(self, variants: list[Variant]) -> dict[str, Variant]:
        out = {}
        for v in variants:
            self.count += 1
            out[private_name(self.export.target.name, self.count)] = v
        return out

    def _load(self, names: dict[str, Variant]) -> dict[str, str]:
        loadable = {n: v for n, v in names.items() if not v.reason}
        self.extras.update({n: v.extra for n, v in loadable.items()})
        return self.loader.load({n: v.text for n, v in loadable.items()}) if loadable else {}

    def _one(self, name: str, v: Variant, window_ms: int, concurrency: int | None = None) -> dict[str, Any]:
        """Warm one loaded variant and measure it at the load (or `concurrency`): the row the JSON keeps."""
        from tritonclient.utils import InferenceServerException

        from optimizer.triton.runtime.server import triton_message

        bench = self.padded_bench if v.padded else self.bench if v.batching else self.plain_bench
        t0, ticks = time.monotonic(), cpu_ticks()
        c = concurrency or self.load.concurrency
        try:
            warm_up(bench, name, c, WARMUP_PER_SLOT * c)
            level = measure_level(bench, name, c, window_ms)
            row: dict[str, Any] = {"status": "measured", **level.to_json(), "meets": self.load.meets(level) if not concurrency else True}
        except ValidationError as err:
            row = {"status": "failed", "reason": " ".join(str(err).split())[:400]}
        except (InferenceServerException, OSError) as err:  # refused the warm-up, or the connection closed as it died
            row = {"status": "failed", "reason": f"Triton stopped answering: {triton_message(err)}"}
        seconds = time.monotonic() - t0
        return {**row, "seconds": round(seconds, 2), "others_cpu": others_cpu(ticks, seconds)}

    def measure(self, variants: list[Variant], window_ms: int, tag: str, loads: tuple[int, ...] = ()) -> list[dict[str, Any]]:
        """Each variant once (loaded LOAD_GROUP at a time, measured one after another, unloaded); rows in input order. With
        `loads`, each variant at each of them: one row per variant and load."""
        rows: list[dict[str, Any]] = []
        for start in range(0, len(variants), LOAD_GROUP):
            names = self._names(variants[start:start + LOAD_GROUP])
            errors = self._load(names)
            try:
                for name, v in names.items():
                    for c in loads or (None,):
                        if v.reason or name in errors:
                            row = {"status": "failed", "reason": v.reason or f"Triton could not load it: {errors[name]}"}
                        else:
                            row = self._one(name, v, window_ms, c)
                        rows.append({"label": v.label, "point": v.point.to_json(), **row})
                        show(f"{tag} {len(rows)}/{len(variants) * max(1, len(loads))}", v, rows[-1])
            finally:
                self.loader.unload(list(names))
        return rows

    def rounds(self, variants: list[Variant], count: int, window_ms: int, on_row: Callable[[int, Variant, dict[str, Any]], None],
               concurrency: int | None = None) -> list[list[dict[str, Any]]]:
        """The variants loaded side by side and measured in `count` rounds whose order reverses every round (a b, b a, a b,
        ...: for two, emitted best best emitted); one list of rows per variant. ValidationError when one does not load."""
        names = self._names(variants)
        errors = self._load(names)
        out: list[list[dict[str, Any]]] = [[] for _ in variants]
        try:
            refused = [f"{v.label}: {v.reason or errors[n]}" for n, v in names.items() if v.reason or n in errors]
            if refused:
                raise ValidationError("; ".join(refused))
            order = list(enumerate(names.items()))
            for r in range(count):
                for i, (name, v) in order if r % 2 == 0 else order[::-1]:
                    out[i].append(self._one(name, v, window_ms, concurrency))
                    on_row(r, v, out[i][-1])
        finally:
            self.loader.unload(list(names))
        return out


def show(tag: str, v: Variant, m: dict[str, Any]) -> None:
    """One progress line per measurement (stdout; the machine-readable line comes last)."""
    name = v.label if v.label in ("emitted", "best", "model analyzer") else point_label(v.point.to_json())
    if m["status"] != "measured":
        print(f"{tag:<12} {name:<44} {m['status']}: {m['reason']}", flush=True)
        return
    batch = f"{m['server_batch']:.2f}" if m.get("server_batch") else "-"
    meets = "" if m.get("meets", True) else "  (over the budget)"
    print(f"{tag:<12} {name:<44} {m['throughput']:8.1f} infer/s  p95 {m['p95_ms']:7.1f} ms  server batch {batch:<5}  "
          f"others' CPU {m.get('others_cpu', 0):.0%}{meets}", flush=True)
