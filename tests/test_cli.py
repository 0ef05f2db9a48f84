"""The command line as users meet it: fast help, backend listing, one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from optimizer.cli import main
from tests.conftest import ROOT, run_cli, tree_snapshot

HEAVY = ("torch", "onnxruntime", "openvino", "tensorrt", "onnx", "matplotlib")


def test_cli_import_and_help_load_no_heavy_library():
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom optimizer.cli import main\n"
        "r = CliRunner().invoke(main, ['export', '--help']); assert r.exit_code == 0, r.output\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_backends_does_not_import_torch_unless_asked():
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom optimizer.cli import main\n"
        "r = CliRunner().invoke(main, ['backends']); assert r.exit_code == 0, r.output\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_help_and_backends_answer_quickly():
    # generous bound for a shared 2-core machine; the budget users see is 2 s
    for args in (["--help"], ["backends"]):
        t0 = time.perf_counter()
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        assert time.perf_counter() - t0 < 4.0


def test_backends_lists_every_backend_with_a_reason_when_unavailable():
    """fp16 on the CPU runs nowhere, on any machine: every backend is listed as unavailable, each with a one-sentence reason.
    (It asked for --device cuda and checked `reason.endswith(".") or reason`, which any non-empty reason passes.)"""
    from optimizer.backend import BACKENDS

    r = CliRunner().invoke(main, ["backends", "--json", "--precision", "fp16"])
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.output)["backends"]}
    assert set(rows) == set(BACKENDS)
    assert [name for name, row in rows.items() if row["available"]] == []
    for name, row in rows.items():
        assert row["reason"].startswith(name) and row["reason"].endswith(".") and "\n" not in row["reason"], row


def test_backends_refuses_a_device_that_cannot_exist_in_one_line():
    r = CliRunner().invoke(main, ["backends", "--device", "tpu"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == "error: --device 'tpu' is not cpu or cuda[:N]; e.g. --device cuda:0."


def test_every_command_and_option_has_help():
    for name, cmd in main.commands.items():
        assert cmd.help, name
        for param in cmd.params:
            if param.param_type_name == "option":
                assert param.help, f"{name} {param.opts}"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["missing/model.onnx"], "does not exist"),
        (["tests.fixtures.models:nope"], "has no attribute 'nope'"),
        (["tests.fixtures.models:raises"], "raised RuntimeError: weights not found"),
        (["tests.fixtures.models:not_a_module"], "not a torch.nn.Module"),
        (["--input", "image:float32"], "three ':'-separated fields"),
        (["--input", "image:complex7:3x64x64"], "unknown dtype 'complex7'"),
        (["--input", "img:float32:3x64x64"], "model's inputs are: image"),
        (["--repository", "a_file.txt"], "is a file, not a directory"),
        (["--name", "a/b"], "not one path component"),
        (["--name", ".."], "not one path component"),
        (["--name", "my model"], "not one path component"),
        (["--name", " "], "not one path component"),
        (["--backend", "tensorflow"], "unknown backend"),
        (["--strategy", "latency-budget"], "needs --latency-budget-ms"),
        (["--max-batch-size", "lots"], "not a number or 'auto'"),
        (["--memory-budget", "plenty"], "is not a size"),
        (["--samples", "nope.npz"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, fragment, in_tmp: Path):
    (in_tmp / "a_file.txt").write_text("not a repository")
    before = tree_snapshot(in_tmp)
    r = run_cli("export", *args, cwd=in_tmp)
    assert r.returncode == 2, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr
    assert fragment in errors[0]
    assert "Traceback" not in r.stderr
    assert tree_snapshot(in_tmp) == before


def test_unknown_option_is_a_usage_error(in_tmp: Path):
    r = run_cli("export", "--no-such-flag", cwd=in_tmp)
    assert r.returncode == 2 and "No such option" in r.stderr


def test_the_max_batch_line_names_the_published_max_when_the_served_search_chose_another(tmp_path: Path):
    """mobilenet_v3_small: stdout said "max_batch_size 32: the throughput peak ..." above a config that published 4."""
    from optimizer.cli.output import max_batch_line
    from tests.triton_records import make_result

    result = make_result(tmp_path, max_batch=8)
    line = max_batch_line(result, {"max_batch_size": 4})
    assert line.startswith("published max_batch_size 4: the served search measured it best (the in-process rule said 8: ")
    assert max_batch_line(result, {"max_batch_size": 8}).startswith("max_batch_size 8: ")
    assert max_batch_line(result, None).startswith("max_batch_size 8: ")
    result.max_batch_size = 4  # the rules' max of a padding backend, published with no served search
    assert max_batch_line(result, {"max_batch_size": 4}).startswith("published max_batch_size 4: the rules' max for a backend that computes")
