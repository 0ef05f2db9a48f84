"""Throughput and latency versus batch size, one line per candidate, the published point marked.

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
            point = cand.decision.profile_at(max(result.max_batch_size, 1)) or cand.decision.best
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


def _axes(title: str, ylabel: str) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
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
