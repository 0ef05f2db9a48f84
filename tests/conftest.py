"""Shared fixtures: small models written for the tests, and a way to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
CLI = [sys.executable, "-m", "optimizer.cli"]
# One Inductor cache for every torch-aoti compile of the session, both workers included (Inductor writes it atomically):
# the bundled models are compiled by several tests, and a warm cache makes the slow compile much cheaper. A test that needs a
# compile to really happen gives its own folder.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".pytest_cache" / "inductor"))


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker gets its own share of the cores (and so does everything it starts).

    Why: a worker's export measured beside the other worker's, both on every core, runs its multi-thread runtimes in
    lock step with a busy neighbour: its figures fall far below an idle machine's, every measurement is retaken and
    stretched to its time cap, and the tuning takes several times as long. A worker on its own core measures as a
    one-core machine would, undisturbed. The serial part runs unpinned: it tests the cores themselves."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if 2 <= count <= len(cores):
        os.sched_setaffinity(0, cores[int(worker[2:]) % count::count])


def ctrl_c_reaches_it() -> None:
    """preexec_fn for a child a test interrupts with SIGINT: a shell that runs a job in the background (`make test &`)
    ignores SIGINT in it, the child inherits that, and Python then never raises KeyboardInterrupt; a terminal's Ctrl-C does."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None,
            serve_search: bool = False) -> subprocess.CompletedProcess:
    """Run `aitune-export ARGS` as a user would (a real process); returns the completed process.

    An export runs in fp32 (adds --precision fp32) unless the test names --precision, and skips the served search
    (adds --serve-search off) unless the test asks for it with `serve_search=True` or names the flag itself: each
    search starts a server and measures for up to its budget, and tests/test_served_search.py and the quick-start
    test cover it.
    """
    if args and args[0] == "export" and not serve_search and not any(a.startswith("--serve-search") for a in args):
        args = (*args, "--serve-search", "off")
    if args and args[0] == "export" and not any(a.startswith("--precision") for a in args):
        args = (*args, "--precision", "fp32")  # auto adds bf16 candidates on a bf16 CPU: tests/test_precision_cpu.py covers them
    # each test gets its own artifact cache (beside its working directory), so no test reuses another's builds
    cache = str((cwd or ROOT / ".pytest_cache") / ".cache")
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=cache, **(env or {}))
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test inside an empty directory (reports and repositories land there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    return tmp_path


def tree_snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime_ns) of every file under path: compare before/after to prove nothing changed."""
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(path).parts
    }


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "aitune-test", "AWS_SECRET_ACCESS_KEY": "aitune-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}
"""What the tests give boto3 and tritonserver for moto's server (which accepts any credentials)."""


class MotoS3:
    """A real S3 API on loopback (moto's server mode): its endpoint and a boto3 client for arranging and inspecting buckets."""

    def __init__(self, port: int) -> None:
        import boto3

        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                   aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
        self._count = 0

    def bucket(self) -> str:
        """A new, empty bucket (one per test: tests never see each other's objects)."""
        self._count += 1
        name = f"aitune-test-{self._count}"
        self.client.create_bucket(Bucket=name)
        return name

    def url(self, bucket: str, prefix: str = "repo") -> str:
        """Triton's form of a repository in `bucket`: s3://127.0.0.1:PORT/BUCKET/PREFIX."""
        return f"s3://127.0.0.1:{self.port}/{bucket}/{prefix}".rstrip("/")

    def objects(self, bucket: str, prefix: str = "") -> dict[str, str]:
        """Key -> ETag of every object under `prefix`."""
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
        return out

    def read(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoS3]:
    """`python -m moto.server` on a free loopback port for the whole session, stopped (and waited for) at its end."""
    import socket
    import time
    import urllib.request

    pytest.importorskip("moto", reason="moto[server] is not installed: pip install 'aitune-export[test]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on port {port} (exit status {proc.poll()})") from None
                time.sleep(0.1)
        yield MotoS3(port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3(moto_server: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """moto's S3 with this test's environment holding credentials for it (and no AWS endpoint or profile of the machine's)."""
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aitune-test-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aitune-test-aws-credentials")
    return moto_server
