"""Served grid: every served config in a brute-force grid (Model Analyzer's brute search) against the emitted one.

Why: the served search measures a coarse pass and a refinement within a time budget, and with --serve-search off the
in-process rules alone decide. An exhaustive grid over the same knobs, measured in the same real tritonserver at the
same load on the same request mix, says how much throughput the emitted config leaves on the table (emitted/best).

One way to build, load and measure a variant, the served search's own (issue 27 item 5): a grid point is an
`OperatingPoint`, labelled by `point_label`, rendered by `publish.prepare_config` exactly as the export would publish
it, loaded under a private name with the config in the load request (`VariantLoader`; the published repository is
never written), warmed by `warm_up` and measured by `measure_level` (`Bench`). Variants are loaded a few at a time
and never while another is measured.

The grid: max_batch_size 1, 2, 4, ... --max-batch (never above what the artifact accepts or the export's
--max-batch-size; a model that does not batch only at 0) x instances 1..cores (intra-op threads cores // count)
x max_queue_delay_microseconds 0 / 100 / 1000, no preferred_batch_size (as Model Analyzer's brute search leaves it).

The load is the export's (report.json -> published.served_search): the concurrency its objective scored the published
variant at (the target load; for a max-throughput export the concurrency where the published variant peaked), and
with a latency budget only grid points that meet it at that load count. `--concurrency N` overrides it.

How the ratio is measured (one run of the grid is not a measurement: three runs on one repository gave 0.887, 1.046
and 0.862): 1. the emitted config, then every grid point once; 2. every grid point within 10% of the grid's best is
measured again, and again for points that come within 10% of the best mean once a lucky maximum has fallen (each point
at most twice); the best is the highest mean, always of two measurements; 3. the emitted config and that best are
measured in --rounds paired rounds whose order alternates (emitted, best, best, emitted, ...), so drift hits both.
Only the paired rounds count: choosing the best on other measurements keeps the winner's luck out of the ratio.
The ratio is the geometric mean of the per-round ratios emitted/best, with a 90% interval from Student's t over
their logarithms (emitted= and best= are the geometric means of the rounds, so emitted/best = ratio).

    .venv/bin/python benchmarks/served_grid.py REPO [--model NAME] [--report DIR] [--concurrency N] [--quick] [--model-analyzer]

--model-analyzer first runs triton-model-analyzer 1.58 alone (`model-analyzer profile -f` on the model_analyzer.yaml
the export wrote beside its report: local launch mode, so it starts the bundled tritonserver 2.51 itself through the
YAML's launcher, which sets LD_LIBRARY_PATH and the python stub's PATH, and runs perf_analyzer through its launcher with
the server's metrics endpoint on), its brute search bounded as the grid (max batch, instances) at the same concurrency.
Its best config then joins the paired rounds as a third contender, so `ma_best` is measured beside ours in the same
rounds (its own figure, from its own server minutes earlier, goes to the JSON); `ma_seconds` is how long it ran.

The full grid goes to served_grid.json beside the report; the last line is machine-readable:
    served_grid model=<name> emitted=<inf/s> best=<inf/s> ratio=<emitted/best> ratio_lo=<90% low> ratio_hi=<90% high>
        emitted_p95_ms=<ms> best_p95_ms=<ms> grid_seconds=<s> [ma_best=<inf/s> ma_seconds=<s>]
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.errors import ConfigRuleError, PublishError, TemplateError, ValidationError  # noqa: E402
from optimizer.machine import cpu_cores  # noqa: E402
from optimizer.records.report_file import read_report  # noqa: E402
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedSearch, point_label  # noqa: E402
from optimizer.records.tune_result import TuneResult  # noqa: E402
from optimizer.settings import ExportSettings  # noqa: E402
from optimizer.triton.front import front_step  # noqa: E402
from optimizer.triton.local_serving import local_config, needs_translation  # noqa: E402
from optimizer.triton.model_config import canonical, parse  # noqa: E402
from optimizer.triton.perf_analyzer import find_perf_analyzer, write_input_data  # noqa: E402
from optimizer.triton.publish import PublishOptions, prepare_config  # noqa: E402
from optimizer.triton.served_search.loader import VariantLoader, private_name  # noqa: E402
from optimizer.triton.served_search.measure import WARMUP_PER_SLOT, Bench, measure_level, warm_up  # noqa: E402
from optimizer.triton.served_search.objective import Objective  # noqa: E402
from optimizer.triton.served_search.search import LOAD_GROUP, request_mix  # noqa: E402
from optimizer.triton.server import LocalTritonServer, ServerHome, find_triton, homes_root, prepare_home  # noqa: E402
from optimizer.triton.validation import find_export_report, resolve_target  # noqa: E402
from optimizer.triton.validation.target import ModelTarget, local_servability  # noqa: E402

DELAYS_US = (0, 100, 1000)
QUICK = {"batches": (1, 2, 4, 8, 16), "instances": (1, 2), "delays": (0, 1000)}
"""--quick: about 3 minutes on a 2-core machine."""
RECHECK = 0.10
"""Every grid point within 10% of the grid's best is measured again: one measurement of a config differs from the next
by up to 10% on this machine, so any of them may be the real best."""
ROUNDS, QUICK_ROUNDS = 6, 4
DEFAULT_CONCURRENCY = 16
"""The load when the report has none (the served search was off or skipped)."""
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812, 11: 1.796, 12: 1.782,
        13: 1.771, 14: 1.761, 15: 1.753, 16: 1.746, 17: 1.740, 18: 1.734, 19: 1.729, 20: 1.725, 25: 1.708, 30: 1.697}
"""Student's t at 95% by degrees of freedom: a 90% two-sided interval (1.645 beyond 30; between rows, the smaller df's)."""


def paired_ratio(emitted: list[float], best: list[float]) -> tuple[float, float, float]:
    """The geometric mean of the per-round ratios emitted/best and its 90% interval (Student's t over their logarithms).

    Rounds where either side measured nothing (<= 0) are left out; one round gives an unbounded interval (0, inf)."""
    logs = [math.log(e / b) for e, b in zip(emitted, best) if e > 0 and b > 0]
    if not logs:
        raise ValueError("no paired round measured both configs")
    n = len(logs)
    mean = sum(logs) / n
    if n == 1:
        return math.exp(mean), 0.0, math.inf
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    df = n - 1
    t = 1.645 if df > 30 else _T95[max(k for k in _T95 if k <= df)]
    half = t * sd / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def geometric_mean(values: list[float]) -> float:
    """The mean that matches paired_ratio: geometric_mean(emitted) / geometric_mean(best) is its ratio."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class Load:
    """The load every point is measured at and how the best is scored there (the export's objective)."""

    concurrency: int
    source: str
    objective: Objective

    def meets(self, level: LoadLevel) -> bool:
        """Whether a measurement counts for the objective: within the export's latency budget, if it had one."""
        return self.objective.score([level])[1]


def export_load(search: ServedSearch | None, override: int | None) -> Load:
    """The load of the export's served search (report.json -> published.served_search), or --concurrency."""
    budget = search.latency_budget_ms if search else None
    percentile = search.percentile if search else 95
    if override:
        return Load(override, "--concurrency", Objective(override, budget, percentile))
    if search is not None and search.status == "searched" and search.concurrency:
        what = {"concurrency": "its target load", "latency": "where the published variant served the most within the budget",
                "max-throughput": "where the published variant peaked"}.get(search.objective, search.objective)
        return Load(search.concurrency, f"the export's ({search.objective} objective: {what})", Objective(search.concurrency, budget, percentile))
    status = f"served search {search.status}" if search else "no served search recorded"
    return Load(DEFAULT_CONCURRENCY, f"the default ({status} in the report)", Objective(DEFAULT_CONCURRENCY, budget, percentile))


def batch_cap(config: Any, artifact: Any, decision: Any, wanted: int, user_max: int | None) -> tuple[int, str]:
    """The largest max_batch_size the grid may try, and what set it: --max-batch, the export's --max-batch-size, the
    TensorRT engine, the AOTInductor batch dim, or the memory ceiling the export ran into."""
    if config.max_batch_size == 0:
        return 0, "the model does not batch (published max_batch_size 0)"
    caps = [(wanted, "--max-batch")]
    if user_max:
        caps.append((user_max, "the export's --max-batch-size"))
    if artifact.metadata.get("engine_max_batch"):
        caps.append((int(artifact.metadata["engine_max_batch"]), "the TensorRT engine's profiles"))
    if artifact.triton_platform == "torch_aoti":
        from optimizer.backend.torch_aoti import BATCH_DIM_FLOOR

        caps.append((max(artifact.batch_range[1], BATCH_DIM_FLOOR), "the AOTInductor package's batch dim"))
    if decision is not None and decision.ceiling:
        caps.append((decision.ceiling, "the largest batch that fit in memory in-process"))
    return min(caps)


def grid(cap: int, cores: int, quick: bool, thread_parameter: str | None) -> list[OperatingPoint]:
    """Every point, in measuring order (batch, then instances, then delay); max batch 0 and 1 have no delay to vary."""
    batches = [0] if cap == 0 else [b for b in (2 ** i for i in range(cap.bit_length())) if b <= cap]
    counts = list(range(1, cores + 1))
    delays: tuple[int, ...] = DELAYS_US
    if quick:
        batches = [b for b in batches if b == 0 or b in QUICK["batches"]]
        counts, delays = [c for c in counts if c in QUICK["instances"]], QUICK["delays"]
    return [OperatingPoint(b, (), d, n, cores // n if thread_parameter else None)
            for b in batches for n in counts for d in (delays if b > 1 else (0,))]


def point_of(config: Any, thread_parameter: str | None) -> OperatingPoint:
    """The operating point a published config serves at (to label the emitted config as the grid's points are)."""
    threads = config.parameters[thread_parameter].string_value if thread_parameter and thread_parameter in config.parameters else ""
    batching = config.dynamic_batching
    return OperatingPoint(config.max_batch_size, tuple(batching.preferred_batch_size), batching.max_queue_delay_microseconds,
                          sum(g.count or 1 for g in config.instance_group) or 1, int(threads) if threads.isdigit() else None)


def locally(text: str) -> str:
    """The config as the local 2.51 server loads it (torch_aoti through the pytorch stand-in; others unchanged)."""
    config = parse(text)
    return canonical(local_config(config)) if needs_translation(config) else text


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
        """The published config as published (never re-rendered), with the files it names beside the version folders."""
        files = {str(p.relative_to(self.model_dir)): p.read_bytes() for p in self.model_dir.rglob("*")
                 if p.is_file() and p.name != "config.pbtxt" and not p.relative_to(self.model_dir).parts[0].isdigit()}
        return Variant(label, point_of(self.target.config, self.thread_parameter), locally((self.model_dir / "config.pbtxt").read_text()), files)

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
    feed = Path(result.reference.profile_feed)
    if not feed.is_file():  # report paths are relative to where the export ran
        result.reference = replace(result.reference, profile_feed=str(report.parent / "samples" / feed.name))
        if not Path(result.reference.profile_feed).is_file():
            raise Refused(f"the export's request mix {feed} is gone (also not in {report.parent / 'samples'}); re-run the export")
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

    def __init__(self, export: Export, load: Load, workdir: Path) -> None:
        self.export, self.load, self.workdir = export, load, workdir
        self.extras: dict[str, dict[str, bytes]] = {}  # private name -> the files its config names
        self.count = 0
        self.mix = ""
        self._stack = ExitStack()

    def __enter__(self) -> Lab:
        repo = self.workdir / "repo"
        repo.mkdir(parents=True)
        data, self.mix, rows = request_mix(self.export.result, self.workdir)
        plain = write_input_data(self.workdir / "perf_analyzer_input_unbatched.json", rows, batching=False)
        try:
            server = self._stack.enter_context(LocalTritonServer(repo, log_path=self.workdir / "tritonserver.log", home=self.export.home))
            self.loader = self._stack.enter_context(VariantLoader(server.http_url, place=lambda name: self._place(repo, name),
                                                                  check_alive=server.check_alive))
        except BaseException:
            self._stack.close()
            raise
        self.bench = Bench(server.http_url, data, rows, self.workdir)
        self.plain_bench = replace(self.bench, input_data=plain)  # the batch axis as an ordinary dim (max_batch_size 0)
        return self

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

    def _one(self, name: str, v: Variant, window_ms: int) -> dict[str, Any]:
        """Warm one loaded variant and measure it at the load: the row the JSON keeps."""
        from tritonclient.utils import InferenceServerException

        from optimizer.triton.server import triton_message

        bench = self.bench if v.batching else self.plain_bench
        t0, ticks = time.monotonic(), cpu_ticks()
        c = self.load.concurrency
        try:
            warm_up(bench, name, c, WARMUP_PER_SLOT * c)
            level = measure_level(bench, name, c, window_ms)
            row: dict[str, Any] = {"status": "measured", **level.to_json(), "meets": self.load.meets(level)}
        except ValidationError as err:
            row = {"status": "failed", "reason": " ".join(str(err).split())[:400]}
        except (InferenceServerException, OSError) as err:  # refused the warm-up, or the connection closed as it died
            row = {"status": "failed", "reason": f"Triton stopped answering: {triton_message(err)}"}
        seconds = time.monotonic() - t0
        return {**row, "seconds": round(seconds, 2), "others_cpu": others_cpu(ticks, seconds)}

    def measure(self, variants: list[Variant], window_ms: int, tag: str) -> list[dict[str, Any]]:
        """Each variant once (loaded LOAD_GROUP at a time, measured one after another, unloaded); rows in input order."""
        rows: list[dict[str, Any]] = []
        for start in range(0, len(variants), LOAD_GROUP):
            names = self._names(variants[start:start + LOAD_GROUP])
            errors = self._load(names)
            try:
                for name, v in names.items():
                    if v.reason or name in errors:
                        row = {"status": "failed", "reason": v.reason or f"Triton could not load it: {errors[name]}"}
                    else:
                        row = self._one(name, v, window_ms)
                    rows.append({"label": v.label, "point": v.point.to_json(), **row})
                    show(f"{tag} {len(rows)}/{len(variants)}", v, rows[-1])
            finally:
                self.loader.unload(list(names))
        return rows

    def rounds(self, variants: list[Variant], count: int, window_ms: int, on_row: Callable[[int, Variant, dict[str, Any]], None]) -> list[list[dict[str, Any]]]:
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
                    out[i].append(self._one(name, v, window_ms))
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


def model_analyzer(yaml_path: str | None, concurrency: int, max_batch: int, instances: int, work: Path, timeout_s: float) -> dict[str, Any]:
    """Model Analyzer's own brute search (triton-model-analyzer 1.58) on the export's model_analyzer.yaml, bounded as the grid.

    Bounded as the grid: max batch up to the grid's largest, instances up to the grid's most, at the grid's one concurrency.
    Local launch mode as the YAML is written: Model Analyzer starts the bundled tritonserver 2.51 through the launcher
    that gives it LD_LIBRARY_PATH and the python stub's PATH, and perf_analyzer through its launcher; the venv's bin goes
    first on PATH too. Results, checkpoints and the output repository go to a fresh folder here (an old checkpoint would
    be reused as if measured now). Returns what ran, its best row and the seconds it took."""
    binary = Path(sys.executable).parent / "model-analyzer"
    if not binary.is_file():
        return {"status": "skipped", "reason": f"{binary} is missing: pip install 'aitune-export[model-analyzer]'"}
    if not yaml_path or not Path(yaml_path).is_file():
        return {"status": "skipped", "reason": f"the export wrote no model_analyzer.yaml ({yaml_path}); re-run the export"}
    out = work / "model_analyzer"
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)  # Model Analyzer refuses a checkpoint folder whose parent is missing
    command = [str(binary), "profile", "-f", yaml_path, "--export-path", str(out), "--checkpoint-directory", str(out / "checkpoints"),
               "--output-model-repository-path", str(out / "output_model_repository"), "--override-output-model-repository",
               "--run-config-search-min-concurrency", str(concurrency), "--run-config-search-max-concurrency", str(concurrency),
               "--run-config-search-max-instance-count", str(instances)]
    if max_batch > 0:
        command += ["--run-config-search-max-model-batch-size", str(max_batch)]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}  # the launchers bring their own
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    t0 = time.monotonic()
    proc = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # Model Analyzer checkpoints and stops its server on Ctrl-C
        try:
            text, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
        text = f"{text}\n(stopped after {timeout_s:.0f} s: --ma-timeout)"
    seconds = round(time.monotonic() - t0, 1)
    (work / "model_analyzer.log").write_text(text)
    doc: dict[str, Any] = {"status": "ran", "returncode": proc.returncode, "seconds": seconds, "command": command,
                           "export_path": str(out), "output_tail": text[-3000:]}
    results = out / "results" / "metrics-model-inference.csv"
    if not results.is_file():
        doc.update(status="failed", reason=_ma_error(text) or f"exit status {proc.returncode} and no {results.name}")
        return doc
    with open(results, newline="") as f:
        rows = [r for r in csv.DictReader(f) if _float(r.get("Throughput (infer/sec)")) > 0]
    doc["rows"] = rows
    if not rows:
        doc.update(status="failed", reason=f"{results.name} has no measured row")
        return doc
    best = max(rows, key=lambda r: _float(r.get("Throughput (infer/sec)")))
    doc["best"] = {"config": best.get("Model Config Path"), "throughput": _float(best.get("Throughput (infer/sec)")),
                   "p99_ms": _float(best.get("p99 Latency (ms)")), "max_batch_size": best.get("Max Batch Size"),
                   "instances": best.get("Instance Group"), "concurrency": best.get("Concurrency")}
    return doc


def ma_variant(ma: dict[str, Any], thread_parameter: str | None) -> Variant | None:
    """Model Analyzer's best config as a contender of the paired rounds (its output repository's config.pbtxt), if it found one."""
    best = ma.get("best")
    path = Path(ma.get("export_path", "")) / "output_model_repository" / str(best.get("config")) / "config.pbtxt" if best else None
    if path is None or not path.is_file():
        return None
    text = path.read_text()
    return Variant("model analyzer", point_of(parse(text), thread_parameter), locally(text))


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _ma_error(text: str) -> str:
    """Model Analyzer's own error line, if it printed one (an exception's message or an ERROR log line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    picked = [line for line in lines if "Exception" in line or "ERROR" in line or "Error:" in line]
    return (picked or lines[-1:] or [""])[-1][:400]


def write_json(path: Path, doc: dict[str, Any]) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        json.dump(doc, tmp, indent=2)
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile makes it 0600
    os.replace(tmp.name, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path, help="the repository `aitune-export export` published")
    parser.add_argument("--model", help="model name (default: the only public model in REPO)")
    parser.add_argument("--report", type=Path, help="the export's report folder (default: found from the repository)")
    parser.add_argument("--concurrency", type=int, help="the load of every measurement (default: the export's, from its report)")
    parser.add_argument("--max-batch", type=int, default=128, help="largest max_batch_size in the grid")
    parser.add_argument("--rounds", type=int, help=f"paired rounds emitted/best that count (default {ROUNDS}, {QUICK_ROUNDS} with --quick)")
    parser.add_argument("--quick", action="store_true", help=f"a small grid: max batch {QUICK['batches']}, instances {QUICK['instances']}, delay {QUICK['delays']} us")
    parser.add_argument("--model-analyzer", action="store_true", help="also run `model-analyzer profile` on the export's model_analyzer.yaml, bounded as the grid")
    parser.add_argument("--ma-timeout", type=float, default=1800.0, help="seconds Model Analyzer may run")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the server too, as Ctrl-C does
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if (args.concurrency is not None and args.concurrency < 1) or (args.rounds is not None and args.rounds < 2):
        print("--concurrency must be >= 1 and --rounds >= 2 (an interval needs two paired rounds)", file=sys.stderr)
        return 2
    try:
        export = open_export(args.repo, args.model, args.report)
    except Refused as err:
        print(f"served_grid: {err}", file=sys.stderr)
        return 2
    target, artifact = export.target, export.result.selected_candidate.artifact
    load = export_load(export.search, args.concurrency)
    cores = cpu_cores()
    cap, cap_by = batch_cap(target.config, artifact, export.result.selected_candidate.decision, args.max_batch, export.settings.batch_cap())
    points = grid(cap, cores, args.quick, export.thread_parameter)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    emitted = export.emitted()
    variants = [export.variant(p) for p in points]
    budget = load.objective.latency_budget_ms
    print(f"{target.name}: {target.config.platform or target.config.backend}, emitted {emitted.point.label}; grid of {len(points)} points "
          f"(max batch <= {cap}: {cap_by}), {cores} cores; concurrency {load.concurrency}: {load.source}"
          + (f"; only points within p{load.objective.percentile} <= {budget:g} ms count" if budget is not None else ""), flush=True)

    with tempfile.TemporaryDirectory(prefix="served-grid-") as tmp:
        work = Path(tmp)
        ma: dict[str, Any] = {"status": "skipped", "reason": "not asked (pass --model-analyzer)"}
        contenders = []
        if args.model_analyzer:  # first, alone: its servers and ours never measure at the same time
            ma = model_analyzer(export.published.get("model_analyzer_config"), load.concurrency, max(p.max_batch_size for p in points),
                                max(p.instances for p in points), work, args.ma_timeout)
            picked = ma_variant(ma, export.thread_parameter)
            if picked is not None:
                contenders.append(picked)
                print(f"model_analyzer: best {ma['best']['config']} ({picked.point.label}) {ma['best']['throughput']:.1f} infer/s in its "
                      f"own server at concurrency {ma['best']['concurrency']}, {ma['seconds']:.0f} s; it joins the paired rounds", flush=True)
            else:
                print(f"model_analyzer {ma['status']}: {ma.get('reason')}", flush=True)
        try:
            with Lab(export, load, work) as lab:
                first = lab.measure([emitted], lab.bench.window_ms, "emitted")[0]
                if first["status"] != "measured":  # once more: perf_analyzer 2.51 has exited 3 here once, with nothing said, on a busy machine
                    first = lab.measure([emitted], lab.bench.window_ms, "emitted")[0]
                if first["status"] != "measured":
                    print(f"served_grid failed: the emitted config could not be measured: {first['reason']}", file=sys.stderr)
                    return 1
                window = lab.bench.window_for(first["throughput"])
                t0 = time.monotonic()
                rows = lab.measure(variants, window, "grid")
                grid_seconds = time.monotonic() - t0
                measured = [i for i, r in enumerate(rows) if r["status"] == "measured"]
                if not measured:
                    print("served_grid failed: no grid point could be measured", file=sys.stderr)
                    return 1
                counting = [i for i in measured if rows[i]["meets"]] or measured  # none within the budget: the most throughput
                while True:  # until every point within 10% of the best mean has been measured twice (each at most twice)
                    top = max(_mean_throughput(rows[i]) for i in counting)
                    close = [i for i in counting if "again" not in rows[i] and _mean_throughput(rows[i]) >= (1 - RECHECK) * top]
                    if not close:
                        break
                    for i, row in zip(close, lab.measure([variants[i] for i in close], window, "again")):
                        rows[i]["again"] = row
                best_i = max(counting, key=lambda i: _mean_throughput(rows[i]))
                best = replace(variants[best_i], label="best")
                print(f"best of the grid: {best.point.label} ({_mean_throughput(rows[best_i]):.1f}/s, the mean of its grid and second "
                      f"measurement; {sum('again' in r for r in rows)} point(s) came within {RECHECK:.0%} of the best and were measured again)",
                      flush=True)
                paired = lab.rounds([emitted, best, *contenders], rounds, 2 * window,
                                    lambda r, v, row: show(f"round {r + 1}/{rounds}", v, row))
                mix = lab.mix
        except ValidationError as err:  # the server died, or a config the grid measured before no longer loads
            print(f"served_grid failed: {err}", file=sys.stderr)
            return 1

    pairs = [(e, b) for e, b in zip(paired[0], paired[1]) if e["status"] == b["status"] == "measured"]
    if len(pairs) < 2:
        print(f"served_grid failed: only {len(pairs)} of {rounds} paired rounds measured both configs", file=sys.stderr)
        return 1
    ratio, lo, hi = paired_ratio([e["throughput"] for e, _ in pairs], [b["throughput"] for _, b in pairs])
    emitted_tp, best_tp = geometric_mean([e["throughput"] for e, _ in pairs]), geometric_mean([b["throughput"] for _, b in pairs])
    emitted_p95 = sum(e["p95_ms"] for e, _ in pairs) / len(pairs)
    best_p95 = sum(b["p95_ms"] for _, b in pairs) / len(pairs)
    busy = max(m["others_cpu"] for pair in pairs for m in pair)
    shown = {side: ", ".join(f"{pair[k]['throughput']:.1f}" for pair in pairs) for k, side in enumerate(("emitted", "best"))}
    print(f"paired rounds: emitted {shown['emitted']}; best {shown['best']} infer/s; others' CPU up to {busy:.0%} (a busy machine moves both)")
    print(f"emitted {emitted.point.label} vs best {best.point.label}: ratio {ratio:.3f}, 90% interval {lo:.3f}..{hi:.3f} over "
          f"{len(pairs)} paired rounds (Student's t over the log ratios); grid {grid_seconds:.0f} s, {len(rows) - len(measured)} point(s) failed")
    ma_line = ""
    if contenders:  # Model Analyzer's pick, measured in the same rounds as ours (its own figure came from another server run)
        ma["paired"] = paired[2]
        both = [(e["throughput"], m["throughput"]) for e, m in zip(paired[0], paired[2]) if e["status"] == m["status"] == "measured"]
        if both:
            ma_tp = geometric_mean([m for _, m in both])
            ma["ratio"] = paired_ratio([e for e, _ in both], [m for _, m in both])  # emitted / Model Analyzer's pick
            print(f"model_analyzer's pick {contenders[0].point.label}: {ma_tp:.1f} infer/s in the paired rounds; emitted/its pick "
                  f"{ma['ratio'][0]:.3f} (90% {ma['ratio'][1]:.3f}..{ma['ratio'][2]:.3f}); Model Analyzer took {ma['seconds']:.0f} s")
            ma_line = f" ma_best={ma_tp:.1f} ma_seconds={ma['seconds']:.0f}"
        else:
            ma_line = f" ma_best=failed ma_seconds={ma['seconds']:.0f}"
    elif args.model_analyzer:
        ma_line = f" ma_best=failed ma_seconds={ma.get('seconds', 0):.0f}"
    out = export.report.parent / "served_grid.json"  # beside the report used (--report DIR when it holds report.json)
    write_json(out, {"model": target.name, "repository": str(target.repository), "report": str(export.report),
                     "platform": target.config.platform or target.config.backend, "concurrency": load.concurrency, "load": load.source,
                     "objective": load.objective.describe(), "cores": cores, "request_mix": mix, "max_batch_cap": cap, "cap_by": cap_by,
                     "quick": args.quick, "emitted": {"point": emitted.point.to_json(), "label": emitted.point.label, "first": first},
                     "best": {"point": best.point.to_json(), "label": best.point.label},
                     "rounds": {"emitted": paired[0], "best": paired[1], "order": "emitted best, best emitted, ... (alternating)"},
                     "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi, "interval": "90%, Student's t over the per-round log ratios",
                     "grid_seconds": round(grid_seconds, 1), "grid": rows, "model_analyzer": ma})
    print(f"wrote {out}")
    print(f"served_grid model={target.name} emitted={emitted_tp:.1f} best={best_tp:.1f} ratio={ratio:.3f} ratio_lo={lo:.3f} "
          f"ratio_hi={hi:.3f} emitted_p95_ms={emitted_p95:.1f} best_p95_ms={best_p95:.1f} grid_seconds={grid_seconds:.0f}{ma_line}")
    return 0


def _mean_throughput(row: dict[str, Any]) -> float:
    """A grid point's mean over its measurements (the grid pass and, within 10% of the best, the second one)."""
    values = [m["throughput"] for m in (row, row.get("again")) if m and m.get("status") == "measured"]
    return sum(values) / len(values) if values else 0.0


if __name__ == "__main__":
    sys.exit(main())
