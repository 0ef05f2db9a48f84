"""The commands around a repository that are not the export's: `serve` (a local Triton on a repository) and `traffic`
(check and summarise a traffic file). Registered on the group in commands.py when the package is imported."""

from __future__ import annotations

import json
from pathlib import Path

import click

from optimizer.cli.commands import _run_guarded, main
from optimizer.cli.output import print_serving


@main.command()
@click.argument("repo", required=False, default="model_repository", metavar="[REPO]")
@click.option("--http-port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port of Triton's HTTP/REST endpoint.")
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001, show_default=True, help="Port of Triton's gRPC endpoint.")
@click.option("--model-control-mode", type=click.Choice(["explicit", "none", "poll"]), default="explicit", show_default=True,
              help="Triton's --model-control-mode. explicit loads every model at start and accepts load/unload requests "
                   "(what `export --url` needs); none loads every model and refuses changes; poll follows the repository.")
@click.option("--address", default="127.0.0.1", show_default=True, help="Address both endpoints listen on (0.0.0.0: every interface).")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="The cache root, as for export: the tritonserver home with the stand-in backends is prepared under it.")
@click.pass_context
def serve(ctx: click.Context, repo: str, http_port: int, grpc_port: int, model_control_mode: str, address: str, cache_dir: str | None) -> None:
    """Run the bundled tritonserver 2.51 on REPO in the foreground until Ctrl-C (or SIGTERM) stops it.

    REPO is a model repository folder (default ./model_repository) or s3://[HOST:PORT/]BUCKET/PREFIX (credentials as for
    the aws CLI). The onnxruntime, pytorch and openvino backends are stand-ins (Triton's Python-based backends running pip
    packages); their numbers are not the native backends'. The server's log goes to stderr (not with -q). Metrics are off.
    Exit status 0 after Ctrl-C/SIGTERM, 1 when the server stops by itself, 2 for bad usage (missing REPO, busy port,
    unsupported scheme).
    """
    from optimizer.app.serve import ServeRequest, serve as run_serve, stderr_sink
    from optimizer.triton.repository.publish import repository_argument

    request = ServeRequest(repo if "://" in repo else str(repository_argument(repo)), http_port, grpc_port, model_control_mode, address, cache_dir)


    sink = None if ctx.obj["quiet"] else stderr_sink
    _run_guarded(lambda: run_serve(request, print_serving, sink))


@main.command("traffic")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("model", required=False)
@click.option("--input", "inputs", multiple=True, metavar="NAME:DTYPE:DIMS",
              help="Check the entries against this input, as export's --input (repeat for each input; with MODEL, on top of its own).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def traffic_command(file: str, model: str | None, inputs: tuple[str, ...], as_json: bool) -> None:
    """Summarise and check a traffic FILE (perf_analyzer --input-data JSON, one entry per request) before export --traffic.

    Prints the requests, their shapes' histogram and, when the entries carry "timestamp" (ms), the trace's mean rate,
    duration, burstiness and peak rate. With MODEL or --input every entry is checked as export checks it; with neither,
    the file's structure is checked and each input's shapes are shown with the --input flag that describes them.
    Exit status 0 when the file is usable, 2 with one line naming the entry and the fix when it is not.
    """
    from optimizer.app.traffic import check_traffic, describe_traffic

    check = _run_guarded(lambda: check_traffic(Path(file), model, inputs))
    if as_json:
        click.echo(json.dumps(check.to_json(), indent=2))
    else:
        for line in describe_traffic(check):
            click.echo(line)
