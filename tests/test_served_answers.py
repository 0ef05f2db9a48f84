"""The served search's answer check judges a winner by the measure it passed in-process (no server needed).

A bf16 or INT8 winner passed the accuracy gate in-process, not the elementwise tolerances: held to those at the served
start check, the search would refuse it as "answers are wrong" and be skipped, while `validate` of the same repository
passes it by the accuracy gate. Both judge it by the gate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from optimizer.model.samples import save_feeds
from optimizer.records.accuracy import AccuracyBudget, AccuracyReport
from optimizer.records.correctness import CorrectnessReport
from optimizer.triton.measure.served_search.answers import wrong_answers
from optimizer.triton.measure import answers as checks
from tests.triton_records import make_result, tensor


class _Client:
    def close(self) -> None:
        pass


def _result(tmp_path: Path, gated: bool):
    """A finished run with saved samples and reference outputs; `gated`: its winner passed the bf16 accuracy gate."""
    result = make_result(tmp_path, platform="openvino", inputs=(tensor("x", "float32", "16"),),
                         outputs=(tensor("output__0", "float32", "64"),))
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((n, 16)).astype(np.float32)} for n in (1, 3)]
    outputs = [{"output__0": rng.standard_normal((n, 64)).astype(np.float32) * 4} for n in (1, 3)]
    save_feeds(Path(result.reference.feeds), feeds)
    save_feeds(Path(result.reference.outputs), outputs)
    result = replace(result, reference=replace(result.reference, points=["batch=1", "batch=3"]))
    if gated:
        cand = replace(result.candidates[0], correctness=CorrectnessReport(accuracy=AccuracyReport(AccuracyBudget())))
        result = replace(result, candidates=[cand])
    return result, outputs


def _serve_with_error(monkeypatch, outputs, error: float) -> None:
    """The server answers each saved sample with its reference output off by `error` in one element per row."""
    import optimizer.triton.runtime.server as server
    import optimizer.triton.measure.client as client

    monkeypatch.setattr(server, "open_client", lambda protocol, url, timeout_s: _Client())
    config = {"name": "m", "max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["16"]}],
              "output": [{"name": "output__0", "data_type": "TYPE_FP32", "dims": ["64"]}]}
    monkeypatch.setattr(client, "served_config", lambda c, name: config)
    by_rows = {o["output__0"].shape[0]: o["output__0"] for o in outputs}

    def infer_batched(c, name, served, feed):
        answer = by_rows[feed["x"].shape[0]].copy()
        answer[:, 0] += error
        return [answer]

    monkeypatch.setattr(checks, "infer_batched", infer_batched)


def test_a_bf16_winner_within_its_accuracy_gate_is_not_refused_as_wrong(monkeypatch, tmp_path: Path):
    result, outputs = _result(tmp_path, gated=True)
    _serve_with_error(monkeypatch, outputs, 0.1)
    assert wrong_answers(result, "grpc", "127.0.0.1:1", 5.0, "m", {}, False) == ""


def test_a_bf16_winner_outside_its_accuracy_gate_is_refused(monkeypatch, tmp_path: Path):
    result, outputs = _result(tmp_path, gated=True)
    _serve_with_error(monkeypatch, outputs, 40.0)
    assert "accuracy gate" in wrong_answers(result, "grpc", "127.0.0.1:1", 5.0, "m", {}, False)


def test_an_fp32_winner_is_held_to_the_elementwise_tolerances(monkeypatch, tmp_path: Path):
    result, outputs = _result(tmp_path, gated=False)
    _serve_with_error(monkeypatch, outputs, 0.1)
    assert "max abs error 0.1" in wrong_answers(result, "grpc", "127.0.0.1:1", 5.0, "m", {}, False)


def test_a_config_published_after_wrong_served_answers_carries_a_warning(monkeypatch, tmp_path: Path):
    """When the local server answers the start variant wrongly, the search is skipped and the in-process rules are
    published with a warning that says so and names `aitune-export validate`, not only a 'served search skipped' line;
    a search skipped for another reason adds no such warning."""
    from types import SimpleNamespace

    import optimizer.triton.measure.served_search as served
    from optimizer.app.export import _serve_search
    from optimizer.records.served_search import ServedSearch
    from optimizer.settings import ExportSettings

    reason = ("the in-process rules' config could not be measured in the local server: its answers are wrong: output "
              "'output__0' at batch=3: max abs error 0.101, max rel error 5.95 (atol 0.05, rtol 0.05)")
    monkeypatch.setattr(served, "served_search", lambda *a, **k: ServedSearch(status="skipped", reason=reason))
    result = make_result(tmp_path)
    search = _serve_search(ExportSettings(serve_search_seconds=20), SimpleNamespace(cache_root=tmp_path, server=None, load=(None, None), user_max=None),
                           result, None, tmp_path / "work", lambda event: None)
    assert search.reason == reason
    assert [w for w in result.warnings if "its answers are wrong" in w and "aitune-export validate" in w]
    monkeypatch.setattr(served, "served_search", lambda *a, **k: ServedSearch(status="off", reason="the budget ran out"))
    result = make_result(tmp_path / "other")
    _serve_search(ExportSettings(serve_search_seconds=20), SimpleNamespace(cache_root=tmp_path, server=None, load=(None, None), user_max=None),
                  result, None, tmp_path / "work", lambda event: None)
    assert not result.warnings
