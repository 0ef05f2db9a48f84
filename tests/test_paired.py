"""Close calls: the paired verdict (pure), and a real paired re-measurement in one child process."""

from __future__ import annotations

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
