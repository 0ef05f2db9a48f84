"""Every bad input is answered with one clear line and the right exit status, and nothing on disk changes.

(More cases live in test_cli.py; together they cover model sources, specs, samples, paths,
settings files, templates and models that cannot be checked.)
"""

from __future__ import annotations

from pathlib import Path

import shutil

import numpy as np
import pytest

from tests.conftest import FIXTURES, run_cli, tree_snapshot


def _one_error(stderr: str) -> str:
    errors = [l for l in stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.fixture
def workspace(in_tmp: Path) -> Path:
    np.savez(in_tmp / "wrong_shape.npz", image=np.zeros((2, 3, 32, 32), np.float32))
    np.savez(in_tmp / "wrong_dtype.npz", image=np.zeros((2, 3, 64, 64), np.float64))
    np.savez(in_tmp / "wrong_name.npz", img=np.zeros((2, 3, 64, 64), np.float32))
    np.savez(in_tmp / "mixed_batch.npz", a=np.zeros((2, 8), np.float32), b=np.zeros((3, 8), np.float32))
    (in_tmp / "corrupt.npz").write_bytes(b"not a zip file")
    (in_tmp / "unknown_key.toml").write_text('repository = "repo"\nmax_batch = 8\n')
    (in_tmp / "bad.toml").write_text("repository = \n")
    (in_tmp / "binary.toml").write_bytes(b"\xff\xfe\x00repository")
    (in_tmp / "wrong_type.toml").write_text("backend = 3\n")
    (in_tmp / "existing_repo").mkdir()
    (in_tmp / "report_file").write_text("x")
    (in_tmp / "model.onnx").write_bytes(b"\x00garbage")
    return in_tmp


CASES = [
    (["--samples", "wrong_shape.npz"], 2, "axis 2 is 32, outside 64"),
    (["--samples", "wrong_dtype.npz"], 2, "is float64, expected float32"),
    (["--samples", "wrong_name.npz"], 2, "do not match the model's ['image'] (missing image) (unknown img); name each array after the model's input"),
    (["tests.fixtures.models:two_inputs", "--samples", "mixed_batch.npz"], 2, "different batch sizes"),
    (["--samples", "corrupt.npz"], 2, "not a readable .npz"),
    (["--config", "unknown_key.toml"], 2, "unknown key 'max_batch'"),
    (["--config", "bad.toml"], 2, "not valid TOML"),
    (["--config", "binary.toml"], 2, "cannot be read"),
    (["--config", "wrong_type.toml"], 2, "'backend' must be a string or a list"),
    (["--config", "missing.toml"], 2, "does not exist"),
    (["--template-dir", "no_such_dir"], 2, "is not a directory"),
    (["--report-dir", "existing_repo/reports", "--repository", "existing_repo"], 2, "inside the repository"),
    (["--report-dir", "report_file"], 2, "is a file"),
    (["--repository", "/proc/aitune-repo"], 2, "choose a writable --repository"),
    (["--version", "0"], 2, "must be >= 1"),
    (["--max-batch-size", "0"], 2, "--max-batch-size 0 must be from 1 to"),
    (["--max-batch-size", "100000000000000"], 2, "must be from 1 to 2147483647 (Triton's int32)"),
    (["--name", ""], 2, "model name '' is not one path component"),
    (["--concurrency", "0"], 2, "--concurrency 0 must be from 1"),
    (["--device", "tpu"], 2, "is not cpu or cuda"),
    (["--workflow", "jit"], 2, "--workflow jit measures only the batch sizes recorded in --samples"),
    (["--strategy", "one-backend", "--backend", "onnxruntime", "--backend", "torchscript"], 2, "exactly one --backend"),
    (["model.onnx"], 2, "not a readable ONNX model"),
    (["tests.fixtures.models:produces_nan"], 2, "returns NaN or infinity"),
    (["tests.fixtures.models:two_inputs", "--value-range", "c:0:1"], 2, "model's inputs are: a, b"),
    (["--output-names", "a,b"], 2, "gives 2 names but the model returns 1"),
    (["--input", "image:float32:3x64x64", "--input", "image:float32:3x64x64"], 2, "names an input twice"),
]


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available() and not Path("/dev/nvidiactl").exists()


if _no_gpu():  # where there is a GPU, --device cuda is a real run
    CASES.append((["--device", "cuda"], 2, "--device cuda: torch reports no CUDA device"))


@pytest.mark.parametrize("args, code, fragment", CASES, ids=[" ".join(c[0])[:60] or "empty" for c in CASES])
def test_bad_input(args, code, fragment, workspace: Path):
    before = tree_snapshot(workspace)
    r = run_cli("export", *args, cwd=workspace)
    assert r.returncode == code, r.stderr
    assert fragment in _one_error(r.stderr)
    assert tree_snapshot(workspace) == before, "a rejected run must not write anything"


@pytest.mark.slow
def test_data_dependent_control_flow_is_a_failed_check_with_reasons(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:data_dependent", "--max-batch-size", "2", "--no-cache", cwd=in_tmp)
    assert r.returncode == 1, r.stderr
    line = _one_error(r.stderr)
    assert "no candidate can be published" in line
    assert "torchscript[cpu]: failed" in line and "onnxruntime[cpu]: failed" in line
    assert not (in_tmp / "model_repository").exists()


def test_tolerance_specs_are_checked():
    from optimizer.errors import SettingsError
    from optimizer.records.correctness import Tolerance
    from optimizer.task.correctness import parse_tolerances

    assert parse_tolerances(["1e-3", "logits=1e-2,1e-1"]) == {"": Tolerance(1e-3, 1e-3), "logits": Tolerance(1e-2, 1e-1)}
    for bad in ("tiny", "x=-1", "1,2,3", "nan"):
        with pytest.raises(SettingsError, match="is not \\[NAME=\\]ATOL\\[,RTOL\\]"):
            parse_tolerances([bad])


@pytest.mark.slow
def test_a_looser_tolerance_admits_a_candidate_and_is_recorded(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:differs_when_exported", "--backend", "onnxruntime", "--tolerance", "10",
                "--max-batch-size", "2", "--eager-gate", "disabled", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    import json

    result = json.loads((in_tmp / "aitune-reports" / "differs_when_exported" / "report.json").read_text())["result"]
    assert result["selected"] == "onnxruntime[cpu]" and result["tolerances"] == {"": [10.0, 10.0]}


def _everything_under(path: Path) -> list[str]:
    """Every file and folder under path (tree_snapshot sees files only, and a refused URL must not leave even an empty
    folder such as 'ftp:')."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if ".cache" not in p.relative_to(path).parts)


@pytest.mark.parametrize("command", ["export", "publish", "export-many"])
def test_a_repository_url_triton_cannot_read_is_refused_by_every_command_that_publishes(command: str, in_tmp: Path):
    """`--repository ftp://host/repo` is refused (exit 2, one line) before anything is written: read as a path, it would
    publish into a local folder named 'ftp:' and exit 0."""
    url = "ftp://host/repo"
    shutil.copy(FIXTURES / "report_cnn.json", in_tmp / "report.json")
    (in_tmp / "plan.toml").write_text(f'repository = "{url}"\n[models.cnn]\nmodel = "optimizer.examples.cnn:build"\n')
    before = _everything_under(in_tmp)
    args = {"export": ["export", "--repository", url], "publish": ["publish", "report.json", "--repository", url],
            "export-many": ["export-many", "plan.toml"]}[command]
    r = run_cli(*args, cwd=in_tmp)
    assert r.returncode == 2, r.stderr
    line = _one_error(r.stderr)
    assert "'ftp://host/repo': ftp:// is not a model repository Triton can read" in line
    assert "a local folder" in line and "s3://BUCKET/PREFIX" in line  # what is supported
    assert _everything_under(in_tmp) == before, "nothing may be written, not even an empty folder"


@pytest.mark.parametrize("value, fragment", [
    ("gs://bucket/models", "gs:// (Google Cloud Storage) repositories are not supported yet"),
    ("as://account/container/models", "as:// (Azure Storage) repositories are not supported yet"),
    ("file:///srv/models", "file:// is not a model repository Triton can read"),
    ("https://host/models", "https:// is not a model repository Triton can read"),
    ("S3://bucket/models", "S3:// is not a model repository Triton can read"),  # Triton's scheme is lower-case
])
def test_other_schemes_are_refused_naming_what_is_supported(value: str, fragment: str):
    from optimizer.errors import SettingsError
    from optimizer.triton.repository.publish import repository_argument

    with pytest.raises(SettingsError) as err:
        repository_argument(value)
    assert fragment in str(err.value) and "s3://BUCKET/PREFIX" in str(err.value) and "\n" not in str(err.value)


def test_local_paths_and_s3_urls_still_pass():
    from optimizer.triton.repository.publish import repository_argument

    assert repository_argument("model_repository") == Path("model_repository")
    assert repository_argument("/srv/models:v2/repo") == Path("/srv/models:v2/repo")  # a colon inside a folder name is no scheme
    assert repository_argument("s3://bucket/models") == "s3://bucket/models"
    assert repository_argument(Path("s3://127.0.0.1:9000/bucket/models")) == "s3://127.0.0.1:9000/bucket/models"
