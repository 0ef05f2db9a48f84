"""The command line: click commands only (parse -> call the API -> print with output.py).

Options of `export` are generated from ExportSettings (settings.py), so a flag, a settings-file
key and an API field are one and the same thing. The work behind each command is one call into app/.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import click

from optimizer._version import __version__
from optimizer.errors import Interrupted, OptimizerError
from optimizer.cli.output import print_backends, print_export, print_validation
from optimizer.settings import ExportSettings, load_settings_file, settings_from
from optimizer.vocab import PRECISIONS, Device

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


VERBOSE_HELP = "More log output (repeat for debug); progress becomes plain lines."
QUIET_HELP = "Less output: -q shows only finished steps as plain lines, -qq no progress."


def _more_or_less_output(ctx: click.Context, param: click.Parameter, count: int) -> None:
    """-v / -q given after the subcommand count with those given before it (`aitune-export export -q` works too)."""
    if not count or ctx.obj is None:  # nothing given, or parsed without the group running (the docs test)
        return
    ctx.obj["verbosity"] += count if param.name == "verbose" else -count
    ctx.obj["quiet"] = ctx.obj["quiet"] or param.name == "quiet"
    _configure_logging(ctx.obj["verbosity"])


class _CommandGroup(click.Group):
    """The group whose every command also takes -v / -q, so they may stand before or after the subcommand."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params += [click.Option(["-v", "--verbose"], count=True, expose_value=False, callback=_more_or_less_output, help=VERBOSE_HELP),
                       click.Option(["-q", "--quiet"], count=True, expose_value=False, callback=_more_or_less_output, help=QUIET_HELP)]
        super().add_command(cmd, name)


@click.group(cls=_CommandGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="aitune-export")
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
@click.option("-q", "--quiet", count=True, help=QUIET_HELP)
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: int) -> None:
    """Tune a PyTorch model over inference backends and publish a Triton model repository."""
    _configure_logging(verbose - quiet)
    ctx.obj = {"quiet": quiet > 0, "verbosity": verbose - quiet}


def _settings_options(fn: Callable, groups: tuple[str, ...] = ()) -> Callable:
    """Add one click option per ExportSettings field (except MODEL, which is an argument); only `groups` when given."""
    for f in reversed(fields(ExportSettings)):
        meta = f.metadata
        if meta["flag"] == "MODEL" or (groups and meta["group"] not in groups):
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


def _inspect_options(fn: Callable) -> Callable:
    """The export options that change what `inspect` shows (model, tuning and measurement; not publishing)."""
    return _settings_options(fn, ("Model", "Tuning", "Measurement"))


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
    from optimizer.app.export import export as run_export
    from optimizer.report.progress import choose_progress

    settings = _run_guarded(lambda: settings_from_cli(model, config, options))
    with choose_progress(ctx.obj["verbosity"]) as progress:  # on stderr: stdout stays for results
        outcome = _run_guarded(lambda: run_export(settings, on_event=progress))
    result = outcome.result
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        click.echo(outcome.report_path.read_text())
        if outcome.validation is not None:  # validation.json holds the record; the exit status still says it
            _run_guarded(outcome.validation.raise_for_status)
        return
    print_export(outcome)
    if outcome.validation is not None:
        _run_guarded(outcome.validation.raise_for_status)


@main.command("export-many")
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--report-dir", type=click.Path(file_okay=False),
              help="Folder of the fleet report (fleet.json, report.md); each model reports into NAME/ below it "
                   "(default: the plan's report-dir, else aitune-reports/fleet).")
@click.option("--index", type=click.IntRange(min=0), metavar="N",
              help="Run only the plan's model N (0-based, in plan order) here, whatever the plan's executor: "
                   "one pod of a Kubernetes Indexed Job ($JOB_COMPLETION_INDEX).")
@click.option("--force", is_flag=True, help="Export every model again, also those unchanged since the last run.")
@click.option("--json", "as_json", is_flag=True, help="Print the fleet record (fleet.json) on stdout.")
@click.pass_context
def export_many(ctx: click.Context, plan: str, report_dir: str | None, index: int | None, force: bool, as_json: bool) -> None:
    """Export every model of PLAN into one repository, one after another or as Ray tasks, and write a fleet report.

    PLAN is a TOML file: repository, executor ("local", or "ray" with address), settings keys every model
    shares, and one [models.NAME] table per model with the keys of the settings file. A failed model never
    stops the others; a model unchanged since the last run is not exported again. Exit status 0 when every
    model is published or unchanged, 1 when one failed, 2 for a bad plan, 130 when interrupted.
    """
    from optimizer.app.export_many import export_many as run_many
    from optimizer.app.plan import check_settings
    from optimizer.fleet.plan import load_plan
    from optimizer.fleet.progress import FleetProgress, outcome_line

    checked = _run_guarded(lambda: load_plan(Path(plan), report_dir, check_settings))
    count = 1 if index is not None else len(checked.models)
    with FleetProgress(count, ctx.obj["verbosity"]) as progress:  # on stderr: stdout stays for results
        fleet = _run_guarded(lambda: run_many(checked, index=index, force=force, on_start=progress.started, on_done=progress.finished))
    if as_json:
        click.echo(fleet.json_path.read_text())
    else:
        for o in fleet.outcomes:
            click.echo(f"{o.name}: {outcome_line(o)}")
        click.echo(f"fleet report {fleet.markdown_path}")
    _run_guarded(fleet.raise_for_status)


@main.command()
@click.option("--device", default="cpu", show_default=True, help="Device to check availability on: cpu or cuda[:N].")
@click.option("--check-imports/--no-check-imports", default=False, show_default=True,
              help="Also import the slow-to-import libraries (torch) instead of only finding them.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True,
              help="Check availability at this --precision (CPU: fp32, bf16, int8; CUDA: fp32, fp16, bf16).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def backends(device: str, check_imports: bool, precision: str, as_json: bool) -> None:
    """List every backend and whether it can run here (with the reason when it cannot)."""
    from optimizer.backend import BACKENDS

    where = _run_guarded(lambda: Device.parse(device))  # a device that cannot exist is bad input, not "unavailable"
    rows = []
    for name, cls in BACKENDS.items():
        b = cls(precision=precision)
        av = b.availability(where, quick=not check_imports)
        rows.append({"name": name, "platform": b.triton_platform or "(baseline, not published)", "available": av.ok, "reason": av.reason})
    from optimizer.triton.runtime.perf_analyzer import perf_analyzer_status
    from optimizer.triton.runtime.install import tritonserver_status

    tools = [tritonserver_status(), perf_analyzer_status()]
    if as_json:
        click.echo(json.dumps({"device": device, "precision": precision, "backends": rows, "tools": tools}, indent=2))
        return
    print_backends(rows, tools)

@main.command()
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("--repository", help="Publish into this repository (a folder or s3://[HOST:PORT/]BUCKET/PREFIX) instead of the one in the report.")
@click.option("--name", help="Model name (default: the one in the report).")
@click.option("--version", type=click.IntRange(min=1), help="Add this version to an existing model, leaving its other versions alone.")
@click.option("--overwrite/--no-overwrite", default=None, help="Replace an existing model of the same name (an atomic swap).  [default: --no-overwrite]")
@click.option("--warmup/--no-warmup", default=None, help="Add model_warmup from the run's sample.  [default: as in the run]")
@click.option("--template-dir", type=click.Path(file_okay=False), help="Templates overriding the packaged ones.")
def publish(report: str, repository: str | None, name: str | None, version: int | None, overwrite: bool | None,
            warmup: bool | None, template_dir: str | None) -> None:
    """Re-emit a repository from a finished run's REPORT (report.json) without re-tuning.

    The artifacts the report names must still exist. The Model Analyzer config is written next to REPORT.
    """
    from optimizer.app.republish import republish

    published = _run_guarded(lambda: republish(Path(report), repository or None, name, version, overwrite,
                                               Path(template_dir) if template_dir else None, warmup))
    click.echo(f"published {published.model_dir} (version {published.version})")
    if published.model_analyzer_config:
        click.echo(f"Model Analyzer config: {published.model_analyzer_config}")


@main.command("inspect")
@click.argument("model", required=False)
@click.option("--config", type=click.Path(dir_okay=False), help="A TOML settings file, as for export (flags given here win).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@_inspect_options
def inspect_command(model: str | None, config: str | None, as_json: bool, **options: Any) -> None:
    """Show what `export MODEL` would use, building nothing: signature, candidates and their availability, strategy limits.

    The model is loaded and run on generated samples to observe its outputs; nothing is written.
    """
    from optimizer.app.inspect import describe, inspect_model

    settings = _run_guarded(lambda: settings_from_cli(model, config, options))
    found = _run_guarded(lambda: inspect_model(settings))
    if as_json:
        click.echo(json.dumps(found.to_json(), indent=2))
        return
    for line in describe(found):
        click.echo(line)


@main.command("report")
@click.argument("report_json", metavar="REPORT", type=click.Path(dir_okay=False))
@click.option("--output-dir", type=click.Path(file_okay=False), help="Write the files here instead of beside REPORT.")
def report_command(report_json: str, output_dir: str | None) -> None:
    """Re-render report.md and the plots from a finished run's REPORT (report.json), without re-tuning."""
    from optimizer.report.markdown import write_report_files

    rendered = _run_guarded(lambda: write_report_files(Path(report_json), Path(output_dir) if output_dir else None))
    for path in [rendered.markdown, *rendered.plots.values()]:
        click.echo(f"wrote {path}")


@main.command()
@click.argument("repo", type=click.Path())
@click.option("--model", metavar="NAME", help="The model to validate (default: the only model in REPO).")
@click.option("--url", metavar="HOST:PORT", help="Validate against this running Triton (its port speaks --protocol) instead of starting one.")
@click.option("--local", is_flag=True, help="Start a local tritonserver on REPO (the default when --url is not given).")
@click.option("--protocol", type=click.Choice(["http", "grpc"]),
              help="Protocol perf_analyzer uses (and, with --url, the answer check); a local server is checked over both "
                   "[default: http with --url, else the export's served-search protocol, gRPC].")
@click.option("--concurrency", default="auto", show_default=True, metavar="START:END[:STEP]",
              help="perf_analyzer's concurrency sweep; auto: 1:8, or four levels up to the export's served-search concurrency.")
@click.option("--measurement-interval", "measurement_interval_ms", type=click.IntRange(100, 600_000), default=1500, show_default=True,
              metavar="MS", help="perf_analyzer's shortest measurement window in milliseconds (its -p; a slow model gets longer ones, "
                                 "so a window holds enough requests); a level is stable when three windows agree. Short windows "
                                 "make a quick smoke check of a repository, long ones a steadier figure.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Folder for validation.json; its report.json (the export's) supplies samples and the prediction "
                   "(default: the export's report folder, else aitune-reports/NAME beside REPO).")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="The cache root, as for export: the local tritonserver's home is prepared under it "
                   "(default: $AITUNE_EXPORT_CACHE_DIR, else $XDG_CACHE_HOME/aitune-export or ~/.cache/aitune-export).")
@click.option("--rate", type=float, metavar="R",
              help="Also measure open-loop at R requests per second (sent on a schedule whatever the answers' pace), held within "
                   "--latency-budget-ms [default: 0.8x and 1.0x the export's claimed capacity when its report has one].")
@click.option("--latency-budget-ms", type=float, metavar="MS",
              help="The budget an open-loop rate is held within, at the claim's percentile (p95 without a claim) "
                   "[default: the claim's; none: held means served >= 97% of the offered rate].")
@click.option("--arrivals", type=click.Choice(["poisson", "constant"]),
              help="How open-loop requests arrive [default: a trace's own schedule when the traffic has timestamps, else the claim's, else poisson].")
@click.option("--traffic", type=click.Path(dir_okay=False), metavar="FILE",
              help="Send this perf_analyzer --input-data file's requests instead of the export's; with timestamps, it is also "
                   "replayed open-loop on its own schedule, at its own mean rate or scaled to --rate.")
@click.option("--rate-window", "rate_window_ms", type=click.IntRange(500, 600_000), default=4000, show_default=True, metavar="MS",
              help="Each open-loop rate is measured over three windows this long (open-loop latency settles over seconds).")
@click.option("--json", "as_json", is_flag=True, help="Print the validation record (validation.json) on stdout.")
@click.pass_context
def validate(ctx: click.Context, repo: str, model: str | None, url: str | None, local: bool, protocol: str | None, concurrency: str,
             measurement_interval_ms: int, report_dir: str | None, cache_dir: str | None, rate: float | None, latency_budget_ms: float | None,
             arrivals: str | None, traffic: str | None, rate_window_ms: int, as_json: bool) -> None:
    """Load REPO's model into a real Triton, check its answers over HTTP and gRPC and measure it with perf_analyzer.

    REPO is a model repository folder, or one in object storage: s3://BUCKET/PREFIX (endpoint and credentials as for
    the aws CLI) or s3://HOST:PORT/BUCKET/PREFIX; the local server then reads it from there.
    The closed-loop sweep (N clients, each waiting for its answer) always runs. Open-loop, when the export's report
    claims a capacity (export --rate or --latency-budget-ms), the config is driven at 0.8x and 1.0x that rate with the
    claim's arrivals, percentile and budget; --rate R measures R instead.

    Exit status 0 when the model loads, answers like the eager reference, perf_analyzer measured it and every open-loop
    rate that must hold held; 1 when a check fails (or the model cannot be validated here), when 0.8x the claimed
    capacity is not held, or when --rate R (or a --traffic trace at its own rate) is not held. The claimed capacity
    itself not held is a warning only (exit 0): one run at capacity lands on either side of it. 2 for bad usage.
    """
    from optimizer.errors import SettingsError
    from optimizer.report.progress import choose_progress
    from optimizer.triton.repository.publish import repository_argument
    from optimizer.triton.measure.validation import validate as run_validate

    if url and local:
        _fail(SettingsError("give either --url HOST:PORT (a running server) or --local (start one), not both."))
    with choose_progress(ctx.obj["verbosity"]) as progress:  # on stderr: stdout stays for results
        record = _run_guarded(lambda: run_validate(repository_argument(repo, "REPO"), model, url=url, protocol=protocol, concurrency=concurrency,
                                                   measurement_interval_ms=measurement_interval_ms,
                                                   report_dir=Path(report_dir) if report_dir else None, on_event=progress,
                                                   cache_dir=cache_dir, rate=rate, latency_budget_ms=latency_budget_ms, arrivals=arrivals,
                                                   traffic=traffic, rate_window_ms=rate_window_ms))
    if as_json:
        click.echo(json.dumps(record.to_json(), indent=2, default=str))
    else:
        print_validation(record)
    _run_guarded(record.raise_for_status)


def run() -> None:
    """The console script: `main`, then an exit that skips the interpreter's teardown.

    Finalizing the modules torch, onnxruntime and OpenVINO load costs seconds of CPU after an export's last line. What
    must happen at exit still does, in the interpreter's own order: thread and process
    pools are shut down and other threads joined (threading._shutdown, which Python's finalization calls), then the
    atexit handlers run (logging, multiprocessing's children and fork server, temporary folders), then os._exit.
    """
    import atexit
    import os
    import threading

    try:
        main()
        code: Any = 0
    except SystemExit as done:  # click ends every standalone run this way
        code = done.code
    if code is not None and not isinstance(code, int):  # sys.exit("text"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`aitune-export ... | head`)
            pass
    os._exit(code or 0)
