"""Close calls: the paired verdict (pure), and a real paired re-measurement in one child process."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.task.paired import MAX_ROUNDS, PREFERENCES, PairedComparison, close_contenders, decide, needs_more_rounds, ratio_interval
from tests.triton_records import decision, profile


def test_a_consistent_gain_across_rounds_is_a_win():
    ratio, low, high = ratio_interval([110, 112, 109, 111, 110, 113], [100, 101, 99, 100, 100, 102])
    assert 1.09 < ratio < 1.12 and low > 1.0


AOTI, ORT = "torch-aoti[cpu]", "onnxruntime[cpu]"
BACKENDS = {AOTI: "torch-aoti", ORT: "onnxruntime"}


def _decided(leader: str, rounds: dict[str, list[float]]) -> PairedComparison:
    return decide(PairedComparison(leader, {}, rounds), BACKENDS)


def test_inside_a_tie_the_faster_one_is_kept_not_the_order():
    """ONNX Runtime is 12.5% slower in four of six rounds (a median of 0.875x); two bursts make its interval include 1.
    Speed decides, not the order: an interval that includes 1 is no reason to publish the slower backend."""
    c = _decided(AOTI, {AOTI: [100.0] * 6, ORT: [125, 85, 88, 86, 87, 120]})
    low, high = c.ratios[ORT][1:]
    assert low < 1.0 < high  # a tie by the interval
    assert c.winner == AOTI and c.verdict == "leader" and c.fastest == AOTI
    assert "does not apply" in c.summary and "0.875x" in c.summary
    assert needs_more_rounds(c.rounds, AOTI, BACKENDS)  # too wide to tell whether it is within 5%: the child measures more


def test_a_preferred_backend_more_than_5_percent_slower_is_never_published():
    """The same pattern over the most rounds allowed: the interval is narrower, the median still 0.875x."""
    rounds = {AOTI: [100.0] * MAX_ROUNDS, ORT: [125, 85, 88, 86, 87, 120] * (MAX_ROUNDS // 6)}
    c = _decided(AOTI, rounds)
    assert c.winner == AOTI and c.preference["standing"] == "slower" and "more than 5% slower" in c.summary
    assert not needs_more_rounds(rounds, AOTI, BACKENDS)  # bounded: no rounds beyond MAX_ROUNDS


def test_a_challenger_faster_by_its_median_is_kept_even_when_its_interval_includes_1():
    """torch-aoti 25-30% faster in half the rounds, 3-5% slower in the others: its median decides, so the leader, ONNX
    Runtime, is not kept on a tie by the interval."""
    c = _decided(ORT, {ORT: [100.0] * 6, AOTI: [130, 95, 125, 97, 128, 96]})
    assert c.ratios[AOTI][1] < 1.0 < c.ratios[AOTI][2]
    assert c.winner == AOTI and c.verdict == "challenger" and "the faster one is kept" in c.summary


def test_a_preferred_backend_within_5_percent_is_published_with_its_reason():
    c = _decided(AOTI, {AOTI: [100, 101, 99, 100, 102, 100], ORT: [98, 99, 97, 98, 99, 98]})
    assert c.winner == ORT and c.verdict == "preferred" and c.fastest == AOTI
    assert 0.97 < c.preference["median"] < 0.99 and c.preference["interval"][0] >= 0.95
    assert PREFERENCES["onnxruntime"] in c.summary and "within 5%" in c.summary  # the reason is what report.md shows
    assert not needs_more_rounds(c.rounds, AOTI, BACKENDS)


def test_more_rounds_are_asked_only_where_a_preference_could_apply():
    noisy = {AOTI: [100.0] * 6, ORT: [125, 85, 88, 86, 87, 120]}
    assert needs_more_rounds(noisy, AOTI, BACKENDS)
    twins = {"torch-aoti-a": noisy[AOTI], "torch-aoti-b": noisy[ORT]}
    assert not needs_more_rounds(twins, "torch-aoti-a", {n: "torch-aoti" for n in twins})  # no stated reason either way
    ort_ahead = {ORT: [100.0] * 6, AOTI: [80, 81, 79, 80, 82, 80]}
    assert not needs_more_rounds(ort_ahead, ORT, BACKENDS)  # the preferred one is the fastest already


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
@pytest.mark.serial
def test_an_artifact_against_itself_is_a_tie_in_a_real_paired_measurement(in_tmp: Path):
    """Two names for one ONNX Runtime artifact, timed alternately in a real child process: never a win.

    Serial: its 0.1 s rounds bound the A/A ratio at 0.8-1.25, which another test worker measuring on the same cores can
    push outside."""
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
    twin_ahead = sorted(t / o for t, o in zip(rounds[twin.name], rounds[one.name]))
    faster = twin.name if (twin_ahead[2] + twin_ahead[3]) / 2 > 1.0 else one.name  # the median of six per-round ratios
    assert c.winner == faster and c.verdict == ("leader" if faster == one.name else "challenger")  # speed decides, not the order
    assert not c.preference  # one backend: no stated reason to prefer either, so no rounds beyond the planned six


def test_a_tie_never_publishes_a_candidate_that_does_not_beat_eager():
    from optimizer.records.candidate import Candidate
    from optimizer.tune_strategy import MaxThroughputStrategy

    def cand(name, backend, tp):
        return Candidate(name, backend, "cpu", status="passed", decision=decision(4, 4, [profile(4, 1.0, tp)]))

    aoti, ort, eager = cand("torch-aoti[cpu]", "torch-aoti", 120.0), cand("onnxruntime[cpu]", "onnxruntime", 95.0), cand("torch-eager[cpu]", "torch-eager", 100.0)
    tie = PairedComparison("torch-aoti[cpu]", {}, {}, winner="onnxruntime[cpu]", verdict="preferred", summary="a tie")
    best, why = MaxThroughputStrategy()._select([aoti, ort], eager, [], tie)
    assert best is aoti  # onnxruntime measured below eager: the gate keeps the leader
    assert "onnxruntime[cpu] is not published: its separate measurement" in why  # and the reason says so
    clearly = PairedComparison("torch-aoti[cpu]", {}, {}, {"onnxruntime[cpu]": [2.61, 1.55, 4.39]}, winner="onnxruntime[cpu]",
                               verdict="challenger", summary="onnxruntime[cpu] is faster")
    best, why = MaxThroughputStrategy()._select([aoti, ort], eager, [], clearly)
    assert best is ort  # its paired interval lies above the leader, which beats eager: one noisy number does not override it
    faster_ort = cand("onnxruntime[cpu]", "onnxruntime", 110.0)
    best, why = MaxThroughputStrategy()._select([aoti, faster_ort], eager, [], tie)
    assert best is faster_ort and why.startswith("a tie")
