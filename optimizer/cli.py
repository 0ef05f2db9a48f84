"""The command line: click commands only (parse -> call the API -> print).

Options of `export` are generated from ExportSettings (settings.py), so a flag, a settings-file
key and an API field are one and the same thing.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import click

from optimizer import __version__
from optimizer.errors import Interrupted, OptimizerError
from optimizer.events import Event
from optimizer.settings import ExportSettings, KEYS, load_settings_file, settings_from

log = logging.getLogger("optimizer")


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * verbosity
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("optimizer")
    root.handlers[:] = [handler]
    root.setLevel(max(level, logging.DEBUG))


def _fail(err: OptimizerError) -> None:
    click.echo(f"error: {err}", err=True)
    sys.exit(err.exit_code)


def _run_guarded(fn: Callable[[], Any]) -> Any:
    """Run an API call: user errors become one line and their exit status; Ctrl-C/SIGTERM stop children."""
    from optimizer.task.isolation import stop_all_children

    def on_term(signum, frame):  # SIGTERM behaves like Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return fn()
    except OptimizerError as err:
        _fail(err)
    except KeyboardInterrupt:
        stop_all_children()
        _fail(Interrupted("interrupted; candidate processes were stopped and the repository was left as it was."))
    finally:
        signal.signal(signal.SIGTERM, previous)


class PlainProgress:
    """Progress as plain start/finish lines on stderr (a terminal gets the same, minus nothing: no control characters)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self, e: Event) -> None:
        if self.quiet or e.state == "progress":
            return
        who = f"{e.candidate} | " if e.candidate else ""
        count = f" [{e.done}/{e.total}]" if e.total else ""
        click.echo(f"{e.phase:<11} {e.state:<7} {who}{e.message}{count}".rstrip(), err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="aitune-export")
@click.option("-v", "--verbose", count=True, help="More log output (repeat for debug).")
@click.option("-q", "--quiet", count=True, help="Less output: no progress lines.")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: int) -> None:
    """Tune a PyTorch model over inference backends and publish a Triton model repository."""
    _configure_logging(verbose - quiet)
    ctx.obj = {"quiet": quiet > 0}


def _settings_options(fn: Callable) -> Callable:
    """Add one click option per ExportSettings field (except MODEL, which is an argument)."""
    for f in reversed(fields(ExportSettings)):
        meta = f.metadata
        if meta["flag"] == "MODEL":
            continue
        kwargs: dict[str, Any] = {"help": meta["help"], "default": None}
        decl = [meta["flag"]]
        if meta["secondary"]:
            decl = [f"{meta['flag']}/{meta['secondary']}"]
        if meta["multiple"]:
            kwargs["multiple"] = True
            kwargs["default"] = None
        if meta["choices"]:
            kwargs["type"] = click.Choice(meta["choices"])
        elif f.type in ("float | None", "float"):
            kwargs["type"] = float
        elif f.type in ("int | None", "int"):
            kwargs["type"] = click.IntRange(min=0)
        if meta["metavar"]:
            kwargs["metavar"] = meta["metavar"]
        default = f.default if f.default is not f.default_factory else None  # type: ignore[comparison-overlap]
        if not meta["multiple"] and default not in (None,) and not meta["secondary"]:
            kwargs["help"] += f"  [default: {default}]"
        elif meta["secondary"]:
            kwargs["help"] += f"  [default: {meta['flag'] if f.default else meta['secondary']}]"
        fn = click.option(*decl, f.name, **kwargs)(fn)
    return fn


def settings_from_cli(model: str | None, config: str | None, options: dict[str, Any]) -> ExportSettings:
    """Settings file first, then command-line flags on top (only flags the user actually gave)."""
    values: dict[str, Any] = load_settings_file(Path(config)) if config else {}
    for name, value in options.items():
        if value is None or value == ():
            continue
        values[name] = list(value) if isinstance(value, tuple) else value
    if model:
        values["model"] = model
    return settings_from(values)


@main.command()
@click.argument("model", required=False)
@click.option("--config", type=click.Path(dir_okay=False), help="A TOML settings file; its keys are these long option names (flags given here win).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (the report) on stdout.")
@_settings_options
@click.pass_context
def export(ctx: click.Context, model: str | None, config: str | None, as_json: bool, **options: Any) -> None:
    """Tune MODEL over candidate backends and publish the winner into a Triton model repository.

    MODEL is package.module:callable, path/to/file.py:callable, a TorchScript .pt, a torch.export .pt2
    or an .onnx file. Without MODEL the bundled example CNN is used.
    """
    from optimizer.export import export as run_export

    settings = _run_guarded(lambda: settings_from_cli(model, config, options))
    outcome = _run_guarded(lambda: run_export(settings, on_event=PlainProgress(ctx.obj["quiet"] or as_json)))
    result = outcome.result
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        click.echo(outcome.report_path.read_text())
        if outcome.validation is not None:  # validation.json holds the record; the exit status still says it
            _run_guarded(outcome.validation.raise_for_status)
        return
    chosen = result.selected_candidate
    click.echo(f"selected {chosen.name}: {result.selection_reason}")
    click.echo(chosen.decision.explanation if chosen.decision else f"max_batch_size {result.max_batch_size}")
    click.echo(f"published {outcome.published.model_dir} (version {outcome.published.version})")
    click.echo(f"report {outcome.report_path}")
    if outcome.validation is not None:
        _print_validation(outcome.validation)
        _run_guarded(outcome.validation.raise_for_status)


@main.command()
@click.option("--device", default="cpu", show_default=True, help="Device to check availability on: cpu or cuda[:N].")
@click.option("--check-imports/--no-check-imports", default=False, show_default=True,
              help="Also import the slow-to-import libraries (torch) instead of only finding them.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def backends(device: str, check_imports: bool, as_json: bool) -> None:
    """List every backend and whether it can run here (with the reason when it cannot)."""
    from optimizer.backend import BACKENDS

    rows = []
    for name, cls in BACKENDS.items():
        b = cls()
        av = b.availability(device, quick=not check_imports)
        rows.append({"name": name, "platform": b.triton_platform or "(baseline, not published)", "available": av.ok, "reason": av.reason})
    from optimizer.triton.perf_analyzer import perf_analyzer_status
    from optimizer.triton.server import tritonserver_status

    tools = [tritonserver_status(), perf_analyzer_status()]
    if as_json:
        click.echo(json.dumps({"device": device, "backends": rows, "tools": tools}, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = ("available" + (f" ({r['reason']})" if r["reason"] else "")) if r["available"] else f"unavailable: {r['reason']}"
        click.echo(f"{r['name']:<{width}}  {r['platform']:<26} {state}")
    click.echo("validation tools (aitune-export validate):")
    for t in tools:
        click.echo(f"  {t['name']:<14} {'found' if t['found'] else 'not usable'}: {t['path'] + ' - ' if t['path'] else ''}{t['reason']}")


@main.command()
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("--repository", help="Publish into this repository instead of the one in the report.")
@click.option("--name", help="Model name (default: the one in the report).")
@click.option("--version", type=click.IntRange(min=1), help="Add this version to an existing model.")
@click.option("--overwrite/--no-overwrite", default=None, help="Replace an existing model of the same name.")
@click.option("--template-dir", type=click.Path(file_okay=False), help="Templates overriding the packaged ones.")
def publish(report: str, repository: str | None, name: str | None, version: int | None, overwrite: bool | None, template_dir: str | None) -> None:
    """Re-emit a repository from a finished run's REPORT (report.json) without re-tuning."""
    from optimizer.report.json_report import read_report
    from optimizer.triton.publish import PublishOptions, publish as do_publish

    def run():
        result, settings, _ = read_report(Path(report))
        options = PublishOptions(
            Path(repository or settings.repository),
            name or settings.name or result.model_name,
            version,
            bool(overwrite),
            settings.warmup,
            Path(template_dir or settings.template_dir) if (template_dir or settings.template_dir) else None,
        )
        return do_publish(result, options)

    published = _run_guarded(run)
    click.echo(f"published {published.model_dir} (version {published.version})")


@main.command()
@click.argument("repo", type=click.Path())
@click.option("--model", metavar="NAME", help="The model to validate (default: the only model in REPO).")
@click.option("--url", metavar="HOST:PORT", help="Validate against this running Triton (its port speaks --protocol) instead of starting one.")
@click.option("--local", is_flag=True, help="Start a local tritonserver on REPO (the default when --url is not given).")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True,
              help="Protocol perf_analyzer uses (and, with --url, the answer check); a local server is checked over both.")
@click.option("--concurrency", default="1:8", show_default=True, metavar="START:END[:STEP]", help="perf_analyzer's concurrency sweep.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Folder for validation.json; its report.json (the export's) supplies samples and the prediction "
                   "(default: the export's report folder, else aitune-reports/NAME beside REPO).")
@click.option("--json", "as_json", is_flag=True, help="Print the validation record (validation.json) on stdout.")
@click.pass_context
def validate(ctx: click.Context, repo: str, model: str | None, url: str | None, local: bool, protocol: str, concurrency: str,
             report_dir: str | None, as_json: bool) -> None:
    """Load REPO's model into a real Triton, check its answers over HTTP and gRPC and measure it with perf_analyzer.

    Exit status 0 when the model loads, answers like the eager reference and perf_analyzer measured it;
    1 when a check fails (or the model cannot be validated here); 2 for bad usage.
    """
    from optimizer.errors import SettingsError
    from optimizer.triton.validate import validate as run_validate

    if url and local:
        _fail(SettingsError("give either --url HOST:PORT (a running server) or --local (start one), not both."))
    record = _run_guarded(lambda: run_validate(Path(repo), model, url=url, protocol=protocol, concurrency=concurrency,
                                               report_dir=Path(report_dir) if report_dir else None,
                                               on_event=PlainProgress(ctx.obj["quiet"] or as_json)))
    if as_json:
        click.echo(json.dumps(record.to_json(), indent=2, default=str))
    else:
        _print_validation(record)
    _run_guarded(record.raise_for_status)


def _print_validation(record: Any) -> None:
    """The validation record as a few lines and a perf table (the whole record is in validation.json)."""
    label = " [stand-in backend]" if record.stand_in else ""
    click.echo(f"validation of {record.model} ({record.platform}) on {record.server}: {record.status}{label}")
    if record.served_by:
        click.echo(f"  served by: {record.served_by}")
    for a in record.answers:
        against = "the eager reference" if a.compared_with == "reference" else "the config's shapes and dtypes (no reference)"
        state = f"match {against} in {len(a.cases)} case(s), max abs error {a.max_abs:.3g}" if a.passed else f"FAIL: {a.error}"
        click.echo(f"  answers over {a.protocol}: {state}{label}")
    if record.oversize is not None:
        o = record.oversize
        click.echo(f"  batch {o['batch']} (max_batch_size + 1): " + (f"refused: {o['message']}" if o["refused"] else f"ACCEPTED: {o['note']}"))
    if record.perf and record.perf.get("rows"):
        click.echo(f"  perf_analyzer ({record.perf['settings']['protocol']}, batch {record.perf['settings']['batch_size']} per request){label}:")
        click.echo("    concurrency  infer/s   p50 ms   p95 ms   p99 ms  server batch")
        for r in record.perf["rows"]:
            batch = f"{r['server_batch']:.2f}" if r.get("server_batch") else "-"
            click.echo(f"    {r['concurrency']:>11}  {r['throughput']:>7.1f}  {r['p50_ms']:>7.1f}  {r['p95_ms']:>7.1f}  {r['p99_ms']:>7.1f}  {batch:>12}")
        if record.throughput_ratio is not None:
            click.echo(f"  best {record.perf['best_throughput']:.1f} infer/s = {record.throughput_ratio:.2f}x the predicted "
                       f"{record.predicted_throughput:.1f} infer/s ({record.predicted_by} at batch {record.predicted_batch}, in-process)")
    for note in record.notes:
        click.echo(f"  note: {note}")
    click.echo(f"  record {Path(record.output_dir) / 'validation.json'}")


def run() -> None:
    """Console entry point (kept separate so `main` stays a click group for tests)."""
    main()


if __name__ == "__main__":
    main()
