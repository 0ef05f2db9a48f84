"""report.md's "Served search" section: what the local tritonserver measured and which config was published.

A pure function of report.json's `published.served_search` (ServedSearch.to_json(), see
optimizer/records/served_search.py): a few sentences on the load, the backend that served it
(every served number is labelled stand-in or native), the request mix, the search's length and end,
the published point against the in-process rules' point and the prediction; then one table row per
variant in measurement order, the published row marked. Skipped or off: one line with the reason.

The table helpers are the ones markdown.py uses too (markdown_tables.py).
"""

from __future__ import annotations

from typing import Any

from optimizer.records.served_search import OBJECTIVE_SENTENCE, ServedSearch, point_label
from optimizer.report.markdown_tables import cell as _cell
from optimizer.report.markdown_tables import ms as _ms
from optimizer.report.markdown_tables import table as _table

RULES_STAND = "the in-process rules stand"

_HEADER = ("stage", "point", "differs from published", "at concurrency (closed-loop)", "throughput/s", "p50 ms", "p95 ms", "p99 ms", "server batch",
           "curve (concurrency: infer/s)", "status")


def served_search_section(search: dict[str, Any] | None, plot: str | None = None) -> str:
    """The "## Served search" section; "" when the report has no served search (an older report).

    Args:
        search: report.json's `published.served_search`.
        plot: the served-search plot's file name relative to report.md, linked under the sentences when given.
    """
    if not search:
        return ""
    lines = ["## Served search", ""]
    status = search.get("status", "")
    if status != "searched":
        reason = str(search.get("reason") or "no reason recorded")
        if RULES_STAND not in reason:
            reason += f"; {RULES_STAND}"
        lines.append(f"{'Off' if status == 'off' else 'Skipped'}: {_cell(reason)}.")
        return "\n".join(lines)
    lines.append(_story(search))
    if plot:
        lines += ["", f"![served throughput vs p{_percentile(search)} latency]({plot})", "",
                  "The star is the published config; the square is the in-process rules' config."]
    lines += ["", _table(_header(search), [_row(v, search) for v in search.get("variants") or []])]
    return "\n".join(lines)


def _story(search: dict[str, Any]) -> str:
    """The sentences above the table."""
    kind = _kind(search)
    pct = _percentile(search)
    variants = search.get("variants") or []
    load = f"Chosen for {_cell(search['load'])}." if search.get("load") else ""
    where = (f" Every figure in this section is closed-loop: N clients that each wait for an answer (perf_analyzer's concurrency mode), "
             "so no more than N requests ever queue; the capacity below is open-loop.") if search.get("capacity") else ""
    where += f" The published variant was scored at concurrency {search.get('concurrency')} ({_cell(search.get('concurrency_source') or 'source not recorded')})"
    budget = search.get("latency_budget_ms")
    where += f", within a p{pct} latency budget of {float(budget):g} ms" if budget is not None else ""
    where += f", on {_cell(search['request_mix'])}." if search.get("request_mix") else "."
    served = f" Served by the {_cell(search.get('served_by') or f'{kind} backend')}"
    served += "; every served number here is the stand-in's, not the native backend's." if search.get("stand_in") else " (native)."
    length = f" {ServedSearch.from_json(search).count_text()} in {float(search.get('seconds') or 0.0):.0f} s (budget {float(search.get('budget_s') or 0.0):g} s)"
    length += f"; stopped: {_cell(search['stopped'])}." if search.get("stopped") else "."
    if search.get("cached_from"):
        length += (f" Reused from the search measured {_cell(search['cached_from'])} (an identical earlier run: same artifact, load, "
                   "budget, server and machine; --no-cache measures again).")
    first = load + where + served + length
    chosen, start = _label(search.get("chosen")), _label(search.get("start"))
    chosen_v, start_v = _chosen_variant(search), next((v for v in variants if v.get("stage") == "start"), None)
    if search.get("chosen") == search.get("start"):
        second = f"Published **{chosen}**, the in-process rules' config: no variant measured served more"
        second += f" ({_served(chosen_v, pct, kind)})" if chosen_v else ""
    else:
        second = f"Published **{chosen}**" + (f" ({_served(chosen_v, pct, kind)})" if chosen_v else "")
        second += f" instead of the in-process rules' {start}" + (f" ({_served(start_v, pct, kind)})" if start_v else "")
    second += "."
    if search.get("settled"):
        second += f" Close call: {_cell(search['settled'])}."
    prediction = []
    if search.get("predicted_throughput") is not None:
        prediction.append(f"{float(search['predicted_throughput']):.1f} infer/s served ({kind}) closed-loop at concurrency {search.get('concurrency')}")
    if search.get("in_process_throughput") is not None:
        batch = f" at the server-formed batch {float(chosen_v['server_batch']):.2f}" if chosen_v and chosen_v.get("server_batch") else " at the server-formed batch"
        prediction.append(f"{float(search['in_process_throughput']):.1f} samples/s in-process{batch}")
    if search.get("per_request_ms") is not None:
        prediction.append(f"the server's own cost {float(search['per_request_ms']):.3f} ms per request ({kind})")
    third = f" Prediction: {', '.join(prediction)}." if prediction else ""
    third += _lone_request(search, variants, pct, kind)
    share = search.get("measured_on")
    if share and len(share.get("cores") or []) < len(share.get("available") or []):
        waited = f" after waiting {float(search['waited_s']):g} s for them (--wait-for-cores)" if search.get("waited_s") else ""
        third += (f" Other processes kept {float(share['others_busy']):.1f} of {len(share['available'])} cores busy{waited}; the server "
                  f"ran on every core beside them, as it will be deployed, and every variant was measured beside that load: **{chosen}** is "
                  "published as measured; its throughputs are below what an idle machine gives, and a quiet export can choose otherwise.")
        if search.get("held_layout"):
            third += f" {search['held_layout'][0].upper()}{search['held_layout'][1:]}."
    if search.get("remeasured"):
        extra = f" ({float(search['retried_s']):g} s with the waits, added to the time budget)" if search.get("retried_s") else ""
        third += (f" Other processes' load rose while {search['remeasured']} measurement(s) ran; each was taken again once it fell "
                  f"back{extra}, and the least disturbed one counts (report.json keeps others' load, in cores, beside each measurement).")
    fourth = ""
    if search.get("objective") == "any-load":
        fourth += f" {OBJECTIVE_SENTENCE}"
    if search.get("kinds"):
        fourth += f" Backends: {_cell(search['kinds'])}."
    if search.get("candidate"):
        fourth += f" The published variant serves **{_cell(search['candidate'])}**, measured better here than the in-process pick."
    padding = search.get("client_padding")
    if padding:
        if padding.get("advised"):
            fourth += (f" **Clients pad** {', '.join(padding.get('axes') or [])} with zeros to the next of {', '.join(map(str, padding.get('edges') or []))}: "
                       f"{_cell(padding.get('why') or '')}. The published variant was measured with padded requests, and `validate` sends them.")
        else:
            fourth += f" No client padding is advised: {_cell(padding.get('why') or 'not tried')}."
    return f"{first} {second}{third}{fourth}"


def _lone_request(search: dict[str, Any], variants: list[dict[str, Any]], pct: int, kind: str) -> str:
    """What one request at a time pays when the published config has a queue delay: the batcher holds it the whole delay
    for a batch that cannot fill, a cost the loads the choice was made at never show (with no load given they start at
    4). Why: a lone request's latency is then about the delay itself, which can be many times the model's compute and
    would otherwise surprise whoever serves few clients."""
    chosen = search.get("chosen") or {}
    base = next((v for v in variants if v.get("stage") == "base" and v.get("point") == chosen), None)
    delay = int(chosen.get("queue_delay_us") or 0)
    level = next((lv for lv in (base or {}).get("curve") or [] if lv.get("concurrency") == 1), None)
    if not delay or level is None:
        return ""
    latency = level.get(f"p{pct}_ms")
    return (f" One request at a time waits the {delay} us queue delay for a batch that cannot fill: {float(level['throughput']):.1f} infer/s"
            + (f", p{pct} {float(latency):.2f} ms" if latency is not None else "") + f" ({kind}); with fewer requests in flight than the max batch, every batch waits it out.")


def _header(search: dict[str, Any]) -> list[str]:
    kind = _kind(search)
    return [h if h in ("stage", "point", "differs from published", "at concurrency", "status") else f"{h} ({kind})" for h in _HEADER]


def _row(v: dict[str, Any], search: dict[str, Any]) -> list[str]:
    mark = "padded" if (search.get("client_padding") or {}).get("advised") else ""
    published = v.get("point") == search.get("chosen") and v.get("status") == "measured" and (v.get("traffic") or "") == mark
    label = v.get("label") or _label(v.get("point"))
    point = f"**{label}** (published)" if published else label
    differs = "published" if published else (", ".join(f"{k} {_value(a)} (published {_value(b)})" for k, (a, b) in (v.get("differs") or {}).items()) or "same as published")
    status = v.get("status", "")
    if v.get("reason"):
        status += f": {v['reason']}"
    thr = v.get("throughput")
    curve = ", ".join(f"{lv['concurrency']}: {float(lv['throughput']):.0f}" for lv in v.get("curve") or [])
    return [v.get("stage", ""), point, differs, str(v.get("concurrency") or ""), f"{float(thr):.1f}" if thr is not None else "",
            _ms(v.get("p50_ms")), _ms(v.get("p95_ms")), _ms(v.get("p99_ms")), f"{float(v['server_batch']):.2f}" if v.get("server_batch") else "",
            curve, status]


# -- helpers -------------------------------------------------------------------------------------

def _chosen_variant(search: dict[str, Any]) -> dict[str, Any] | None:
    point = search.get("chosen")
    mark = "padded" if (search.get("client_padding") or {}).get("advised") else ""
    return next((v for v in reversed(search.get("variants") or []) if v.get("point") == point and v.get("status") == "measured"
                 and v.get("stage") != "base" and (v.get("traffic") or "") == mark), None)


def _kind(search: dict[str, Any]) -> str:
    return "stand-in" if search.get("stand_in") else "native"


def _percentile(search: dict[str, Any]) -> int:
    pct = search.get("percentile") or 95
    return pct if pct in (50, 90, 95, 99) else 95


def _served(v: dict[str, Any], pct: int, kind: str) -> str:
    if v.get("throughput") is None:
        return f"{v.get('status', '')}"
    lat = next((lv.get(f"p{pct}_ms") for lv in v.get("curve") or [] if lv.get("concurrency") == v.get("concurrency")), v.get(f"p{pct}_ms"))
    return f"{float(v['throughput']):.1f}/s at p{pct} {_ms(lat)} ms closed-loop at concurrency {v.get('concurrency')}, {kind}"


def _label(point: dict[str, Any] | None) -> str:
    """OperatingPoint.label of a stored point (the same words the table and the plot use)."""
    return point_label(point)


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return "default" if value is None else str(value)


