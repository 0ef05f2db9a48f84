"""A local tritonserver that dies hard, alone or with the process that started it and that process's children (as a CI
runner ends a cancelled job), leaves no process and no shared-memory region behind: its watcher clears them within
seconds, and where the watcher died too, the next server start reclaims them, says so in one line, and starts on the
dead server's own ports. (A server killed alone: tests/test_triton_server.py.)"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from optimizer.triton.runtime.install import ServerHome, find_triton, prepare_home
from optimizer.triton.runtime.reclaim import RUNNING_DIR, running, start_time
from optimizer.triton.runtime.server import LocalTritonServer
from tests.conftest import ROOT
from tests.test_triton_server import doubled, processes_mentioning, regions_of, write_double_model

pytestmark = pytest.mark.slow

BOUND_S = 30.0  # the watcher acts within a second; the bound leaves room for a machine busy with other work

OWNER = r"""
import sys
from pathlib import Path
import numpy as np
from optimizer.triton.runtime.install import find_triton, prepare_home
from optimizer.triton.runtime.perf_analyzer import ConcurrencyRange, PerfSettings, run_perf_analyzer
from optimizer.triton.runtime.perf_analyzer_input import write_input_data
from optimizer.triton.runtime.server import LocalTritonServer

root = Path(sys.argv[1])
data = write_input_data(root / "in.json", [{"x": np.ones((1, 3), np.float32)}], batching=True)
settings = PerfSettings(concurrency=ConcurrencyRange(1, 2), protocol="grpc", measurement_interval_ms=500,
                        stability_percentage=100000, max_trials=3, timeout_s=120)
with LocalTritonServer(root / "repo", home=prepare_home(find_triton(), root / "homes"), log_path=root / "tritonserver.log") as server:
    server.load("double")
    print(server.pid, server.http_port, server.grpc_port, flush=True)
    while True:  # measure until killed, as a served search does
        run_perf_analyzer("double", server.grpc_url, data, root / "pa", settings)
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> ServerHome:
    """A server home of the tests' own: its processes and records are told apart from any other test's."""
    return prepare_home(find_triton(), tmp_path_factory.mktemp("hard-exit") / "homes")


def _start_owner(tmp_path: Path, home: ServerHome) -> tuple[subprocess.Popen, int, int, int]:
    """A process that serves `double` from its own tritonserver and measures it with perf_analyzer until killed (its
    server home is reached through tmp_path, so every process of the run, its watcher too, mentions tmp_path)."""
    write_double_model(tmp_path / "repo")
    (tmp_path / "homes").symlink_to(home.root.parent)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    server_pid, http_port, grpc_port = map(int, owner.stdout.readline().split())
    deadline = time.monotonic() + 120
    while not [p for p in _children(owner.pid) if "perf_analyzer" in _cmdline(p)]:  # the measuring has begun
        assert owner.poll() is None and time.monotonic() < deadline, "the owner died before measuring"
        time.sleep(0.05)
    return owner, server_pid, http_port, grpc_port


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _kill_with_children(owner: subprocess.Popen) -> list[int]:
    """SIGKILL the owner and its children at once (the server and perf_analyzer among them), as CI runners do."""
    victims = [owner.pid, *_children(owner.pid)]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    owner.wait()
    return victims


def _regions(owner_pid: int) -> list[str]:
    return [p.name for p in regions_of(owner_pid)]


def _wait_until_gone(tmp_path: Path, owner_pid: int, bound_s: float) -> None:
    """Wait (at most `bound_s`) until no process of the run (server, stub, perf_analyzer, watcher) and no region of it is left."""
    deadline = time.monotonic() + bound_s
    while (processes_mentioning(str(tmp_path)) or _regions(owner_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_run_killed_with_its_children_while_measuring_leaves_nothing(tmp_path: Path, home: ServerHome):
    owner, _, _, _ = _start_owner(tmp_path, home)
    try:
        assert _regions(owner.pid)
        _kill_with_children(owner)
    finally:
        if owner.poll() is None:
            owner.kill()
    _wait_until_gone(tmp_path, owner.pid, BOUND_S)
    assert processes_mentioning(str(tmp_path)) == [], "no server, stub, perf_analyzer or watcher may outlive the run"
    assert _regions(owner.pid) == []


def test_what_a_run_killed_with_its_watcher_left_is_reclaimed_by_the_next_start(tmp_path: Path, home: ServerHome,
                                                                                  caplog: pytest.LogCaptureFixture):
    owner, _, http_port, grpc_port = _start_owner(tmp_path, home)
    try:
        watchers = processes_mentioning(str(tmp_path / "homes" / RUNNING_DIR))
        assert len(watchers) == 1
        os.kill(watchers[0], signal.SIGKILL)  # everything of the run dies, the watcher too (say, an OOM kill of it first)
        _kill_with_children(owner)
    finally:
        if owner.poll() is None:
            owner.kill()
    orphans, regions = processes_mentioning(str(tmp_path / "repo")), _regions(owner.pid)
    assert orphans and regions, "without the watcher the stubs outlive their server (the case the reclaim is for)"
    caplog.set_level(logging.WARNING, logger="optimizer")
    # the next run asks for the dead server's own ports (as `aitune-export serve --http-port` does)
    with LocalTritonServer(tmp_path / "repo", home=home, http_port=http_port, grpc_port=grpc_port) as server:
        lines = [r.getMessage() for r in caplog.records if "reclaimed" in r.getMessage()]
        assert len(lines) == 1, lines
        assert all(str(pid) in lines[0] for pid in orphans) and all(region in lines[0] for region in regions)
        assert str(owner.pid) in lines[0]  # which earlier run left them
        assert not [pid for pid in orphans if running(pid, start_time(pid) or 0)]  # gone before the new server loads a model
        server.load("double")
        np.testing.assert_array_equal(doubled(server), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    assert processes_mentioning(str(tmp_path)) == [] and _regions(owner.pid) == []
    assert list((home.root.parent / RUNNING_DIR).glob("*.json")) == []


def test_a_reclaim_kills_only_the_recorded_server_never_a_process_that_took_its_ids(tmp_path: Path):
    """A record whose server pid (and process group) now names another process, or that comes from another pid namespace
    (a cache folder shared by containers), kills nothing; the record that does name its process clears it."""
    import dataclasses

    from optimizer.triton.runtime.reclaim import ServerRecord, pid_scope, reclaim, write_record

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_owner = int(done.stdout)  # an owner that has ended
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)  # leads its own group
    try:
        home = os.path.dirname(os.path.realpath(sys.executable))  # its executable lies in this "home"
        real = ServerRecord(other.pid, start_time(other.pid), dead_owner, 1, home, "aitune-test-none-", "", time.time(), *pid_scope())
        for record in (dataclasses.replace(real, server_start=real.server_start - 1),  # the pid was reused by `other`
                       dataclasses.replace(real, namespace="pid:[1]")):  # another container's pids
            write_record(tmp_path, record)
            reclaim(tmp_path)
            assert other.poll() is None, f"{record} killed a process that is not its server"
        assert len(list(tmp_path.glob("*.json"))) == 1  # the other namespace's record is left to that namespace
        write_record(tmp_path, real)
        assert len(reclaim(tmp_path)) == 1 and other.wait(timeout=BOUND_S) == -signal.SIGKILL
    finally:
        other.kill()
        other.wait()
