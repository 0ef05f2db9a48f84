"""Throughput and latency versus batch size, one line per candidate, the published point marked; and the
served search's variants, throughput versus latency, the published config marked.

The data is gathered first (`plot_data`, plain records a test can check), then drawn on
matplotlib figures with the Agg canvas (no display, no pyplot global state). matplotlib is
imported only when a figure is drawn: it is the optional `report` extra.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from optimizer.records.tune_result import TuneResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

PLOT_FILES = {"throughput": "throughput.png", "latency": "latency.png"}
"""Plot kind -> file name, written beside report.json and linked from report.md."""
SERVED_SEARCH_FILE = "served_search.png"
"""The served search's plot (`write_served_search_plot`), drawn from report.json's `published.served_search`."""
CAPACITY_FILE = "capacity.png"
"""Latency against offered rate, open-loop (`write_capacity_plot`), drawn from report.json's `capacity`."""


@dataclass
class Series:
    """One candidate's measured batch sizes. Latencies are at the result's percentile, in ms."""

    name: str
    baseline: bool  # eager PyTorch: drawn dashed
    status: str
    batch_sizes: list[int]
    throughput: list[float]
    latency_ms: list[float]
    over_budget: list[tuple[int, float]] = field(default_factory=list)  # (batch, latency) measured above the budget


@dataclass
class ChosenPoint:
    """The published candidate at the published max batch size."""

    candidate: str
    batch_size: int
    throughput: float
    latency_ms: float


@dataclass
class PlotData:
    """Everything the two plots show."""

    title: str
    percentile: int
    series: list[Series]
    chosen: ChosenPoint | None
    latency_budget_ms: float | None = None


def plot_data(result: TuneResult) -> PlotData:
    """The series of every candidate that measured something (eager first) and the chosen point."""
    series = []
    for cand in ([result.eager] if result.eager else []) + list(result.candidates):
        d = cand.decision
        if d is None or not d.profiles:
            continue
        profiles = sorted(d.profiles, key=lambda p: p.batch_size)
        series.append(Series(
            name=cand.name,
            baseline=cand is result.eager,
            status=cand.status,
            batch_sizes=[p.batch_size for p in profiles],
            throughput=[p.throughput for p in profiles],
            latency_ms=[p.percentile_ms(result.percentile) for p in profiles],
            over_budget=[(p.batch_size, p.percentile_ms(result.percentile)) for p in d.over_budget],
        ))
    chosen = None
    if result.selected:
        cand = result.selected_candidate
        if cand.decision and cand.decision.profiles:
            point = cand.decision.profile_at(max(cand.decision.measured_max or result.max_batch_size, 1)) or cand.decision.best
            chosen = ChosenPoint(cand.name, point.batch_size, point.throughput, point.percentile_ms(result.percentile))
    return PlotData(f"{result.model_name} on {result.device}", result.percentile, series, chosen, result.latency_budget_ms)


def throughput_figure(data: PlotData) -> Figure:
    """Throughput (samples/s) versus batch size."""
    fig, ax = _axes(f"{data.title}: throughput", "throughput (samples/s)")
    for s in data.series:
        ax.plot(s.batch_sizes, s.throughput, **_style(s))
    if data.chosen:
        _mark(ax, data.chosen.batch_size, data.chosen.throughput, data.chosen)
    _finish(ax, data)
    return fig


def latency_figure(data: PlotData) -> Figure:
    """Latency at the result's percentile versus batch size, with the latency budget when there is one."""
    fig, ax = _axes(f"{data.title}: p{data.percentile} latency", f"p{data.percentile} latency (ms)")
    for s in data.series:
        line = ax.plot(s.batch_sizes, s.latency_ms, **_style(s))[0]
        if s.over_budget:
            ax.plot([b for b, _ in s.over_budget], [v for _, v in s.over_budget], linestyle="none", marker="x",
                    color=line.get_color(), label=f"{s.name} over budget")
    if data.latency_budget_ms is not None:
        ax.axhline(data.latency_budget_ms, color="grey", linestyle=":", label=f"budget {data.latency_budget_ms:g} ms")
    if data.chosen:
        _mark(ax, data.chosen.batch_size, data.chosen.latency_ms, data.chosen)
    _finish(ax, data)
    return fig


def write_plots(result: TuneResult, out_dir: Path) -> dict[str, Path]:
    """Draw both plots into `out_dir` as PNG files; returns kind -> path (empty when matplotlib is missing)."""
    data = plot_data(result)
    if not data.series:
        return {}
    try:
        figures = {"throughput": throughput_figure(data), "latency": latency_figure(data)}
    except ImportError as err:
        log.warning("no plots: matplotlib cannot be imported (%s); install the report extra: pip install 'aitune-export[report]'", err)
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, fig in figures.items():
        paths[kind] = out_dir / PLOT_FILES[kind]
        fig.savefig(paths[kind], dpi=110)
    return paths


def served_search_figure(search: dict[str, Any]) -> Figure | None:
    """Served throughput versus concurrency, one curve per measured variant (the loads its sweep measured), the published
    variant drawn bold with a star where it was scored and the in-process rules' variant a square; None when nothing was
    measured. Only the published, the rules' and the three best other variants are named in the legend.

    `search` is report.json's `published.served_search` (ServedSearch.to_json()).
    """
    merged: dict[str, dict[str, Any]] = {}  # one curve per point: every measurement of it (coarse, settle, base), latest per load
    for v in search.get("variants") or []:
        if v.get("status") != "measured" or not (v.get("curve") or v.get("throughput") is not None):
            continue
        key = json.dumps(v["point"], sort_keys=True)
        curve = {lv["concurrency"]: lv for lv in (merged[key]["curve"] if key in merged else [])}
        curve.update({lv["concurrency"]: lv for lv in v.get("curve") or [{"concurrency": v.get("concurrency") or 1, "throughput": v["throughput"]}]})
        scored = v if v.get("stage") != "base" or key not in merged else merged[key]
        merged[key] = {**scored, "curve": [curve[c] for c in sorted(curve)]}
    variants = list(merged.values())
    if not variants:
        return None
    kind = " (stand-in backend)" if search.get("stand_in") else ""
    fig, ax = _axes(f"served search, closed-loop: {search.get('objective') or 'concurrency'}{kind}", "served throughput (infer/s)",
                    xlabel="concurrency (requests in flight)", log_x=True)
    chosen, start = search.get("chosen"), search.get("start")
    named = {id(v) for v in sorted((v for v in variants if v["point"] not in (chosen, start)), key=lambda v: -(v.get("throughput") or 0))[:3]}
    top = 0.0
    for v in variants:
        curve = v["curve"]
        xs, ys = [lv["concurrency"] for lv in curve], [lv["throughput"] for lv in curve]
        top = max(top, *ys)
        is_chosen, is_start = v["point"] == chosen, v["point"] == start
        label = (f"published: {short_label(v['point'])}" if is_chosen else f"rules: {short_label(v['point'])}" if is_start
                 else short_label(v["point"]) if id(v) in named else None)
        ax.plot(xs, ys, marker="s" if is_start else "o", markersize=4, linewidth=2.6 if is_chosen else 1.0,
                color="black" if is_chosen else ("grey" if is_start else None), alpha=1.0 if (is_chosen or is_start or label) else 0.35,
                label=label, zorder=5 if is_chosen else 3)
    best = next((v for v in variants if v["point"] == chosen), None)
    if best is not None and best.get("throughput") is not None:
        ax.plot([best.get("concurrency") or 1], [best["throughput"]], linestyle="none", marker="*", markersize=16, color="black", zorder=6)
    from matplotlib.ticker import ScalarFormatter

    ax.xaxis.set_major_formatter(ScalarFormatter())  # 4, 8, 16 requests rather than 2^2, 2^3, 2^4
    ax.set_ylim(0, top * 1.15)
    ax.legend(fontsize="x-small", loc="lower right")
    return fig


def write_served_search_plot(search: dict[str, Any] | None, out_dir: Path) -> Path | None:
    """Draw `served_search_figure` into `out_dir`; None when there is no search, nothing measured, or no matplotlib."""
    if not search or search.get("status") != "searched":
        return None
    return _save(lambda: served_search_figure(search), "served-search", Path(out_dir) / SERVED_SEARCH_FILE)


def capacity_figure(capacity: dict[str, Any]) -> Figure | None:
    """p50 / p95 / p99 latency against the offered rate (open-loop), the latency target a dashed line and the capacity a
    star; None when nothing was measured."""
    curve = sorted(capacity.get("curve") or [], key=lambda lv: lv["offered"])
    if not curve:
        return None
    from optimizer.records.capacity import arrivals_label

    fig, ax = _axes(f"open-loop, {arrivals_label(capacity.get('arrivals', 'poisson'))}: {capacity.get('point') or ''}", "latency (ms)",
                    xlabel="offered rate (requests/s)", log_x=False)
    xs = [lv["offered"] for lv in curve]
    for pct, style in ((50, ":"), (95, "-"), (99, "--")):
        ax.plot(xs, [lv[f"p{pct}_ms"] for lv in curve], linestyle=style, marker="o", markersize=4, label=f"p{pct}")
    budget, pct = capacity.get("latency_budget_ms"), capacity.get("percentile") or 95
    if budget is not None:
        ax.axhline(budget, color="grey", linestyle="--", linewidth=1.0, label=f"target p{pct} <= {budget:g} ms")
    held = capacity.get("rate_per_s")
    at = next((lv for lv in curve if lv["offered"] == held), None)
    if at is not None:
        ax.plot([held], [at[f"p{pct}_ms"] if pct in (50, 90, 95, 99) else at["p95_ms"]], linestyle="none", marker="*", markersize=16,
                color="black", zorder=6, label=f"capacity {held:g}/s")
    ax.set_yscale("log")
    ax.legend(fontsize="x-small", loc="upper left")
    return fig


def write_capacity_plot(capacity: dict[str, Any] | None, out_dir: Path) -> Path | None:
    """Draw `capacity_figure` into `out_dir`; None without a capacity, or without matplotlib."""
    if not capacity:
        return None
    return _save(lambda: capacity_figure(capacity), "capacity", Path(out_dir) / CAPACITY_FILE)


def _save(draw: Callable[[], Figure | None], what: str, path: Path) -> Path | None:
    """Draw a figure and save it at `path`; None when it has nothing to draw, or matplotlib is missing (a warning)."""
    try:
        fig = draw()
    except ImportError as err:
        log.warning("no %s plot: matplotlib cannot be imported (%s); install the report extra: pip install 'aitune-export[report]'", what, err)
        return None
    if fig is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def short_label(point: dict[str, Any]) -> str:
    """A stored OperatingPoint in a few characters, e.g. "max 8 pref[8] 2x1t d0" (d: the queue delay in us)."""
    pref = ",".join(map(str, point.get("preferred") or ())) or "-"
    threads = point.get("threads")
    layout = f"{point.get('instances', 1)}x{threads}t" if threads else f"{point.get('instances', 1)}i"
    return f"max {point.get('max_batch_size')} pref[{pref}] {layout} d{point.get('queue_delay_us')}"


def _axes(title: str, ylabel: str, xlabel: str = "batch size", log_x: bool = True) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def _style(s: Series) -> dict[str, Any]:
    label = s.name + (" (baseline)" if s.baseline else "") + ("" if s.status == "passed" else f" ({s.status})")
    return {"label": label, "marker": "o", "markersize": 4, "linestyle": "--" if s.baseline else "-"}


def _mark(ax: Any, x: float, y: float, chosen: ChosenPoint) -> None:
    ax.plot([x], [y], linestyle="none", marker="*", markersize=16, color="black", zorder=5,
            label=f"published: {chosen.candidate}, max batch {chosen.batch_size}")


def _finish(ax: Any, data: PlotData) -> None:
    from matplotlib.ticker import FixedLocator, ScalarFormatter

    sizes = sorted({b for s in data.series for b in s.batch_sizes} | {b for s in data.series for b, _ in s.over_budget})
    if sizes:
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
