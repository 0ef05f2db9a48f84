"""What the commands print: the lines a person reads after an export, a validation, `backends` and `serve`.

`--json` prints the records themselves; these lines are the short form of the same records.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from optimizer.records.capacity import Capacity
from optimizer.records.served_search import ServedSearch

if TYPE_CHECKING:
    from optimizer.app.export import ExportOutcome
    from optimizer.app.serve import Serving


def print_export(outcome: ExportOutcome) -> None:
    """The selected candidate, the published model and every file written beside it, then the validation when it ran."""
    result = outcome.result
    chosen = result.selected_candidate
    click.echo(f"selected {chosen.name}: {result.selection_reason}")
    click.echo(max_batch_line(result, outcome.published.config))
    click.echo(f"published {outcome.published.model_dir} (version {outcome.published.version})")
    if outcome.published.composing:
        click.echo(f"  an ensemble that takes the forward() names, in front of {', '.join(outcome.published.composing)} "
                   "(the positional model; --io-names positional publishes it alone)")
    if outcome.published.config:
        click.echo(outcome.published.config["batching"]["explanation"])
    if outcome.published.served_search:
        click.echo(served_search_line(outcome.published.served_search))
        if line := capacity_line(outcome.published.served_search.get("capacity")):
            click.echo(line)
    click.echo(f"report {outcome.report_path}")
    if outcome.published.model_analyzer_config:
        click.echo(f"Model Analyzer config: {outcome.published.model_analyzer_config}")
    if outcome.published.perf_analyzer_input:
        click.echo(f"perf_analyzer input data: {outcome.published.perf_analyzer_input} (--input-data)")
    if outcome.published.kserve_manifest:
        click.echo(f"KServe InferenceService: {outcome.published.kserve_manifest}")
    if outcome.validation is not None:
        print_validation(outcome.validation)


def max_batch_line(result, config: dict | None) -> str:
    """The max batch size line of `export`: the in-process decision, and the published max when the served search chose
    another, so the line never contradicts the published config."""
    chosen = result.selected_candidate
    text = chosen.decision.explanation if chosen.decision else f"max_batch_size {result.max_batch_size}"
    published = (config or {}).get("max_batch_size")
    in_process = chosen.decision.max_batch_size if chosen.decision else result.max_batch_size
    if published is None or published == in_process:
        return text
    why = ("the served search measured it best" if published != result.max_batch_size else
           "the rules' max for a backend that computes max_batch_size rows per execution, closest to the best at every load")
    return f"published max_batch_size {published}: {why} (the in-process rule said {in_process}: {text})"


def served_search_line(search: dict[str, Any]) -> str:
    """One line: what the served search chose and measured, for which load, or why it did not run."""
    if search["status"] != "searched":
        return f"served search {search['status']}: {search['reason']}"
    found = ServedSearch.from_json(search)
    chosen, start = found.chosen_variant, next((v for v in found.variants if v.stage == "start"), None)
    label = " (stand-in backend)" if found.stand_in else ""
    if chosen is None or start is None or chosen.throughput is None or start.throughput is None:
        return f"served search: {found.count_text()}"
    pct = found.percentile
    where = " beside other processes' load" if found.beside_load else ""
    return (f"served search for {found.load}: {chosen.point.label} serves {chosen.throughput:.1f}/s, p{pct} "
            f"{chosen.level(chosen.concurrency or 0).latency(pct) if chosen.level(chosen.concurrency or 0) else chosen.p95_ms:.1f} ms "
            f"closed-loop at {chosen.concurrency} clients{where}{label}; the in-process rules' config served {start.throughput:.1f}/s at "
            f"{start.concurrency} clients ({found.count_text()} in {found.seconds:.0f} s; {found.stopped})"
            + (f"; reused from the search measured {found.cached_from}" if found.cached_from else ""))


def capacity_line(capacity: dict[str, Any] | None) -> str:
    """One line: the rate the published config holds open-loop, and the replicas a target rate needs ("" without one)."""
    if not capacity:
        return ""
    cap = Capacity.from_json(capacity)
    line = f"capacity of {cap.point or 'the published config'}: {cap.describe()}"
    if cap.replicas is not None:
        line += (f"; {cap.target_rate:g} requests/s need {cap.replicas} replica{'s' if cap.replicas != 1 else ''} "
                 f"(each planned at {cap.per_replica_target:.1f}/s: {cap.headroom:.0%} headroom)")
    return line


def print_backends(rows: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
    """One line per backend (available, or why not) and per validation tool."""
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = ("available" + (f" ({r['reason']})" if r["reason"] else "")) if r["available"] else f"unavailable: {r['reason']}"
        click.echo(f"{r['name']:<{width}}  {r['platform']:<26} {state}")
    click.echo("validation tools (aitune-export validate):")
    for t in tools:
        click.echo(f"  {t['name']:<14} {'found' if t['found'] else 'not usable'}: {t['path'] + ' - ' if t['path'] else ''}{t['reason']}")


def print_validation(record: Any) -> None:
    """The validation record as a few lines and a perf table (the whole record is in validation.json)."""
    label = " [stand-in backend]" if record.stand_in else ""
    click.echo(f"validation of {record.model} ({record.platform}) on {record.server}: {record.status}{label}")
    if record.served_by:
        click.echo(f"  served by: {record.served_by}")
    for a in record.answers:
        against = "the eager reference" if a.compared_with == "reference" else "the config's shapes and dtypes (no reference)"
        error = f", max abs error {a.max_abs:.3g}" if a.compared_with == "reference" else " (no values compared)"
        state = f"match {against} in {len(a.cases)} case(s){error}" if a.passed else f"FAIL: {a.error}"
        click.echo(f"  answers over {a.protocol}: {state}{label}")
    if record.oversize is not None:
        o = record.oversize
        click.echo(f"  batch {o['batch']} (max_batch_size + 1): " + (f"refused: {o['message']}" if o["refused"] else f"ACCEPTED: {o['note']}"))
    if record.perf and record.perf.get("rows"):
        click.echo(f"  perf_analyzer closed-loop: N clients, each waiting for its answer ({record.perf['settings']['protocol']}, batch "
                   f"{record.perf['settings']['batch_size']} per request){label}" + (f", sending {record.traffic}" if record.traffic else "") + ":")
        click.echo("    clients (N)  infer/s   p50 ms   p95 ms   p99 ms  server batch")
        for r in record.perf["rows"]:
            batch = f"{r['server_batch']:.2f}" if r.get("server_batch") else "-"
            rough = "  rough: never settled" if r["concurrency"] in record.perf.get("unstable", []) else ""
            click.echo(f"    {r['concurrency']:>11}  {r['throughput']:>7.1f}  {r['p50_ms']:>7.1f}  {r['p95_ms']:>7.1f}  {r['p99_ms']:>7.1f}  {batch:>12}{rough}")
        if record.predictions:
            each = ", ".join(f"{p['served']:.1f}/{p['predicted']:.1f} at {p['concurrency']}" for p in record.predictions)
            click.echo(f"  closed-loop: served / predicted at loads the served search did not measure = {record.throughput_ratio:.2f}x ({each}; "
                       f"{record.predicted_by}: {record.predicted_how})")
        elif record.throughput_ratio is not None and not record.predicted_concurrency:  # the served search did not run
            best = max(r["throughput"] for r in record.perf["rows"])
            click.echo(f"  served best {best:.1f} infer/s closed-loop; no served prediction (the served search did not run): in-process "
                       f"{record.predicted_throughput:.1f} samples/s ({record.predicted_by}: {record.predicted_how}) is the model "
                       f"without the server's per-request cost, {record.throughput_ratio:.2f}x of it served")
        elif record.throughput_ratio is not None:
            click.echo(f"  served closed-loop at {record.predicted_concurrency} clients = {record.throughput_ratio:.2f}x the predicted "
                       f"{record.predicted_throughput:.1f} infer/s ({record.predicted_by}: {record.predicted_how})")
        if record.repeatability:
            each = ", ".join(f"{r['ratio']:.2f} at {r['concurrency']} clients ({r['served']:.1f} vs {r['searched']:.1f}/s)" for r in record.repeatability)
            click.echo(f"  repeatability (same config, same load as the served search): {each}")
    if record.open_loop:
        print_open_loop(record.open_loop, label)
    for note in record.notes:
        click.echo(f"  note: {note}")
    click.echo(f"  record {Path(record.output_dir) / 'validation.json'}")


def print_open_loop(section: dict[str, Any], label: str = "") -> None:
    """validate's open-loop check: per offered rate, what was served and whether it was held, then the verdict."""
    budget = (f"p{section['percentile']} <= {section['latency_budget_ms']:g} ms" if section["latency_budget_ms"] is not None
              else "no latency budget: held = served >= 97% of offered")
    click.echo(f"  perf_analyzer open-loop: requests/s offered on a schedule, {section['arrivals_label']} ({section['protocol']}, {budget},"
               f" {section['windows']} windows of {section['window_ms'] / 1000:g} s){label}; {section['source']}"
               + (f"; sending {section['sending']}" if section["sending"] else "") + ":")
    click.echo("    offered/s  served/s   p50 ms   p95 ms   p99 ms  held")
    for lv in section["levels"]:
        held = f"held ({lv['role']})" if lv["held"] else f"NOT HELD ({lv['role']}): {lv['why']}"
        click.echo(f"    {lv['offered']:>9.4g}  {lv['throughput']:>8.1f}  {lv['p50_ms']:>7.1f}  {lv['p95_ms']:>7.1f}  {lv['p99_ms']:>7.1f}  {held}")
    verdict = {"held": "held", "warning": "WARNING", "not held": "NOT HELD"}[section["verdict"]]
    click.echo(f"  open-loop {verdict}: {section['summary']}")
    for note in section.get("notes") or []:
        click.echo(f"  note: {note}")


def print_serving(serving: Serving) -> None:
    """Where `serve` listens, once the server is up (stdout is flushed: a wrapper script waits for these lines)."""
    click.echo(f"tritonserver 2.51 serving {serving.repository} (model control: {serving.model_control_mode})")
    click.echo(f"HTTP  http://{serving.http_url}")
    click.echo(f"gRPC  {serving.grpc_url}")
    for note in serving.notes:
        click.echo(f"note: {note}")
    click.echo("Ctrl-C stops it.")
    sys.stdout.flush()
