"""Where the variants run: the bundled tritonserver on a private repository of links, or the user's server (--url).

Either way the search gets a URL, a way to give a private name the model's files (links on our disk, or the files in
each load request), and a check that the server is still there.
"""

from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from optimizer.errors import ValidationError
from optimizer.events import Event, EventSink
from optimizer.records.served_search import ServedSearch
from optimizer.records.tune_result import TuneResult
from optimizer.task.core_share import CoreShare, probe
from optimizer.triton.runtime.local_serving import local_config, needs_translation
from optimizer.triton.config.model_config import canonical, parse
from optimizer.triton.repository.publish import PublishOptions, model_files
from optimizer.triton.measure.served_search.request import SearchRequest
from optimizer.triton.runtime.install import find_triton, homes_root, prepare_home
from optimizer.triton.runtime.server import LocalTritonServer
from optimizer.vocab import Device

STAND_IN_LABEL = "stand-in backend"
WAIT_PROBE_S = 1.0


class Rig:
    """Where a search runs and what it measures with: the bundled server on a private repository (or the user's, --url),
    a VariantLoader and a Bench. served_search() takes another for a made-up server (the tests' seam)."""

    @contextmanager
    def server(self, result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, text: str,
               extra: dict[str, bytes], on_event: EventSink) -> Iterator[Where | None]:
        """The server the variants run on; None when the bundled one cannot serve this artifact (search.reason says why)."""
        if request.url:
            yield remote_server(result, request, search, extra)
            return
        with local_server(result, options, request, search, text, extra, on_event) as where:
            yield where

    def loader(self, where: Where, request: SearchRequest) -> Any:
        """The loader of variants under private names (a context manager that unloads what it loaded)."""
        from optimizer.triton.measure.served_search.loader import VariantLoader

        return VariantLoader(where.url, protocol=request.protocol, place=where.place, files=where.files, check_alive=where.check_alive)

    def bench(self, where: Where, input_data: Path, rows: list[dict[str, Any]], request: SearchRequest,
              trace_ms: tuple[float, ...] | None = None) -> Any:
        """What measures a loaded variant: perf_analyzer (which must be there) over the search's protocol."""
        from optimizer.triton.measure.served_search.measure import Bench
        from optimizer.triton.runtime.perf_analyzer import find_perf_analyzer

        find_perf_analyzer()
        return Bench(where.url, input_data, rows, request.workdir, protocol=request.protocol, arrivals=request.arrivals, trace_ms=trace_ms)

    def cores(self) -> int:
        """The cores the server's instance layouts may use."""
        from optimizer.machine import cpu_cores

        return cpu_cores()


@dataclass
class Where:
    """The server the variants run on: its URL, how a private name gets its files, how to tell it is still there."""

    name: str
    url: str
    check_alive: Callable[[], None]
    place: Callable[[str, bool], None] | None = None
    files: dict[str, bytes] | None = None
    share: CoreShare | None = None
    repo: Path | None = None  # the private repository of links (the local server), where another candidate's variants go too

    def source_of(self, result: TuneResult, extra: dict[str, bytes]) -> dict[str, Any]:
        """How `result`'s selected artifact reaches the server (VariantLoader.add_source keywords): links in the private
        repository, or its files in every load request."""
        if self.repo is not None:
            return {"place": placer(self.repo, result, extra)}
        return {"files": remote_files(result, extra)}


@contextmanager
def local_server(result: TuneResult, options: PublishOptions, request: SearchRequest, search: ServedSearch, text: str, extra: dict[str, bytes],
           on_event: EventSink) -> Iterator[Where | None]:
    """The bundled tritonserver on a private repository of links to the artifact, on every core (beside any other load:
    see search._search)."""
    from optimizer.triton.measure.target import ModelTarget, local_servability

    artifact = result.selected_candidate.artifact
    repo = request.workdir / "repository"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    home = prepare_home(find_triton(), homes_root(request.cache_dir))
    reason = local_servability(ModelTarget(repo, options.name, parse(locally(text))), home)
    if reason:
        search.reason = reason.replace("validate it", "serve it").split("; ")[0]
        yield None
        return
    search.stand_in = artifact.platform.backend in home.stand_ins()
    search.served_by = (f"{STAND_IN_LABEL}: Triton's python backend runs backends/{artifact.platform.backend}/model.py"
                        if search.stand_in else "native backend")
    share = None if Device.of(artifact.device).is_cuda else free_cores(request, search, on_event)

    with LocalTritonServer(repo, log_path=request.workdir / "tritonserver.log", home=home) as server:
        url = server.http_url if request.protocol == "http" else server.grpc_url
        search.server = f"local tritonserver {home.version and 'from nvidia-pytriton ' + home.version} at {url} ({request.protocol})"
        search.protocol = request.protocol
        yield Where("the local server", url, server.check_alive, place=placer(repo, result, extra), share=share, repo=repo)


def placer(repo: Path, result: TuneResult, extra: dict[str, bytes]) -> Callable[[str, bool], None]:
    """The private model folder of a variant of `result`'s selected artifact: its files linked, the extra files written."""
    files = model_files(result)

    def place(name: str, with_files: bool) -> None:
        version = repo / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        if not with_files:  # an ensemble front: its version folder only
            return
        for target, source in files.items():
            (version / target).unlink(missing_ok=True)
            (version / target).symlink_to(source.resolve())
        for rel, data in extra.items():
            (repo / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / name / rel).write_bytes(data)

    return place


def remote_files(result: TuneResult, extra: dict[str, bytes]) -> dict[str, bytes]:
    """`result`'s selected artifact as `file:` overrides for a server that cannot see this disk."""
    files = {f"1/{target}": source.read_bytes() for target, source in model_files(result).items()}
    files.update(extra)
    return files


def remote_server(result: TuneResult, request: SearchRequest, search: ServedSearch, extra: dict[str, bytes]) -> Where:
    """The user's server (--url): the model's files go in every load request, since it may not see this disk."""
    from optimizer.triton.runtime.server import open_client

    assert request.url is not None
    files = remote_files(result, extra)
    search.server = f"{request.server_version or 'Triton (version unknown)'} at {request.url} ({request.protocol}, --url)"
    search.protocol = request.protocol
    search.served_by = "native backend"  # unless the first variant's config says a model.py ran it (checked after it loads)
    client = open_client(request.protocol, request.url, 10.0)

    def check_alive() -> None:
        try:  # a server shutting down still answers here; the loads that fail on it tell (VariantMeasurer.measure_group)
            if client.is_server_live():
                return
        except Exception:
            pass
        raise ValidationError(f"the Triton at {request.url} stopped answering")

    return Where(f"the Triton at {request.url}", request.url, check_alive, files=files)


def free_cores(request: SearchRequest, search: ServedSearch, on_event: EventSink) -> CoreShare:
    """The cores others leave free; with --wait-for-cores, probe again until every core is free or the wait is over."""
    share = probe()
    if share.reduced and request.wait_for_cores_s > 0:
        t0 = time.monotonic()
        on_event(Event("serve", "progress", message=f"{share.others_busy:.1f} cores busy with other processes; waiting up to "
                       f"{request.wait_for_cores_s:g} s for them (--wait-for-cores)"))
        while share.reduced and time.monotonic() - t0 < request.wait_for_cores_s:
            time.sleep(WAIT_PROBE_S)
            share = probe()
        search.waited_s = round(time.monotonic() - t0, 1)
    return share


def locally(text: str) -> str:
    """The config as the local 2.51 server can load it (torch_aoti through the pytorch stand-in; others unchanged)."""
    config = parse(text)
    return canonical(local_config(config)) if needs_translation(config) else text
