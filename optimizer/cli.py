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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="aitune-export")
@click.option("-v", "--verbose", count=True, help="More log output (repeat for debug); progress becomes plain lines.")
@click.option("-q", "--quiet", count=True, help="Less output: -q shows only finished steps as plain lines, -qq no progress.")
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
    from optimizer.export import export as run_export

    from optimizer.report.progress import choose_progress

    settings = _run_guarded(lambda: settings_from_cli(model, config, options))
    with choose_progress(ctx.obj["verbosity"]) as progress:  # on stderr: stdout stays for results
        outcome = _run_guarded(lambda: run_export(settings, on_event=progress))
    result = outcome.result
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        click.echo(outcome.report_path.read_text())
        return
    chosen = result.selected_candidate
    click.echo(f"selected {chosen.name}: {result.selection_reason}")
    click.echo(chosen.decision.explanation if chosen.decision else f"max_batch_size {result.max_batch_size}")
    click.echo(f"published {outcome.published.model_dir} (version {outcome.published.version})")
    if outcome.published.config:
        click.echo(outcome.published.config["batching"]["explanation"])
    click.echo(f"report {outcome.report_path}")
    if outcome.published.model_analyzer_config:
        click.echo(f"Model Analyzer config: {outcome.published.model_analyzer_config}")


@main.command()
@click.option("--device", default="cpu", show_default=True, help="Device to check availability on: cpu or cuda[:N].")
@click.option("--check-imports/--no-check-imports", default=False, show_default=True,
              help="Also import the slow-to-import libraries (torch) instead of only finding them.")
@click.option("--precision", type=click.Choice(("fp32", "fp16", "bf16")), default="fp32", show_default=True,
              help="Check availability at this --precision (CPU candidates run fp32 only).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def backends(device: str, check_imports: bool, precision: str, as_json: bool) -> None:
    """List every backend and whether it can run here (with the reason when it cannot)."""
    from optimizer.backend import BACKENDS

    rows = []
    for name, cls in BACKENDS.items():
        b = cls(precision=precision)
        av = b.availability(device, quick=not check_imports)
        rows.append({"name": name, "platform": b.triton_platform or "(baseline, not published)", "available": av.ok, "reason": av.reason})
    if as_json:
        click.echo(json.dumps({"device": device, "precision": precision, "backends": rows}, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = ("available" + (f" ({r['reason']})" if r["reason"] else "")) if r["available"] else f"unavailable: {r['reason']}"
        click.echo(f"{r['name']:<{width}}  {r['platform']:<26} {state}")


@main.command()
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("--repository", help="Publish into this repository instead of the one in the report.")
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
    from optimizer.triton.publish import republish

    published = _run_guarded(lambda: republish(Path(report), Path(repository) if repository else None, name, version, overwrite,
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
    from optimizer.inspection import describe, inspect_model

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


def run() -> None:
    """Console entry point (kept separate so `main` stays a click group for tests)."""
    main()


if __name__ == "__main__":
    main()
