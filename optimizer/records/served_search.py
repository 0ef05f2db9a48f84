"""Served-search records: an operating point of the served config, one measured variant with its load curve, and the search.

Plain data with JSON round trips: the search (triton/measure/served_search) writes them, publishing applies
the chosen point, report.json keeps every variant under `published.served_search`, and `validate`
reads the curve back to predict the loads the search did not measure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

SEARCH_STATUSES = ("searched", "skipped", "off")
"""searched: measured in a tritonserver; skipped: it could not serve this artifact (reason says why); off: not asked."""

OBJECTIVES = ("concurrency", "latency", "range", "any-load", "rate")
"""concurrency: the most throughput at --concurrency N; latency: the most throughput at any load whose percentile latency
meets --latency-budget-ms; range (--concurrency LOW:HIGH) and any-load (no load given): the variant whose worst score
(throughput and latency against the best) over a ladder of loads is highest (objective.robust_ratios); rate (--rate R|max):
the finalists of a closed-loop pass measured open-loop, the highest capacity within the budget (or the lowest latency at R)."""

OBJECTIVE_SENTENCE = ("With no load given, the published config is the one whose worst score over the loads 1, 4, 16, 64, ... "
                      "concurrent requests is highest, a load's score being the geometric mean of its throughput and its p95 "
                      "latency, each relative to the best variant at that load.")
"""The default objective in one sentence: the README, the docs and report.md say it."""


@dataclass(frozen=True)
class OperatingPoint:
    """How Triton serves the artifact: the batcher (max, preferred sizes, queue delay) and the instance layout.

    `threads` is one instance's intra-op thread count (None: the artifact's own setting, e.g. on a GPU).
    """

    max_batch_size: int
    preferred: tuple[int, ...]
    queue_delay_us: int
    instances: int = 1
    threads: int | None = None
    candidate: str = ""  # another candidate of the run than the selected one (a backend of the other kind); "" for the selected

    @property
    def label(self) -> str:
        """One short line a table cell or a plot label can hold."""
        return point_label(self.to_json())

    @property
    def layout(self) -> str:
        """Instances x threads each ("2x1t"), or the instance count where threads are the artifact's own."""
        return f"{self.instances}x{self.threads}t" if self.threads else f"{self.instances} inst"

    def differences(self, other: OperatingPoint) -> dict[str, list[Any]]:
        """Field -> [this value, other's value] for every field that differs (how a variant differs from the published point)."""
        mine, theirs = asdict(self), asdict(other)
        return {k: [list(mine[k]) if k == "preferred" else mine[k], list(theirs[k]) if k == "preferred" else theirs[k]]
                for k in mine if mine[k] != theirs[k]}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["preferred"] = list(self.preferred)
        if not self.candidate:
            del d["candidate"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OperatingPoint:
        d = dict(d)
        d["preferred"] = tuple(d.get("preferred") or ())
        return cls(**d)


def point_label(point: dict[str, Any] | None) -> str:
    """The one label of a point, from its JSON form: the search's log, report.md, the plot and the benchmarks all use it."""
    if not point:
        return "?"
    pref = ",".join(map(str, point.get("preferred") or ())) or "-"
    threads = point.get("threads")
    layout = f"{point.get('instances', 1)}x{threads}t" if threads else f"{point.get('instances', 1)} inst"
    label = f"max {point.get('max_batch_size')} pref [{pref}] delay {point.get('queue_delay_us')}us {layout}"
    return f"{point['candidate']}: {label}" if point.get("candidate") else label


@dataclass
class LoadLevel:
    """perf_analyzer's measurement of one variant at one concurrency: throughput, latency percentiles, the batch formed."""

    concurrency: int
    throughput: float  # inferences (samples) per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    server_batch: float | None = None  # inferences per model execution: the batch the dynamic batcher really formed
    others_busy: float | None = None  # other processes' most CPU (cores, any half second) while it was measured; None: not watched

    def latency(self, percentile: int) -> float:
        """The latency at a percentile perf_analyzer reports (50, 90, 95, 99)."""
        return {50: self.p50_ms, 90: self.p90_ms, 99: self.p99_ms}.get(percentile, self.p95_ms)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LoadLevel:
        return cls(**{k: d.get(k) for k in (f.name for f in fields(cls)) if k in d})


@dataclass
class ServedVariant:
    """One config variant measured by perf_analyzer: its curve over the loads measured, and the level the objective scored."""

    point: OperatingPoint
    stage: str  # "start", "coarse", "refine", "settle" (measured again, interleaved with its runner-up), "base" (one request at a time)
    status: str = "measured"  # measured, failed
    reason: str = ""
    curve: list[LoadLevel] = field(default_factory=list)  # in concurrency order
    concurrency: int | None = None  # the level the objective scored (the target load, or where the variant peaked)
    meets_budget: bool | None = None  # with a latency budget: whether any measured level met it
    throughput: float | None = None  # the scored level's figures (copied from `curve`, so tables need not look them up)
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    server_batch: float | None = None
    seconds: float = 0.0  # load + warm-up + measurement
    differs: dict[str, list[Any]] = field(default_factory=dict)  # filled in at the end: field -> [this, published]
    traffic: str = ""  # "" the traffic as it comes; "padded": every request padded to the bucket edges (padding.py)
    worst: float | None = None  # a robust objective: its worst score against the best variant at each load (1.0: the best everywhere)
    worst_at: int | None = None  # the load where that score is worst

    def level(self, concurrency: int) -> LoadLevel | None:
        """The curve's measurement at `concurrency`, if it was measured."""
        return next((lv for lv in self.curve if lv.concurrency == concurrency), None)

    def score_at(self, level: LoadLevel | None) -> None:
        """Copy the scored level's figures onto the variant."""
        if level is None:
            return
        self.concurrency, self.throughput, self.server_batch = level.concurrency, level.throughput, level.server_batch
        self.p50_ms, self.p95_ms, self.p99_ms = level.p50_ms, level.p95_ms, level.p99_ms

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["point"] = self.point.to_json()
        d["label"] = self.point.label
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServedVariant:
        d = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        d["point"] = OperatingPoint.from_json(d["point"])
        d["curve"] = [LoadLevel.from_json(x) for x in d.get("curve") or []]
        return cls(**d)


@dataclass
class ServedSearch:
    """What the served search measured and chose, or why it did not run. `chosen` is what was published."""

    status: str
    reason: str = ""
    objective: str = "concurrency"  # one of OBJECTIVES
    load: str = ""  # the load the choice is for, in one line (report.md says it)
    concurrency: int | None = None  # the scored level of the published variant (the target load, or where it peaked)
    concurrency_source: str = ""  # "--concurrency", or how the level was found
    latency_budget_ms: float | None = None
    percentile: int = 95
    served_by: str = ""  # "stand-in backend ..." or "native backend": every served number is labelled
    stand_in: bool = False
    server: str = ""
    protocol: str = ""  # what perf_analyzer spoke to the server ("grpc" on the bundled server, --protocol with --url)
    request_mix: str = ""
    start: OperatingPoint | None = None  # the in-process rules' point
    chosen: OperatingPoint | None = None
    variants: list[ServedVariant] = field(default_factory=list)
    stopped: str = ""  # why the search ended: the space was covered, or the time budget
    settled: str = ""  # how a close call between the best two was decided (interleaved re-measurement), "" when none was close
    seconds: float = 0.0
    budget_s: float = 0.0
    in_process_throughput: float | None = None  # in-process samples/s at the batch the server formed
    per_request_ms: float | None = None  # the server's cost per request on top of the in-process time
    predicted_throughput: float | None = None  # what the published config served at `concurrency` in the search
    measured_on: dict[str, Any] | None = None  # task/core_share.CoreShare.to_json() when others kept cores busy as it began (else None)
    held_layout: str = ""  # beside other processes' load: why only the start's instance layout was measured ("" otherwise)
    waited_s: float | None = None  # --wait-for-cores: how long the search waited for the cores others used
    refused: bool = False  # the user's server (--url) refused to load the artifact: the export tries the next candidate
    cached_from: str = ""  # when the reused measurements were taken (UTC, ISO 8601); "" when they were taken in this run
    remeasured: int = 0  # measurements taken again because other processes' load rose while they ran (run.py: DISTURBED)
    retried_s: float = 0.0  # seconds those repeats took, waiting included: added to the budget (run.py: REMEASURE_SHARE)
    client_padding: dict[str, Any] | None = None  # padding.PaddingTrial.to_json(): advised (clients pad to its edges) or why not
    kinds: str = ""  # which candidate of the other kind (padding or not) entered the search, or why none did
    candidate: str = ""  # the candidate the published variant serves ("" the selected one)
    capacity: dict[str, Any] | None = None  # records.capacity.Capacity.to_json() of the published config (--rate or --latency-budget-ms)
    open_loop: list[dict[str, Any]] = field(default_factory=list)  # every finalist measured open-loop: point, label, capacity

    @property
    def padded(self) -> bool:
        """Whether clients are told to pad their requests to the bucket edges (and the published variant was measured so)."""
        return bool(self.client_padding and self.client_padding.get("advised"))

    @property
    def chosen_variant(self) -> ServedVariant | None:
        """The published point's latest scored measurement (a settle round may have measured it again; the base measurement
        at one request at a time only anchors validate's prediction)."""
        mark = "padded" if self.padded else ""
        return next((v for v in reversed(self.variants)
                     if v.point == self.chosen and v.status == "measured" and v.stage != "base" and v.traffic == mark), None)

    def counts(self) -> tuple[int, int]:
        """(distinct configs the search tried, measurements of one of them again: a close call's settling, the lone
        request of validate's anchor). Why apart: "14 variants" had counted the settling's and the anchor's rows as
        configs of their own."""
        again = {"settle", "base", "padded"}
        return len({v.point for v in self.variants if v.stage not in again}), sum(v.stage in again for v in self.variants)

    def count_text(self) -> str:
        """'11 variants' or '11 variants (+3 measured again)'."""
        tried, again = self.counts()
        return f"{tried} variant{'s' if tried != 1 else ''}" + (f" (+{again} measured again)" if again else "")

    @property
    def beside_load(self) -> bool:
        """Whether other processes kept cores busy as the search began: every variant ran on every core beside that load."""
        return bool(self.measured_on) and len(self.measured_on["cores"]) < len(self.measured_on["available"])

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["start"] = self.start.to_json() if self.start else None
        d["chosen"] = self.chosen.to_json() if self.chosen else None
        d["variants"] = [v.to_json() for v in self.variants]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServedSearch:
        d = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        d["start"] = OperatingPoint.from_json(d["start"]) if d.get("start") else None
        d["chosen"] = OperatingPoint.from_json(d["chosen"]) if d.get("chosen") else None
        d["variants"] = [ServedVariant.from_json(v) for v in d.get("variants", [])]
        return cls(**d)
