"""Close calls: the paired verdict (pure), and a real paired re-measurement in one child process."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.task.paired import PairedComparison, close_contenders, decide, ratio_interval
from tests.triton_records import decision, profile


def test_a_consistent_gain_across_rounds_is_a_win():
    ratio, low, high = ratio_interval([110, 112, 109, 111, 110, 113], [100, 101, 99, 100, 100, 102])
    assert 1.09 < ratio < 1.12 and low > 1.0


def test_a_gain_that_flips_between_rounds_is_a_tie_and_the_tie_rule_decides():
    c = PairedComparison("torch-aoti[cpu]", {"torch-aoti[cpu]": 8, "onnxruntime[cpu]": 4},
                         {"torch-aoti[cpu]": [100, 100, 100, 100, 100, 100], "onnxruntime[cpu]": [120, 85, 115, 88, 110, 90]})
    decide(c, {"torch-aoti[cpu]": "torch-aoti", "onnxruntime[cpu]": "onnxruntime"})
    assert c.verdict == "tie" and c.winner == "onnxruntime[cpu]"
    assert "tie rule" in c.summary and "onnxruntime[cpu]" in c.summary


def test_the_leader_stays_when_it_is_clearly_ahead():
    c = PairedComparison("onnxruntime[cpu]", {}, {"onnxruntime[cpu]": [100.0] * 6, "torch-aoti[cpu]": [80, 81, 79, 80, 82, 80]})
    decide(c, {"onnxruntime[cpu]": "onnxruntime", "torch-aoti[cpu]": "torch-aoti"})
    assert c.verdict == "leader" and c.winner == "onnxruntime[cpu]" and c.ratios["torch-aoti[cpu]"][2] < 1.0


def test_a_challenger_measured_faster_every_round_wins_even_against_the_tie_rule():
    c = PairedComparison("onnxruntime[cpu]", {}, {"onnxruntime[cpu]": [100.0] * 6, "torch-aoti[cpu]": [130, 128, 131, 129, 130, 132]})
    decide(c, {"onnxruntime[cpu]": "onnxruntime", "torch-aoti[cpu]": "torch-aoti"})
    assert c.verdict == "challenger" and c.winner == "torch-aoti[cpu]"


def test_only_candidates_within_the_margin_are_re_measured():
    from optimizer.records.candidate import Candidate

    def cand(name, tp):
        return Candidate(name, name, "cpu", status="passed", decision=decision(4, 4, [profile(4, 1.0, tp)]))

    lead, near, far = cand("a", 100.0), cand("b", 80.0), cand("c", 60.0)
    assert [c.name for c in close_contenders([far, near, lead], lead)] == ["a", "b"]


@pytest.mark.slow
def test_an_artifact_against_itself_is_a_tie_in_a_real_paired_measurement(in_tmp: Path):
    """Two names for one ONNX Runtime artifact, timed alternately in a real child process: never a win."""
    import json

    from optimizer.records.candidate import Candidate
    from optimizer.task.isolation import run_isolated
    from optimizer.task.paired import PairedComparison, decide
    from tests.conftest import run_cli

    r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled", "--max-batch-size", "4", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    doc = json.loads((in_tmp / "aitune-reports" / "mlp" / "report.json").read_text())
    result = doc["result"]
    one = Candidate.from_json(result["candidates"][0])
    twin = Candidate.from_json({**result["candidates"][0], "name": "twin[cpu]"})
    payload = {"candidates": [one.to_json(), twin.to_json()], "batches": {one.name: 4, twin.name: 4}, "signature": result["signature"],
               "profile_feed": result["reference"]["profile_feed"], "source": result["source"], "state_dict": None,
               "backend_settings": {}, "rounds": 6, "window_s": 0.1}
    outcome = run_isolated("optimizer.task.paired:compare_candidates", payload, in_tmp / "paired", 300, "compare")
    assert outcome.ok, outcome.reason
    rounds = outcome.value["rounds"]
    assert len(rounds[one.name]) == len(rounds[twin.name]) == 6 and all(t > 0 for t in rounds[one.name])
    c = decide(PairedComparison(one.name, payload["batches"], rounds), {one.name: "onnxruntime", twin.name: "onnxruntime"})
    ratio, low, high = c.ratios[twin.name]
    assert 0.8 < ratio < 1.25 and low <= ratio <= high  # paired rounds of one artifact agree with each other
    assert c.winner in (one.name, twin.name) and c.summary


def test_a_tie_never_publishes_a_candidate_that_does_not_beat_eager():
    from optimizer.records.candidate import Candidate
    from optimizer.tune_strategy import MaxThroughputStrategy

    def cand(name, backend, tp):
        return Candidate(name, backend, "cpu", status="passed", decision=decision(4, 4, [profile(4, 1.0, tp)]))

    aoti, ort, eager = cand("torch-aoti[cpu]", "torch-aoti", 120.0), cand("onnxruntime[cpu]", "onnxruntime", 95.0), cand("torch-eager[cpu]", "torch-eager", 100.0)
    tie = PairedComparison("torch-aoti[cpu]", {}, {}, winner="onnxruntime[cpu]", verdict="tie", summary="a tie")
    best, why = MaxThroughputStrategy()._select([aoti, ort], eager, [], tie)
    assert best is aoti  # onnxruntime measured below eager: the gate keeps the leader
    faster_ort = cand("onnxruntime[cpu]", "onnxruntime", 110.0)
    best, why = MaxThroughputStrategy()._select([aoti, faster_ort], eager, [], tie)
    assert best is faster_ort and why.startswith("a tie")
