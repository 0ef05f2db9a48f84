"""report.md's "Capacity (open-loop)" section: the rate the published config holds within the latency target, the
replicas a target rate needs, and the latency against the offered rate.

A pure function of report.json's `capacity` (records.capacity.Capacity.to_json()) and `published.served_search.open_loop`
(every finalist measured open-loop). Every figure here is open-loop: requests sent on a schedule whatever the answers'
pace, as independent clients send them; the served-search section's figures are closed-loop.
"""

from __future__ import annotations

from typing import Any

from optimizer.records.capacity import Capacity, arrivals_label
from optimizer.report.markdown_tables import ms as _ms
from optimizer.report.markdown_tables import table as _table

_HEADER = ("offered req/s", "served/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "server batch", "held")


def capacity_section(capacity: dict[str, Any] | None, finalists: list[dict[str, Any]] | None = None, plot: str | None = None,
                     stand_in: bool = False) -> str:
    """The "## Capacity (open-loop)" section; "" when the export measured none (no --rate nor --latency-budget-ms)."""
    if not capacity:
        return ""
    cap = Capacity.from_json(capacity)
    kind = " (stand-in backend: the local server's, not the native backend's)" if stand_in else ""
    lines = ["## Capacity (open-loop)", ""]
    lines.append(f"**{cap.describe()}**{kind}, measured on {cap.point or 'the published config'}. Open-loop: requests were sent on a "
                 f"schedule ({arrivals_label(cap.arrivals)}) whatever the answers' pace, as independent clients send them, over "
                 f"{cap.windows} windows a rate ({cap.window_ms / 1000:g} s each at the capacity, longer at lower rates); a rate is held when p{cap.percentile} latency is within the "
                 "target and the server answered at least 97% of what was offered.")
    if cap.replicas is not None:
        lines += ["", f"**Replicas for {cap.target_rate:g} requests/s: {cap.replicas}** = ceil({cap.target_rate:g} / "
                      f"({cap.rate_per_s:g} x (1 - {cap.headroom:g}))), each replica planned at {cap.per_replica_target:.1f} requests/s "
                      f"({cap.headroom:.0%} of its capacity kept free, --headroom). The KServe manifest beside the report takes its replica "
                      "count and its autoscaling target from these figures."]
    if plot:
        lines += ["", f"![latency against offered rate]({plot})"]
    rows = [[f"{lv.offered:g}", f"{lv.throughput:.1f}", _ms(lv.p50_ms), _ms(lv.p90_ms), _ms(lv.p95_ms), _ms(lv.p99_ms),
             f"{lv.server_batch:.2f}" if lv.server_batch else "", "yes" if lv.held else f"no: {lv.why}" if lv.held is False else ""]
            for lv in sorted(cap.curve, key=lambda lv: lv.offered)]
    lines += ["", _table(_HEADER, rows)]
    others = [f for f in finalists or [] if f.get("label") != cap.point]
    if others:
        lines += ["", "Other finalists of the closed-loop pass, measured the same way:", ""]
        lines += [f"- {f.get('label')}: {Capacity.from_json(f['capacity']).describe()}" for f in others]
    return "\n".join(lines)
