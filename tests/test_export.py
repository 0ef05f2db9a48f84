"""`aitune-export export` end to end on the CPU: a repository Triton can parse, an artifact that matches eager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.backend import backend_named
from optimizer.model.reference import run_reference
from optimizer.model.samples import ShapePoint, generate_feed
from optimizer.model.signature import Signature
from optimizer.model.source import load_model
from optimizer.records.artifact import Artifact
from optimizer.records.triton_platforms import PLATFORMS
from optimizer.task.correctness import compare_outputs
from optimizer.triton.config.model_config import parse
from tests.conftest import run_cli, tree_snapshot

pytestmark = pytest.mark.slow


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def _matches_eager(spec: str, published_file: Path, report: dict, points: list[ShapePoint]) -> None:
    """Load the published file with its own runtime and compare with eager PyTorch."""
    result = report["result"]
    chosen = next(c for c in result["candidates"] if c["name"] == result["selected"])
    art = Artifact.from_json(chosen["artifact"])
    art.directory, art.files = str(published_file.parent), [published_file.name]
    sig = Signature.from_json(result["signature"])
    model = load_model(spec)
    gate = (chosen["correctness"] or {}).get("accuracy")  # a bf16 / INT8 winner is judged by the accuracy gate it passed
    with backend_named(art.backend, precision=art.metadata.get("precision", "fp32")).load(art, "cpu", model) as runner:
        got, want = [], []
        for i, point in enumerate(points):
            feed = generate_feed(sig, point, seed=50 + i)
            outs, ref = runner.infer(feed), run_reference(model, sig.input_names, feed)
            got.append(dict(zip(sig.output_names, outs)))
            want.append(dict(zip(sig.output_names, ref)))
            case = compare_outputs(point.label, sig.output_names, [o.dtype.name for o in sig.outputs], outs, ref)
            assert gate is not None or case.passed, case.outputs
    if gate is not None:
        from optimizer.records.accuracy import AccuracyBudget
        from optimizer.task.accuracy_gate import judge

        verdict = judge(sig.output_names, [p.label for p in points], want, got, AccuracyBudget.from_json(gate["budget"]), sig.batching)
        assert verdict.passed, verdict.reason


def test_bundled_example_end_to_end(in_tmp: Path):
    # the quick start's command with every default but the served search's budget (the default is at least 90 s; 30 s
    # still measures the rules' start and a group of the coarse pass)
    r = run_cli("export", "--precision", "auto", "--serve-search-seconds", "30", cwd=in_tmp, serve_search=True)
    assert r.returncode == 0, r.stderr
    model_dir = in_tmp / "model_repository" / "cnn"
    config = parse((model_dir / "config.pbtxt").read_text())
    assert config.name == "cnn" and config.max_batch_size >= 1
    assert list(config.input[0].dims) == [3, 64, 64] and config.input[0].name == "image"
    assert config.output[0].name == "output__0" and list(config.output[0].dims) == [10]
    assert config.instance_group[0].kind == 2  # KIND_CPU
    assert config.HasField("dynamic_batching") or config.max_batch_size == 1
    report_path = in_tmp / "aitune-reports" / "cnn" / "report.json"
    assert report_path.exists() and not (model_dir / "report.json").exists()
    report = _report(report_path)
    manifest = Path(report["published"]["kserve_manifest"])  # and the deployment beside the report, said on stdout
    assert f"KServe InferenceService: {manifest}" in r.stdout and "--load-model=cnn" in (in_tmp / manifest).read_text()
    result = report["result"]
    search = report["published"]["served_search"]
    # the served search decided the operating point (the in-process peak bounded it). The local server serves every CPU winner
    # (torch_aoti through local_serving.py's translated copy), so it is never skipped here: a skipped search fails the test.
    assert search["status"] == "searched", search.get("reason")
    assert config.max_batch_size == search["chosen"]["max_batch_size"] and config.instance_group[0].count == search["chosen"]["instances"]
    assert search["variants"][0]["stage"] == "start" and search["stand_in"]
    names = {c["name"]: c for c in result["candidates"]}
    assert {"torchscript[cpu]", "onnxruntime[cpu]"} <= set(names)
    assert result["eager"]["status"] == "passed" and result["eager"]["decision"]["profiles"]
    assert all(c["status"] in ("passed", "failed", "unavailable", "skipped") for c in names.values())
    passed = [c for c in names.values() if c["status"] == "passed"]
    assert names[result["selected"]] in passed  # every passed candidate agreed with eager and was measured
    assert all(c["correctness"]["passed"] and c["decision"]["profiles"] for c in passed)
    # past a saturation stop larger batches ran once to check they fit (the served search may try them), never profiled
    saturated = [c["decision"] for c in passed if c["decision"]["search_stop"] == "saturation"]
    assert saturated and all(d["largest_fit"] == max(d["fit_checked"], default=d["profiles"][-1]["batch_size"]) for d in saturated)
    assert any(d["fit_checked"] for d in saturated)
    assert not any(p["batch_size"] in d["fit_checked"] for d in saturated for p in d["profiles"])
    # bf16 / INT8 candidates (auto adds bf16 on a bf16 CPU) are judged by the accuracy gate, fp32 ones by the tolerances
    assert all(c["correctness"]["accuracy"]["passed"] for c in passed if "accuracy" in c["correctness"])
    assert all(c["correctness"]["max_abs"] < 1e-3 for c in passed if "accuracy" not in c["correctness"])
    platform_file = next(p.model_filename for p in PLATFORMS.values() if (p.platform or p.backend) == (config.platform or config.backend))
    published = model_dir / "1" / platform_file
    assert published.exists()
    _matches_eager("optimizer.examples.cnn:build", published, report, [ShapePoint(1, "max"), ShapePoint(7, "max")])
    assert "selected" in r.stdout and "max_batch_size" in r.stdout


def test_wrong_artifacts_are_rejected_with_their_error_and_nothing_is_published(in_tmp: Path):
    # --allow-version-mismatch: every default candidate is built and checked, whatever the local OpenVINO's version
    r = run_cli("export", "tests.fixtures.models:differs_when_exported", "--max-batch-size", "2", "--allow-version-mismatch", cwd=in_tmp)
    assert r.returncode == 1, r.stderr
    assert "no candidate can be published" in r.stderr and "Traceback" not in r.stderr
    assert not (in_tmp / "model_repository" / "differs_when_exported").exists()
    result = _report(in_tmp / "aitune-reports" / "differs_when_exported" / "report.json")["result"]
    assert result["selected"] is None
    for cand in result["candidates"]:
        assert cand["status"] == "failed" and cand["stage"] == "correctness"
        gated = "accuracy" in cand["correctness"]  # a bf16 candidate (auto on a bf16 CPU) is refused by the accuracy gate
        assert cand["reason"].startswith("rejected: accuracy gate") if gated else "max abs error" in cand["reason"] and "max rel error" in cand["reason"]
        assert cand["correctness"]["max_abs"] > 0.1


def test_existing_model_is_never_damaged_and_an_identical_rerun_comes_from_the_cache(in_tmp: Path):
    # seeded: the same weights on every call, so the identical runs below hit the cache (an unseeded model, whose
    # candidates must reuse the parent's weights, is exported by tests/test_served_search.py and others)
    args = ("export", "tests.fixtures.models:seeded_mlp", "--backend", "onnxruntime", "--max-batch-size", "2", "--eager-gate", "disabled",
            "--cache-dir", str(in_tmp / "cache"))
    assert run_cli(*args, cwd=in_tmp).returncode == 0
    repo = in_tmp / "model_repository"
    before = tree_snapshot(repo)
    r = run_cli(*args, cwd=in_tmp)
    assert r.returncode == 2 and "already exists" in r.stderr and "--version 2" in r.stderr
    assert tree_snapshot(repo) == before
    r = run_cli(*args, "--version", "2", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    assert "reused the cached build" in r.stderr  # the same model and settings: nothing is built again
    report = in_tmp / "aitune-reports" / "seeded_mlp" / "report.json"
    assert _report(report)["result"]["candidates"][0]["cached"] in ("build", "build+measure")
    assert sorted(p.name for p in (repo / "seeded_mlp").iterdir()) == ["1", "2", "config.pbtxt"]
    assert "version_policy" in (repo / "seeded_mlp" / "config.pbtxt").read_text()
    r = run_cli(*args, "--overwrite", "--no-cache", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    assert "reused" not in r.stderr and _report(report)["result"]["candidates"][0]["cached"] == ""
    assert sorted(p.name for p in (repo / "seeded_mlp").iterdir()) == ["1", "config.pbtxt"]
    assert not any(p.name.startswith(".") for p in repo.iterdir())


def test_real_allocation_failure_under_a_small_memory_budget(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:wide", "--backend", "onnxruntime", "--max-batch-size", "4096",
                "--memory-budget", "48MiB", "--eager-gate", "disabled", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    result = _report(in_tmp / "aitune-reports" / "wide" / "report.json")["result"]
    decision = result["candidates"][0]["decision"]
    assert decision["decided_by"] == "memory", decision["explanation"]
    assert decision["failure"] and "batch" in decision["failure"]
    assert decision["ceiling"] == decision["max_batch_size"] < decision["first_failure"] <= 4096
    assert result["max_batch_size"] == decision["max_batch_size"]
    config = parse((in_tmp / "model_repository" / "wide" / "config.pbtxt").read_text())
    assert config.max_batch_size == decision["max_batch_size"]
    # run_cli's --serve-search off: the in-process rules stand, and the report says the search did not run
    search = _report(in_tmp / "aitune-reports" / "wide" / "report.json")["published"]["served_search"]
    assert search["status"] == "off" and search["variants"] == []


def test_time_budget_still_measures_every_candidate_at_batch_1(in_tmp: Path):
    r = run_cli("export", "tests.fixtures.models:seeded_mlp", "--backend", "onnxruntime", "--backend", "torchscript",
                "--time-budget", "1", "--no-cache", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    result = _report(in_tmp / "aitune-reports" / "seeded_mlp" / "report.json")["result"]
    for cand in [result["eager"], *result["candidates"]]:
        assert cand["status"] == "passed", cand["reason"]
        decision = cand["decision"]
        assert decision["profiles"][0]["batch_size"] == 1
        assert decision["decided_by"] in ("time_budget", "saturation")
