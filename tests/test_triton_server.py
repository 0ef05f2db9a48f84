"""LocalTritonServer with the real tritonserver 2.51: it starts, serves an unchanged onnxruntime_onnx config through the
stand-in backend, and always stops, leaving no process and no shared-memory region behind (also two at once, after a
failure, and after Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from optimizer.errors import ValidationError
from optimizer.triton.runtime import install as install_mod
from optimizer.triton.runtime.install import find_triton, prepare_home
from optimizer.triton.runtime.server import SHM_DIR, LocalTritonServer
from tests.conftest import ROOT, ctrl_c_reaches_it

DOUBLE_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input {{ name: "x" data_type: TYPE_FP32 dims: [3] }}
output {{ name: "y" data_type: TYPE_FP32 dims: [3] }}
instance_group {{ count: 1 kind: KIND_CPU }}
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
"""


def write_double_model(repo: Path, name: str = "double", config: str = DOUBLE_CONFIG) -> Path:
    """A one-node ONNX model (y = 2x, dynamic batch) with a native onnxruntime_onnx config."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x], [y], [two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(config.format(name=name))
    return repo / name


def _other_processes() -> Iterator[tuple[Path, str]]:
    """Every live process but this one: its /proc folder and its command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            yield entry, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (a test's unique temporary path)."""
    return [int(entry.name) for entry, cmdline in _other_processes() if text in cmdline]


def processes_working_in(folder: Path) -> list[str]:
    """Command lines of processes whose working directory is `folder` or below it: a run's candidates, its fork server
    and its served-search tritonserver all work in the folder the run was started in."""
    found = []
    for entry, cmdline in _other_processes():
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # gone, or a zombie: not running
            continue
        if cwd.is_relative_to(folder):
            found.append(cmdline[:200])
    return found


def regions_of(pid: int) -> list[Path]:
    return sorted(SHM_DIR.glob(f"triton_python_backend_shm_region_aitune{pid}x*"))


def doubled(server: LocalTritonServer, name: str = "double") -> np.ndarray:
    import tritonclient.grpc as grpcclient

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    item = grpcclient.InferInput("x", [2, 3], "FP32")
    item.set_data_from_numpy(x)
    return server.client("grpc").infer(name, [item]).as_numpy("y")


pytestmark = pytest.mark.slow


def test_two_servers_at_once_then_nothing_left(tmp_path: Path):
    repos = [tmp_path / "a", tmp_path / "b"]
    for repo in repos:
        write_double_model(repo)
    with LocalTritonServer(repos[0]) as first, LocalTritonServer(repos[1]) as second:
        first.load("double")
        second.load("double")
        assert len({first.http_port, first.grpc_port, second.http_port, second.grpc_port}) == 4
        assert first.shm_prefix != second.shm_prefix
        np.testing.assert_array_equal(doubled(first), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
        np.testing.assert_array_equal(doubled(second), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
        assert first.regions() and second.regions()  # one region per python stub while serving
        assert processes_mentioning(str(repos[0])) and processes_mentioning(str(repos[1]))
    assert processes_mentioning(str(tmp_path)) == []
    assert first.regions() == [] and second.regions() == []


def test_nothing_left_after_an_error_inside_the_block(tmp_path: Path):
    write_double_model(tmp_path / "repo")
    with pytest.raises(RuntimeError, match="boom"):
        with LocalTritonServer(tmp_path / "repo") as server:
            server.load("double")
            server.client("http")  # an open keep-alive connection must not delay the shutdown
            assert server.regions()
            raise RuntimeError("boom")
    assert processes_mentioning(str(tmp_path)) == []
    assert server.regions() == []


def test_a_model_that_fails_to_load_gives_tritons_text_and_the_server_still_stops(tmp_path: Path):
    bad = DOUBLE_CONFIG.replace('input {{ name: "x"', 'input {{ name: "nope"')
    write_double_model(tmp_path / "repo", config=bad)
    with pytest.raises(ValidationError) as info:
        with LocalTritonServer(tmp_path / "repo") as server:
            server.load("double")
    message = str(info.value)
    assert "load failed for model 'double'" in message and "unexpected inference input 'nope'" in message
    assert "At:" not in message  # the stand-in's python stack trace is not the user's business
    assert processes_mentioning(str(tmp_path)) == []
    assert server.regions() == []


def test_a_server_killed_from_outside_takes_its_stubs_along_and_is_reported(tmp_path: Path):
    write_double_model(tmp_path / "repo")
    with LocalTritonServer(tmp_path / "repo") as server:
        server.load("double")
        assert server.regions()
        pid = server.pid
        os.kill(pid, signal.SIGKILL)  # its stub ignores SIGTERM and would outlive it, reparented to init
        run = [str(tmp_path), f"{server.running_dir}/{pid}-"]  # the server and its stub; the server's watcher
        deadline = time.monotonic() + 30  # the watcher acts within a second; room for a busy machine
        while (any(processes_mentioning(text) for text in run) or server.regions()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_mentioning(run[0]) == [], "no stub may outlive its server, even while its owner does nothing"
        assert processes_mentioning(run[1]) == [], "the watcher ends once it has cleared"
        assert server.regions() == [] and list(server.running_dir.glob(f"{pid}-*.json")) == []
        with pytest.raises(ValidationError, match="tritonserver exited with status -9"):
            server.check_alive()
    assert processes_mentioning(str(tmp_path)) == []


def test_ctrl_c_during_validate_stops_the_server_and_removes_its_regions(tmp_path: Path):
    write_double_model(tmp_path / "repo")
    proc = subprocess.Popen([sys.executable, "-m", "optimizer.cli", "validate", str(tmp_path / "repo"), "--concurrency", "1:2",
                             "--report", str(tmp_path / "out")],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=ctrl_c_reaches_it)
    try:
        deadline = time.monotonic() + 120
        while not regions_of(proc.pid):  # the model is loaded once its stub holds a region
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        assert processes_mentioning(str(tmp_path / "repo"))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert processes_mentioning(str(tmp_path)) == []
    assert regions_of(proc.pid) == []


def test_the_server_home_is_made_once_even_by_racing_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    standins = tmp_path / "standins"
    for backend in ("onnxruntime", "openvino", "python"):  # python has a real library: its stand-in must not be copied
        (standins / backend).mkdir(parents=True)
        (standins / backend / "model.py").write_text(f"# {backend} stand-in\n")
    monkeypatch.setattr(install_mod, "STANDIN_DIR", standins)
    install = find_triton()
    homes, errors = [], []

    def make() -> None:
        try:
            homes.append(prepare_home(install, tmp_path / "cache"))
        except Exception as err:  # collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=make) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len({h.root for h in homes}) == 1
    home = homes[0]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [home.root.name]  # no half-made leftovers
    assert home.binary.is_file() and (home.backends / "python" / "triton_python_backend_stub").is_file()
    assert home.stand_ins() == {"onnxruntime", "openvino"}
    assert not (home.backends / "python" / "model.py").exists()
    (standins / "pytorch").mkdir()
    (standins / "pytorch" / "model.py").write_text("# new\n")
    assert prepare_home(install, tmp_path / "cache").root != home.root  # a changed stand-in gets a new home


def test_a_killed_validate_takes_its_server_along(tmp_path: Path):
    write_double_model(tmp_path / "repo")
    proc = subprocess.Popen([sys.executable, "-m", "optimizer.cli", "validate", str(tmp_path / "repo"), "--concurrency", "1:2",
                             "--report", str(tmp_path / "out")],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not regions_of(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        proc.kill()  # no chance to clean up: the kernel tells the server (PR_SET_PDEATHSIG) and it stops itself
        proc.wait()
    deadline = time.monotonic() + 60
    while (processes_mentioning(str(tmp_path / "repo")) or regions_of(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(tmp_path / "repo")) == []
    assert regions_of(proc.pid) == []
