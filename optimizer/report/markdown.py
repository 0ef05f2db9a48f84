"""report.md: why this backend and this max batch size, for a person, beside report.json and the plots.

`render_markdown` is a pure function of the stored records; `write_report_files` re-renders
everything from a report.json on disk (the pipeline calls it right after writing report.json,
`aitune-export report REPORT.json` calls it later), so a report never needs a re-run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.records.candidate import Candidate
from optimizer.records.measurements import LIMITS
from optimizer.records.tune_result import TuneResult
from optimizer.report.markdown_tables import cell as _cell
from optimizer.report.markdown_tables import ms as _ms
from optimizer.report.markdown_tables import table as _table
from optimizer.report.served_search_section import served_search_section
from optimizer.report.capacity_section import capacity_section

log = logging.getLogger(__name__)

VALIDATION_FILE = "validation.json"
"""Written beside report.json by `aitune-export validate`; rendered when present."""

BUSY_SHARE = 0.2
"""Above this mean share of the CPU used by other processes while measuring, the report warns about noise."""


@dataclass
class RenderedReport:
    """The files a render wrote."""

    markdown: Path
    plots: dict[str, Path] = field(default_factory=dict)


def write_report_files(report_path: Path, out_dir: Path | None = None) -> RenderedReport:
    """Write report.md and the PNG plots from a stored report.json (and validation.json beside it, if any).

    Args:
        report_path: a report.json written by `write_report`.
        out_dir: where the files go; None means beside report.json.
    """
    import json

    from optimizer.records.report_file import read_report
    from optimizer.report.plots import write_capacity_plot, write_plots, write_served_search_plot

    result, _, doc = read_report(report_path)
    out_dir = out_dir or report_path.parent
    validation = None
    vpath = report_path.parent / VALIDATION_FILE
    if vpath.is_file():
        try:
            validation = json.loads(vpath.read_text())
        except ValueError as err:
            log.warning("%s is not JSON (%s); the report leaves validation out", vpath, err)
    plots = write_plots(result, out_dir)
    served = write_served_search_plot((doc.get("published") or {}).get("served_search"), out_dir)
    if served is not None:
        plots["served_search"] = served
    capacity = write_capacity_plot(doc.get("capacity"), out_dir)
    if capacity is not None:
        plots["capacity"] = capacity
    text = render_markdown(result, doc.get("settings", {}), doc.get("published"), validation, {k: p.name for k, p in plots.items()})
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "report.md"
    md.write_text(text)
    return RenderedReport(md, plots)


def render_markdown(
    result: TuneResult,
    settings: dict[str, Any],
    published: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
    plots: dict[str, str] | None = None,
) -> str:
    """The whole report.md.

    Args:
        settings: the `settings` table of report.json (ExportSettings as a dict).
        published: report.json's `published` ({"model_dir", "version", "served_search", ...}); None: nothing was published.
        validation: validation.json as a dict, None when validation did not run; see `validation_section`.
        plots: plot kind ("throughput", "latency", "served_search") -> file name relative to report.md.
    """
    plots = plots or {}
    parts = [
        _summary(result, settings, published),
        _why(result),
        _plots(result, plots),
        _candidates(result),
        precision_section(result),
        _max_batch(result, ((published or {}).get("config") or {}).get("max_batch_size")),
        traffic_section(result.traffic),
        served_search_section((published or {}).get("served_search"), plots.get("served_search")),
        capacity_section(((published or {}).get("served_search") or {}).get("capacity"), ((published or {}).get("served_search") or {}).get("open_loop"),
                         plots.get("capacity"), bool(((published or {}).get("served_search") or {}).get("stand_in"))),
    ]
    if validation is not None:
        parts.append(validation_section(validation))
    parts.append(_triton_release(result))
    parts.append(_environment(result))
    return "\n\n".join(p.rstrip() for p in parts if p) + "\n"


# -- sections ------------------------------------------------------------------------------------

def _summary(result: TuneResult, settings: dict[str, Any], published: dict[str, Any] | None) -> str:
    if result.selected:
        served = ((published or {}).get("config") or {}).get("max_batch_size", result.max_batch_size)  # the served search may move it
        head = f"# {result.model_name}: {result.selected}, max_batch_size {served}"
    else:
        head = f"# {result.model_name}: no candidate can be published"
    lines = [head, ""]
    where = (f"Published to `{published['model_dir']}` (version {published['version']})" if published else "Nothing was published")
    platform = ""
    if result.selected:
        art = result.selected_candidate.artifact
        platform = f" as Triton platform `{art.triton_platform}`" if art and art.triton_platform else ""
    lines.append(f"{where}{platform}." + (f" KServe manifest: `{published['kserve_manifest']}`." if (published or {}).get("kserve_manifest") else ""))
    lines.append(
        f"Strategy `{result.strategy}` ({result.workflow}) on `{result.device}`, eager gate {result.eager_gate}"
        + (f", latency budget p{result.percentile} <= {result.latency_budget_ms:g} ms" if result.latency_budget_ms else "")
        + f"; tuning took {result.tune_seconds:.0f} s."
    )
    sig = result.signature
    tensors = ", ".join(f"`{t['name']}` {t['dtype']} [{'x'.join(t['dims']) or 'scalar'}]" for t in sig.get("inputs", []))
    outs = ", ".join(f"`{t['name']}` {t['dtype']} [{'x'.join(t['dims']) or 'scalar'}]" + (f" (`{t['origin']}`)" if t.get("origin") else "")
                     for t in sig.get("outputs", []))
    lines.append(f"Inputs {tensors}; outputs {outs}" + ("" if sig.get("batching", True) else "; no batching") + ".")
    if settings:
        lines.append("Replay this run with `aitune-export export --config settings.toml` (beside report.json).")
    return "\n".join(lines)


TRAFFIC_ROWS = 12
"""The traffic histogram's rows in report.md (report.json keeps every shape)."""


def traffic_section(traffic: dict[str, Any] | None) -> str:
    """"## Traffic": where the requests came from, their representative shapes and the histogram of their shapes."""
    from optimizer.records.traffic import TrafficSummary

    summary = TrafficSummary.from_json(traffic)
    if summary is None:
        return ""
    lines = ["## Traffic", "", f"Tuned for {_cell(summary.describe())}. In-process profiling measured the median request, the p90 request "
             "alone and whether batches of the largest fit; the served search and `validate` send the requests in their ratios.", ""]
    if summary.is_trace:
        lines += [f"Arrivals: {_cell(summary.describe_trace())}. Open-loop measurements replay this schedule, scaled to the rate "
                  "measured (its bursts kept).", ""]
    rows = [[_cell(label), str(count), f"{100 * count / max(1, summary.requests):.0f}%"] for label, count in summary.histogram[:TRAFFIC_ROWS]]
    if len(summary.histogram) > TRAFFIC_ROWS:
        rest = sum(c for _, c in summary.histogram[TRAFFIC_ROWS:])
        rows.append([f"{len(summary.histogram) - TRAFFIC_ROWS} other shapes", str(rest), f"{100 * rest / max(1, summary.requests):.0f}%"])
    lines.append(_table(["request shape", "requests", "share"], rows))
    return "\n".join(lines)


def _why(result: TuneResult) -> str:
    title = f"## Why {result.selected}" if result.selected else "## Why nothing was selected"
    lines = [title, "", f"- {_cell(result.selection_reason) or 'no reason recorded'}."]
    lines += [f"- Warning: {_cell(w)}" for w in result.warnings]
    busy = _busy_share(result)
    if busy is not None and busy > BUSY_SHARE:
        lines.append(
            f"- Other processes used {100 * busy:.0f}% of the machine's CPU while candidates were measured; "
            "the numbers are noisy, compare them as ratios and re-run on a quiet machine before trusting small differences."
        )
    return "\n".join(lines)


def _plots(result: TuneResult, plots: dict[str, str]) -> str:
    if not plots:
        return ""
    lines = ["## Throughput and latency by batch size", ""]
    if "throughput" in plots:
        lines.append(f"![throughput vs batch size]({plots['throughput']})")
    if "latency" in plots:
        lines.append(f"![p{result.percentile} latency vs batch size]({plots['latency']})")
    lines += ["", "Eager PyTorch is dashed; the star is the published candidate at the published max batch size."]
    return "\n".join(lines)


_CANDIDATE_HEADER = (
    "candidate", "status", "reason", "max abs err", "max rel err",
    "batch 1 p50/p95/p99 ms", "best batch", "throughput/s", "best batch p50/p95/p99 ms", "max batch",
)


def _candidates(result: TuneResult) -> str:
    rows = []
    for cand in ([result.eager] if result.eager else []) + list(result.candidates):
        rows.append(_candidate_row(cand, result))
    return "\n".join(["## Candidates", "", _table(_CANDIDATE_HEADER, rows)])


_PRECISION_HEADER = ["candidate", "precision", "status", "best throughput (/s)", "vs best fp32", "cosine (min)", "max abs error",
                     "top-1 (integer outputs: equal values)", "judged by"]


def precision_section(result: TuneResult) -> str:
    """fp32 beside the reduced-precision candidates (speed and accuracy), what auto left out and why; empty for a
    --precision fp32 run, whose report stays what it was."""
    block = result.precision
    if not block:
        return ""
    fp32 = [c for c in result.candidates if c.passed and (c.artifact.metadata.get("precision", "fp32") if c.artifact else "fp32") == "fp32"]
    best_fp32 = max(fp32, key=lambda c: c.best_throughput, default=None)
    rows = []
    for cand in result.candidates:
        meta = cand.artifact.metadata if cand.artifact is not None else {}
        precision = meta.get("precision") or ("fp32" if "," not in cand.name else cand.name.rsplit(",", 1)[1].rstrip("]"))  # unbuilt: from its name
        acc = cand.correctness.accuracy if cand.correctness is not None else None
        top1 = [o.top1 for o in acc.outputs if o.top1 is not None] if acc is not None else []
        ratio = (f"{cand.best_throughput / best_fp32.best_throughput:.2f}x" if cand.passed and best_fp32 is not None
                 and best_fp32.best_throughput else "")
        name = f"**{cand.name}** (selected)" if cand.name == result.selected else cand.name
        judged = (f"gate (cosine >= {acc.budget.cosine:g}, top-1 >= {acc.budget.top1:g})" if acc is not None and not acc.budget.check
                  else f"--accuracy-check {acc.budget.check} (score {acc.check_score:.6g})" if acc is not None
                  else "--tolerance" if cand.correctness is not None else "")
        rows.append([name, precision + (f" ({meta['numerics_note']})" if meta.get("numerics_note") else ""), cand.status,
                     f"{cand.best_throughput:.1f}" if cand.best_throughput else "", ratio,
                     f"{acc.cosine:.6f}" if acc is not None and any(not o.exact for o in acc.outputs) else "", f"{max(o.max_abs for o in acc.outputs):.3g}" if acc is not None and acc.outputs else "",
                     f"{min(top1):.4f}" if top1 else "", judged])
    lines = ["## Precision", "", f"--precision {block['requested']}: candidates at {', '.join(block['candidates'])}; "
             "bf16 and INT8 candidates are judged by the accuracy gate against fp32 eager (shapes run short, long and back "
             "on one loaded model), fp32 ones by --tolerance. A candidate that failed keeps its figures here.", ""]
    lines += [f"- {note}." for note in block.get("left_out", [])]
    return "\n".join([*lines, "", _table(_PRECISION_HEADER, rows)])


def _candidate_row(cand: Candidate, result: TuneResult) -> list[str]:
    name = cand.name
    if cand.name == result.selected:
        name = f"**{cand.name}** (selected)"
    elif result.eager is cand:
        name = f"{cand.name} (baseline)"
    corr = cand.correctness
    d = cand.decision if cand.decision and cand.decision.profiles else None
    one = d.profile_at(1) if d else None
    best = d.best if d else None
    return [
        name,
        cand.status,
        cand.reason or ("" if cand.status == "passed" else cand.stage),
        f"{corr.max_abs:.1e}" if corr is not None and corr.cases else "",  # a failed report is falsy, but has numbers
        f"{corr.max_rel:.1e}" if corr is not None and corr.cases else "",
        _pcts(one),
        str(best.batch_size) if best else "",
        f"{best.throughput:.1f}" if best else "",
        _pcts(best),
        f"{d.max_batch_size} ({d.decided_by})" if d else "",
    ]


def _max_batch(result: TuneResult, published_max: int | None = None) -> str:
    if not result.selected:
        return ""
    cand = result.selected_candidate
    d = cand.decision
    if d is None:
        return ""
    lines = [f"## Max batch size: {result.max_batch_size}", ""]
    if published_max is not None and published_max != result.max_batch_size:
        lines.append(f"- Published with max_batch_size {published_max}: the served search measured it best (see below); "
                     f"the in-process rule said {result.max_batch_size}.")
    lines.append(f"- Decided by **{d.decided_by}**: {LIMITS.get(d.decided_by, d.decided_by)}.")
    lines.append(f"- Throughput peak at batch {d.peak or d.best_batch} (the smallest batch within the measured noise of the best); "
                 f"knee at batch {d.knee}; best throughput at batch {d.best_batch}.")
    if d.measured_max:
        lines.append(f"- Measured on 1/{d.scaled_by:g} of the cores, with as many threads, because other processes kept the rest busy: "
                     f"the measured max {d.measured_max} is scaled x{d.scaled_by:g} to {d.max_batch_size}, so each thread gets the same "
                     "share of a batch on every core (fewer threads flatten the throughput curve).")
    if d.largest_fit > (d.measured_max or result.max_batch_size):
        lines.append(f"- {d.fit_text[0].upper()}{d.fit_text[1:]}; in-process, past the peak a batch serves less at a higher latency"
                     + (" (the served search may try the larger ones: the server's per-request cost can favour them)." if d.fit_checked else "."))
    if d.ceiling is not None:
        lines.append(f"- Capacity ceiling: batch {d.ceiling} is the largest that fit" + (f"; batch {d.first_failure} did not ({_cell(d.failure)})" if d.first_failure else "") + ".")
    elif cand.ceiling_estimate is not None:
        lines.append(f"- Capacity ceiling not reached; estimated at about batch {cand.ceiling_estimate} from the growth of peak memory under the memory budget.")
    else:
        lines.append("- Capacity ceiling not reached (no allocation failed).")
    if d.decided_by == "latency_budget" and d.first_failure:
        lines.append(f"- Batch {d.first_failure} exceeded the p{result.percentile} latency budget of {result.latency_budget_ms:g} ms.")
    lines.append(f"- {_cell(d.explanation)}.")
    retaken = sum(p.retakes for c in result.candidates if c.decision for p in c.decision.profiles)
    if retaken:
        lines.append(f"- {retaken} measurement(s) across the candidates were taken again because other processes' load rose "
                     "while they were timed (at most 2 per batch size, each after waiting up to 3 s for that load to fall; the least disturbed one is kept).")
    lines += ["", f"Measurements of {cand.name}:", ""]
    header = ("batch", "throughput/s", "p50 ms", "p95 ms", "p99 ms", "stable", "cv", "others' CPU", "peak RSS MiB")
    rows = []
    for p in sorted(d.profiles + d.over_budget, key=lambda p: p.batch_size):
        mark = ""
        if p.batch_size == (d.measured_max or result.max_batch_size):
            mark = " (max, before scaling)" if d.measured_max else " (published max)"
        elif p in d.over_budget:
            mark = " (over budget)"
        rows.append([f"{p.batch_size}{mark}", f"{p.throughput:.1f}", _ms(p.p50_ms), _ms(p.p95_ms), _ms(p.p99_ms),
                     "yes" if p.stable else "no", f"{p.cv:.2f}" if p.cv >= 0 else "n/a", f"{100 * p.others_cpu_share:.0f}%", f"{p.peak_rss_mb:.0f}"])
    lines.append(_table(header, rows))
    return "\n".join(lines)


def validation_section(validation: dict[str, Any]) -> str:
    """What Triton itself said about the published model, beside what tuning predicted.

    Reads validation.json as optimizer/triton/measure/validation/record.py writes it (ValidationRecord.to_json()):
    status and reason, loaded, stand_in / served_by, answers (one check per protocol: protocol, passed,
    max_abs, max_rel, error), oversize, perf (rows: concurrency, throughput, p95_ms, p99_ms, and the
    server's inference/execution counts), server_batch, predicted_throughput and throughput_ratio.
    """
    lines = ["## Validation in Triton", ""]
    status = validation.get("status", "")
    if status:
        lines.append(f"- Result: **{status}**" + (f" ({_cell(str(validation['reason']))})" if validation.get("reason") else "") + ".")
    if validation.get("loaded") is not None:
        how = f" by {validation.get('served_by') or 'a stand-in Python backend'}" if validation["loaded"] and validation.get("stand_in") else ""
        lines.append(f"- Loaded in tritonserver: {'yes' if validation['loaded'] else 'no'}{how}.")
    for check in validation.get("answers") or []:
        verdict = "correct" if check.get("passed") else "WRONG"
        detail = check.get("error") or f"max abs {_num(check.get('max_abs', 0.0))}, max rel {_num(check.get('max_rel', 0.0))}"
        lines.append(f"- Answers over {check.get('protocol', '?')}: {verdict} ({_cell(str(detail))}).")
    oversize = validation.get("oversize")
    if isinstance(oversize, dict) and "refused" in oversize:
        lines.append(f"- A batch above max_batch_size: {'refused' if oversize['refused'] else 'ACCEPTED'}.")
    predicted = validation.get("predicted_throughput")
    if validation.get("predictions"):
        each = ", ".join(f"{float(p['served']):.1f} vs {float(p['predicted']):.1f} at concurrency {p['concurrency']}" for p in validation["predictions"])
        lines.append(f"- Served / predicted at the loads the served search did not measure: {float(validation['throughput_ratio']):.2f} ({each}).")
    elif predicted is not None:
        lines.append(f"- Predicted by tuning: {float(predicted):.1f} infer/s"
                     + (f"; best served / predicted: {float(validation['throughput_ratio']):.2f}" if validation.get("throughput_ratio") else "") + ".")
    if validation.get("repeatability"):
        each = ", ".join(f"{float(r['ratio']):.2f} at concurrency {r['concurrency']}" for r in validation["repeatability"])
        lines.append(f"- Repeatability (the same config at a load the served search measured, served again / searched): {each}.")
    if validation.get("server_batch"):
        lines.append(f"- Batch size the server formed (inferences / executions): {float(validation['server_batch']):.2f}.")
    rows = (validation.get("perf") or {}).get("rows") or []
    if rows:
        header = ["concurrency", "perf_analyzer infer/s", "p95 ms", "p99 ms", "server batch"] + (["vs predicted"] if predicted else [])
        table = []
        for row in rows:
            thr = float(row.get("throughput", 0.0))
            inf, ex = row.get("inference_count"), row.get("execution_count")
            cells = [str(row.get("concurrency", "")), f"{thr:.1f}", _ms(row.get("p95_ms")), _ms(row.get("p99_ms")),
                     f"{inf / ex:.2f}" if inf and ex else ""]
            if predicted:
                cells.append(f"{thr / float(predicted):.2f}x")
            table.append(cells)
        lines += ["", _table(header, table)]
    return "\n".join(lines)


def _triton_release(result: TuneResult) -> str:
    """The target release, and what was checked of the published candidate against it (task/release_gate.py)."""
    block = result.triton_release
    if not block:
        return ""
    lines = [f"## Target: Triton {block['release']}", "", f"- {_cell(block['summary'])}."]
    if block.get("allow_version_mismatch"):
        lines.append("- `--allow-version-mismatch` was given: mismatches below were published anyway (see the warnings above).")
    skipped = [c.name for c in result.candidates if c.stage == "release"]
    if skipped:
        lines.append(f"- Skipped because this release cannot load them (the reason is in the candidates table): {', '.join(skipped)}.")
    chosen = result.selected_candidate.backend if result.selected else None
    rows = [[c["fact"], c["local"], c["release"], c["verdict"], c["note"] or c["problem"]]
            for c in block.get("checks", []) if c["backend"] == chosen]
    if rows:
        lines += ["", f"Checks of {result.selected} against the release:", "",
                  _table(("fact", "here", "in the release", "verdict", "note"), rows)]
    return "\n".join(lines)


def _environment(result: TuneResult) -> str:
    env = result.environment or {}
    libs = ", ".join(f"{k} {v}" for k, v in sorted((env.get("libraries") or {}).items()))
    lines = ["## Environment", ""]
    lines.append(f"- {env.get('processor', '?')}, {env.get('cpu_cores', '?')} cores, {env.get('platform', '?')}.")
    lines.append(f"- Python {env.get('python', '?')}, aitune-export {env.get('aitune_export', '?')}" + (f", {libs}" if libs else "") + ".")
    return "\n".join(lines)


# -- helpers -------------------------------------------------------------------------------------

def _busy_share(result: TuneResult) -> float | None:
    shares = [p.others_cpu_share for c in [result.eager, *result.candidates] if c and c.decision for p in c.decision.profiles]
    return sum(shares) / len(shares) if shares else None


def _pcts(p: Any) -> str:
    return f"{_ms(p.p50_ms)} / {_ms(p.p95_ms)} / {_ms(p.p99_ms)}" if p else ""



def _num(value: Any) -> str:
    return f"{value:.2g}" if isinstance(value, float) else str(value)

