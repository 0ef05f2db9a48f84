"""One client contract: clients send the forward() argument names and read output__<i> whatever backend wins.

A positional winner (torch_aoti) is published as two models: the positional one under <name>__positional and an
ensemble <name> in front of it that keeps the names; --io-names positional publishes the bare model. The slow test
at the end runs one unchanged tritonclient script against the bundled CNN exported with ONNX Runtime and with
AOTInductor, each served by `aitune-export serve` in its own process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from optimizer.errors import PublishError
from optimizer.triton.config.front import INNER_SUFFIX, VERSION_MARKER, inner_name
from optimizer.triton.repository.exports import export_models
from optimizer.triton.config.model_config import parse
from optimizer.triton.repository.publish import PublishOptions, check_target, publish
from optimizer.triton.measure.target import composing_targets, resolve_target
from tests.conftest import CLI, ROOT, ctrl_c_reaches_it, tree_snapshot
from tests.triton_records import make_result, tensor

TWO_IN = (tensor("image", "float32", "3x8x8"), tensor("mask", "float32", "8"))
TWO_OUT = (tensor("output__0", "float32", "10"), tensor("output__1", "float32", "2"))


def _aoti(tmp_path: Path):
    return make_result(tmp_path, "torch_aoti", inputs=TWO_IN, outputs=TWO_OUT)


def _config(repo: Path, name: str):
    return parse((repo / name / "config.pbtxt").read_text())


def test_a_positional_winner_is_published_behind_an_ensemble_that_keeps_the_forward_names(tmp_path: Path):
    repo = tmp_path / "repo"
    published = publish(_aoti(tmp_path), PublishOptions(repo, "m"))
    assert sorted(p.name for p in repo.iterdir()) == ["m", "m__positional"]
    front, inner = _config(repo, "m"), _config(repo, "m__positional")
    assert front.platform == "ensemble" and not front.backend
    assert [t.name for t in front.input] == ["image", "mask"] and [t.name for t in front.output] == ["output__0", "output__1"]
    assert [t.name for t in inner.input] == ["INPUT__0", "INPUT__1"] and inner.platform == "torch_aoti"
    assert front.max_batch_size == inner.max_batch_size == 8
    assert [list(t.dims) for t in front.input] == [[3, 8, 8], [8]]
    (step,) = front.ensemble_scheduling.step
    assert step.model_name == "m__positional"
    assert dict(step.input_map) == {"INPUT__0": "image", "INPUT__1": "mask"}
    assert dict(step.output_map) == {"OUTPUT__0": "output__0", "OUTPUT__1": "output__1"}
    assert (repo / "m" / "1" / VERSION_MARKER).is_file()  # Triton serves an ensemble only with a version folder
    assert (repo / "m__positional" / "1" / "model.pt2").read_bytes() == b"fake model.pt2"
    assert published.composing == ["m__positional"] and published.to_json()["composing"] == ["m__positional"]


def test_io_names_positional_publishes_the_bare_model(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(_aoti(tmp_path), PublishOptions(repo, "m", io_names="positional"))
    assert [p.name for p in repo.iterdir()] == ["m"]
    assert [t.name for t in _config(repo, "m").input] == ["INPUT__0", "INPUT__1"]


def test_a_named_backend_is_published_alone(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(make_result(tmp_path), PublishOptions(repo, "m"))
    assert [p.name for p in repo.iterdir()] == ["m"]
    assert [m.name for m in export_models(repo, "m")] == ["m"]


def test_export_models_lists_the_positional_model_first_with_config_and_files(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(_aoti(tmp_path), PublishOptions(repo, "m"))
    models = export_models(repo, "m")
    assert [m.name for m in models] == ["m__positional", "m"]
    assert models[0].files == {"1/model.pt2": b"fake model.pt2"}
    assert models[0].load_files() == {"file:1/model.pt2": b"fake model.pt2"}
    assert parse(models[1].config_text).platform == "ensemble" and list(models[1].files) == [f"1/{VERSION_MARKER}"]


def test_a_new_version_goes_to_both_models_and_the_ensemble_serves_the_newest(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(_aoti(tmp_path), PublishOptions(repo, "m"))
    publish(_aoti(tmp_path), PublishOptions(repo, "m", version=2))
    assert sorted(p.name for p in (repo / "m").iterdir() if p.is_dir()) == ["1", "2"]
    assert sorted(p.name for p in (repo / "m__positional").iterdir() if p.is_dir()) == ["1", "2"]
    assert _config(repo, "m").version_policy.latest.num_versions == 1
    assert _config(repo, "m").ensemble_scheduling.step[0].model_version == -1


def test_an_existing_positional_model_is_refused_before_tuning_and_nothing_changes(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / f"m{INNER_SUFFIX}" / "1").mkdir(parents=True)
    (repo / f"m{INNER_SUFFIX}" / "config.pbtxt").write_text('name: "m__positional"\n')
    before = tree_snapshot(repo)
    with pytest.raises(PublishError, match="'m__positional' already exists.*--overwrite"):
        check_target(repo, "m", None, False)
    check_target(repo, "m", None, False, io_names="positional")  # the bare model would not need that name
    assert tree_snapshot(repo) == before


def test_an_ensemble_is_not_replaced_by_a_new_version_of_another_platform(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(_aoti(tmp_path), PublishOptions(repo, "m"))
    before = tree_snapshot(repo)
    onnx = make_result(tmp_path / "onnx", inputs=TWO_IN, outputs=TWO_OUT)
    with pytest.raises(PublishError, match="served by ensemble"):
        publish(onnx, PublishOptions(repo, "m", version=2))
    assert tree_snapshot(repo) == before


def test_validate_finds_the_public_model_and_its_step(tmp_path: Path):
    repo = tmp_path / "repo"
    publish(_aoti(tmp_path), PublishOptions(repo, "m"))
    target = resolve_target(repo, None)  # two model folders, one public model: no --model needed
    assert target.name == "m" and target.platform == "ensemble"
    assert [t.name for t in composing_targets(target)] == ["m__positional"]


def test_the_pair_is_published_to_object_storage_and_listed_from_there(tmp_path: Path, s3):
    url = s3.url(s3.bucket())
    publish(_aoti(tmp_path), PublishOptions(url, "m", report_dir=tmp_path / "report"))
    models = export_models(url, "m")
    assert [m.name for m in models] == ["m__positional", "m"]
    assert models[0].files["1/model.pt2"] == b"fake model.pt2"
    assert parse(models[1].config_text).ensemble_scheduling.step[0].model_name == "m__positional"
    assert f"1/{VERSION_MARKER}" in models[1].files  # object storage has no empty folders
    target = resolve_target(url, None)
    assert target.name == "m" and [t.name for t in composing_targets(target)] == ["m__positional"]


def test_inner_name_stays_a_valid_model_name():
    assert inner_name("resnet-50.v2") == "resnet-50.v2__positional"


# -- one client script, two backends, a real server started as users start it -----------------------------------------

CLIENT = """
import json, sys
import numpy as np
import tritonclient.http as httpclient
client = httpclient.InferenceServerClient(sys.argv[1])
x = np.load(sys.argv[2])
inp = httpclient.InferInput("image", list(x.shape), "FP32")
inp.set_data_from_numpy(x)
out = client.infer("cnn", [inp], outputs=[httpclient.InferRequestedOutput("output__0")]).as_numpy("output__0")
np.save(sys.argv[3], out)
client.close()
"""
"""The client a user writes once: forward() argument `image` in, `output__0` out, model `cnn`."""


def start_serve(repo: Path | str, cwd: Path, env: dict | None = None, mode: str = "explicit") -> tuple[subprocess.Popen, int, int]:
    """`aitune-export serve REPO` in its own process on free loopback ports; returns it once it says it is serving."""
    from optimizer.triton.runtime.server import free_port

    http, grpc = free_port(), free_port()
    proc = subprocess.Popen([*CLI, "-q", "serve", str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
                             "--model-control-mode", mode], cwd=cwd,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ctrl_c_reaches_it)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("Ctrl-C stops it."):
            return proc, http, grpc
        if not line and proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}: {proc.stderr.read()}")
    proc.kill()
    raise AssertionError("serve did not start within 180 s")


def stop_serve(proc: subprocess.Popen) -> int:
    """SIGINT, as Ctrl-C sends; returns the exit status."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def tritonservers_on(port: int) -> list[str]:
    """Command lines of running tritonservers listening on `port` (none may outlive `serve`)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"tritonserver") and f"--http-port={port}".encode() in args:
            out.append(b" ".join(args).decode())
    return out


def cnn_input_and_eager_output() -> tuple[np.ndarray, np.ndarray]:
    """Two images for the bundled CNN and what eager PyTorch answers for them."""
    import torch

    from optimizer.examples.cnn import build

    model, _ = build()
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    with torch.no_grad():
        return x, model(torch.from_numpy(x)).numpy()


def client_answers(repo: Path, workdir: Path, x: np.ndarray) -> np.ndarray:
    """Serve `repo` with `aitune-export serve` (its own process), run CLIENT against it, stop it with SIGINT; the answer.

    Asserts that the server stopped cleanly and left no tritonserver behind."""
    (workdir / "client.py").write_text(CLIENT)
    np.save(workdir / "x.npy", x)
    proc, http, _ = start_serve(repo, workdir)
    try:
        c = subprocess.run([sys.executable, "client.py", f"127.0.0.1:{http}", "x.npy", "y.npy"], cwd=workdir, capture_output=True,
                           text=True, timeout=120)
    finally:
        code = stop_serve(proc)
    assert c.returncode == 0, c.stderr
    assert code == 0 and not tritonservers_on(http)
    return np.load(workdir / "y.npy")

def test_a_refused_ensemble_names_the_positional_model_it_leaves(tmp_path: Path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "m").write_text("not a model folder")
    with pytest.raises(PublishError, match=r"repo/m' exists and is not a directory.*The positional model 'm__positional' was published"):
        publish(_aoti(tmp_path), PublishOptions(repo, "m"))
    assert (repo / "m").read_text() == "not a model folder"  # the public name was not touched
    assert _config(repo, "m__positional").platform == "torch_aoti"
