"""Throughput and latency versus batch size, one line per candidate, the published point marked; and the
served search's variants, throughput versus latency, the published config marked.

The data is gathered first (`plot_data`, plain records a test can check), then drawn on
matplotlib figures with the Agg canvas (no display, no pyplot global state). matplotlib is
imported only when a figure is drawn: it is the optional `report` extra.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.records.tune_result import TuneResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

PLOT_FILES = {"throughput": "throughput.png", "latency": "latency.png"}
"""Plot kind -> file name, written beside report.json and linked from report.md."""
SERVED_SEARCH_FILE = "served_search.png"
"""The served search's plot (`write_served_search_plot`), drawn from report.json's `published.served_search`."""


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
    """Served throughput versus latency at the search's percentile, one annotated point per measured variant,
    the published config a star and the in-process rules' config a square; None when nothing was measured.

    `search` is report.json's `published.served_search` (ServedSearch.to_json()).
    """
    pct = search.get("percentile") if search.get("percentile") in (50, 95, 99) else 95
    points = [v for v in search.get("variants") or [] if v.get("throughput") is not None and v.get(f"p{pct}_ms") is not None]
    if not points:
        return None
    kind = " (stand-in backend)" if search.get("stand_in") else ""
    fig, ax = _axes(f"served search at concurrency {search.get('concurrency')}{kind}", "served throughput (infer/s)",
                    xlabel=f"p{pct} latency (ms)", log_x=False)
    xs, ys = [v[f"p{pct}_ms"] for v in points], [v["throughput"] for v in points]
    ax.plot(xs, ys, linestyle="none", marker="o", markersize=5, label="variants")
    for i, (v, x, y) in enumerate(sorted(zip(points, xs, ys), key=lambda t: (t[1], t[2]))):  # neighbours' labels alternate above, below
        ax.annotate(short_label(v["point"]), (x, y), textcoords="offset points", xytext=(5, 5 if i % 2 == 0 else -11), fontsize="x-small")
    start = next((v for v in points if v["point"] == search.get("start")), None)
    if start is not None:
        ax.plot([start[f"p{pct}_ms"]], [start["throughput"]], linestyle="none", marker="s", markersize=11, fillstyle="none",
                color="grey", zorder=4, label="in-process rules")
    published = search.get("measured_point") or search.get("chosen")  # on a busy machine: as measured on the free cores
    chosen = next((v for v in points if v["point"] == published and v.get("status") == "measured"), None)
    if chosen is not None:
        ax.plot([chosen[f"p{pct}_ms"]], [chosen["throughput"]], linestyle="none", marker="*", markersize=16, color="black",
                zorder=5, label="published")
    budget = search.get("latency_budget_ms")
    if budget is not None:
        ax.axvline(budget, color="grey", linestyle=":", label=f"budget {budget:g} ms")
    ax.set_xlim(0, max(xs + ([budget] if budget is not None else [])) * 1.4)  # room for the labels right of the points
    ax.set_ylim(0, max(ys) * 1.15)
    ax.legend(fontsize="small", loc="lower left")
    return fig


def write_served_search_plot(search: dict[str, Any] | None, out_dir: Path) -> Path | None:
    """Draw `served_search_figure` into `out_dir`; None when there is no search, nothing measured, or no matplotlib."""
    if not search or search.get("status") != "searched":
        return None
    try:
        fig = served_search_figure(search)
    except ImportError as err:
        log.warning("no served-search plot: matplotlib cannot be imported (%s); install the report extra: pip install 'aitune-export[report]'", err)
        return None
    if fig is None:
        return None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / SERVED_SEARCH_FILE
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
