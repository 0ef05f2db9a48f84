"""`aitune-export serve`: the bundled tritonserver in the foreground, started and stopped as a user does it.

Bad input is one line and exit 2 before anything starts; a running server answers on the ports it was given, Ctrl-C
(SIGINT) stops it with exit 0 and leaves no tritonserver behind; an export into object storage is served from there
and validated by URL (the chain a user without Docker runs).
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from optimizer.triton.runtime.server import free_port
from tests.conftest import run_cli
from tests.test_client_contract import start_serve, stop_serve, tritonservers_on


def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


@pytest.mark.parametrize("case", ["missing repo", "busy port", "unsupported scheme", "same ports", "unreachable storage"])
def test_bad_input_is_one_line_and_exit_2(in_tmp: Path, case: str):
    (in_tmp / "repo").mkdir()
    holder, busy = _busy_port()
    closed = free_port()  # nobody listens there: connections are refused at once
    args = {
        "missing repo": ("serve", "no_such_repo", "--http-port", "18931", "--grpc-port", "18932"),
        "busy port": ("serve", "repo", "--http-port", str(busy), "--grpc-port", "18932"),
        "unsupported scheme": ("serve", "gs://bucket/repo", "--http-port", "18931", "--grpc-port", "18932"),
        "same ports": ("serve", "repo", "--http-port", "18931", "--grpc-port", "18931"),
        "unreachable storage": ("serve", f"s3://127.0.0.1:{closed}/bucket1/repo", "--http-port", "18931", "--grpc-port", "18932"),
    }[case]
    wanted = {"missing repo": "REPO 'no_such_repo' is not a directory", "busy port": f"--http-port {busy}: cannot listen",
              "unsupported scheme": "scheme 'gs' is not supported", "same ports": "give two different ports",
              "unreachable storage": f"cannot reach the S3 endpoint http://127.0.0.1:{closed}"}[case]
    try:
        r = run_cli(*args, cwd=in_tmp, timeout=60, env={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    finally:
        holder.close()
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and wanted in r.stderr
    assert r.stdout == ""  # no URL printed: nothing was started


@pytest.mark.slow
def test_serve_answers_on_its_ports_and_ctrl_c_stops_it(in_tmp: Path):
    import tritonclient.grpc as grpcclient

    (in_tmp / "repo").mkdir()
    proc, http, grpc = start_serve(in_tmp / "repo", in_tmp)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        assert client.is_server_live() and client.get_server_metadata().version
        client.close()
        assert tritonservers_on(http)
    finally:
        code = stop_serve(proc)
    assert code == 0, proc.stderr.read()
    assert not tritonservers_on(http)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/live", timeout=2)


@pytest.mark.slow
@pytest.mark.long  # the chain of three paths CI tests one by one (s3 publish, serve, validate --url); make test-long runs it
def test_an_export_to_object_storage_is_served_from_there_and_validated_by_url(in_tmp: Path, s3):
    url = s3.url(s3.bucket())
    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--max-batch-size", "4", "--eager-gate", "disabled",
                "--repository", url, cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    proc, http, _ = start_serve(url, in_tmp)
    try:
        v = run_cli("validate", url, "--url", f"127.0.0.1:{http}", "--concurrency", "1:2", "--measurement-interval", "300", "--json", cwd=in_tmp, timeout=300)
    finally:
        code = stop_serve(proc)
    assert v.returncode == 0, v.stderr
    assert '"status": "passed"' in v.stdout and '"compared_with": "reference"' in v.stdout
    assert code == 0 and not tritonservers_on(http)
