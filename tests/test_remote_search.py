"""`export --url`: the served search on a server the user started, through its repository API.

The server is `aitune-export serve`, started as a separate process the way a user without Docker starts one; the
export loads its variants there under private names with their config and files in the request, publishes into its
own repository as usual, and leaves the server with the models it had. Servers that cannot do this are refused in one
line before any tuning.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from optimizer.records.served_search import ServedSearch
from optimizer.triton.config.model_config import parse
from optimizer.triton.runtime.install import homes_root, prepare_home
from optimizer.triton.runtime.server import free_port, open_client
from tests.conftest import run_cli
from tests.test_client_contract import start_serve, stop_serve



def test_an_unreachable_url_is_one_line_and_exit_2_before_tuning(in_tmp: Path):
    closed = free_port()
    r = run_cli("export", "tests.fixtures.models:mlp", "--url", f"127.0.0.1:{closed}", cwd=in_tmp, serve_search=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"cannot reach a Triton at 127.0.0.1:{closed} over http" in r.stderr
    assert not (in_tmp / "model_repository").exists() and not (in_tmp / "aitune-reports").exists()


def test_a_url_with_a_scheme_or_with_the_search_off_is_refused(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:mlp", "--url", "http://127.0.0.1:8000", cwd=in_tmp, serve_search=True, timeout=120)
    assert r.returncode == 2 and "takes HOST:PORT without a scheme" in r.stderr
    r = run_cli("export", "tests.fixtures.models:mlp", "--url", "127.0.0.1:8000", "--serve-search", "off", cwd=in_tmp, timeout=120)
    assert r.returncode == 2 and "drop one of them" in r.stderr


@pytest.mark.slow
def test_export_url_searches_on_the_users_server_and_leaves_it_as_it_was(in_tmp: Path):
    """The user's server has no onnxruntime backend: the candidate chosen in-process (first-wins: onnxruntime) is refused
    there with the server's own words, and the next one (torchscript) is searched and published instead."""
    served = in_tmp / "served"  # the server's own repository: it never sees ours
    served.mkdir()
    server_cache = in_tmp / "server-cache"
    home = prepare_home(root=homes_root(server_cache / "aitune-export"))
    shutil.rmtree(home.root / "backends" / "onnxruntime")  # a Triton build without that backend
    proc, http, _ = start_serve(served, in_tmp, env={"XDG_CACHE_HOME": str(server_cache)})
    try:
        client = open_client("http", f"127.0.0.1:{http}")
        before = [m for m in client.get_model_repository_index() if m.get("state") == "READY"]
        r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--backend", "torchscript", "--strategy", "first-wins",
                    "--eager-gate", "disabled", "--concurrency", "4", "--url", f"127.0.0.1:{http}", "--serve-search-seconds", "20",
                    cwd=in_tmp, serve_search=True)
        assert r.returncode == 0, r.stderr
        after = [m for m in client.get_model_repository_index() if m.get("state") == "READY"]
        assert after == before  # every private variant was unloaded
        client.close()
    finally:
        assert stop_serve(proc) == 0
    doc = json.loads((in_tmp / "aitune-reports" / "mlp" / "report.json").read_text())
    search = ServedSearch.from_json(doc["published"]["served_search"])
    assert search.status == "searched", search.reason
    assert f"at 127.0.0.1:{http}" in search.server and "Triton 2.51" in search.server
    assert search.stand_in and "model.py" in search.served_by  # the server said a Python-based backend ran it
    assert len([v for v in search.variants if v.status == "measured"]) >= 2
    config = parse((in_tmp / "model_repository" / "mlp" / "config.pbtxt").read_text())
    assert (config.max_batch_size, config.instance_group[0].count) == (search.chosen.max_batch_size, search.chosen.instances)
    assert not list(served.iterdir())  # nothing was written where the server reads
    result = doc["result"]
    refused = next(c for c in result["candidates"] if c["name"] == "onnxruntime[cpu]")
    assert result["selected"] == "torchscript[cpu]" and config.platform == "pytorch_libtorch"
    assert f"refused by the Triton at 127.0.0.1:{http}" in refused["reason"] and "onnxruntime" in refused["reason"].split("refused by")[1]
    assert "refused it; trying torchscript[cpu]" in r.stderr


@pytest.mark.slow
def test_a_server_that_polls_its_repository_is_refused_before_tuning(in_tmp: Path):
    served = in_tmp / "served"
    served.mkdir()
    proc, http, _ = start_serve(served, in_tmp, mode="none")
    try:
        r = run_cli("export", "tests.fixtures.models:mlp", "--url", f"127.0.0.1:{http}", cwd=in_tmp, serve_search=True, timeout=120)
    finally:
        stop_serve(proc)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "was not started with --model-control-mode=explicit" in r.stderr
    assert not (in_tmp / "model_repository").exists()


@pytest.mark.slow
@pytest.mark.long  # a bad-input path; make test-long runs it
def test_a_server_that_dies_mid_search_fails_the_export_and_publishes_nothing(in_tmp: Path):
    import os
    import subprocess
    import time

    from tests.conftest import CLI, ROOT

    served = in_tmp / "served"
    served.mkdir()
    proc, http, _ = start_serve(served, in_tmp)
    export = subprocess.Popen([*CLI, "export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled",
                               "--concurrency", "4", "--url", f"127.0.0.1:{http}", "--serve-search-seconds", "120"],
                              cwd=in_tmp, env=dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(in_tmp / ".cache")),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:  # the search has measured its first variant on the user's server
            line = export.stderr.readline()
            if "start: max" in line or not line and export.poll() is not None:
                break
        proc.kill()  # the server dies, as a crash does (its tritonserver follows its parent)
        proc.wait(timeout=30)
        _, err = export.communicate(timeout=300)
    finally:
        if export.poll() is None:
            export.kill()
    assert export.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and ("nothing was published" in last or "stopped answering" in last), err
    assert not (in_tmp / "model_repository").exists()
