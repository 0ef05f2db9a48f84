"""Same-shape batching faced honestly: would clients that pad their requests to a few bucket lengths be served better?

Triton's dynamic batcher puts only requests of equal shape in one batch (ragged batching needs backend support, which
the CPU backends lack), so traffic of mixed lengths rarely fills a batch. Padding every request to the next bucket edge
makes the shapes few. It is advised only when both hold: the served model gives the same answers for a padded request
(its outputs cut back to the unpadded request's shape) within the export's tolerances, and the padded traffic scores
PADDING_GAIN better than the traffic as it comes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any


from optimizer.model.signature import Signature
from optimizer.model.traffic import Traffic
from optimizer.records.served_search import ServedVariant
from optimizer.triton.measure.served_search.measure import request_mix
from optimizer.triton.measure.served_search.objective import robust_ratios
from optimizer.triton.measure.served_search.request import SearchRequest

if TYPE_CHECKING:
    from optimizer.triton.measure.served_search.run import SearchRun

PADDING_SHARE = 0.2
PADDING_SHARE_MOST = 0.4
"""What the padding trial keeps of the budget: a fifth, or the time the dearest variant measured so far would take, up to
two fifths (a slow model's variant can cost more than a fifth of a short budget, and the trial then measured nothing)."""
PADDING_GAIN = 0.10
"""Padding is advised when the padded traffic scores at least this much better: clients pay for it in code."""


@dataclass
class PaddingTrial:
    """What the trial found: the bucket edges, whether padded answers agree, the scores, and the advice."""

    axes: list[str]
    edges: list[int]
    answers: str = ""  # "" when padded answers agreed, else what differed
    mixed_score: float | None = None  # the best variant's score under the traffic as it comes
    padded_score: float | None = None  # the best variant's score under the padded traffic
    advised: bool = False
    why: str = ""
    point: dict[str, Any] | None = None  # advised: the variant measured best with padded requests (OperatingPoint.to_json())

    def to_json(self) -> dict[str, Any]:
        """report.json's client_padding (advised) or the reason none is advised."""
        return {"axes": self.axes, "edges": self.edges, "advised": self.advised, "answers_agree": not self.answers,
                "mixed_score": self.mixed_score, "padded_score": self.padded_score, "why": self.why,
                **({"point": self.point} if self.point else {})}


def padding_reserve(clock: Any, budget_s: float) -> float:
    """Seconds to keep for the trial (PADDING_SHARE, or the dearest variant's cost, up to PADDING_SHARE_MOST)."""
    return min(PADDING_SHARE_MOST * budget_s, max(PADDING_SHARE * budget_s, 1.1 * clock.variant_cost()))


def padding_trial(run: SearchRun, trial: PaddingTrial, request: SearchRequest, fronted: bool) -> PaddingTrial:
    """Measure the two best variants under the traffic padded to bucket edges; advise padding when the padded answers
    agreed with the unpadded ones (checked on the start) and the padded traffic scores PADDING_GAIN better (padding.py)."""
    edges = ", ".join(map(str, trial.edges))
    if trial.answers:
        trial.why = f"padded requests do not get the same answers: {trial.answers}"
        return trial
    top = run.ranked()[:2]
    if not top:
        trial.why = "no variant was measured"
        return trial
    input_data, _, rows = request_mix(run.measurer.results[top[0].point.candidate], request.workdir, public_names=fronted, padding={"edges": trial.edges},
                                      name="perf_analyzer_input_padded.json")
    measured = [v for v in run.measure_apart([v.point for v in top], replace(run.bench, input_data=input_data, rows=rows), "padded")
                if v.status == "measured"]
    if not measured:
        trial.why = "the time budget ran out before the padded traffic was measured"
        return trial
    mixed_score, padded_score, best_padded = scores(run, top, measured)
    trial.mixed_score, trial.padded_score = round(mixed_score, 4), round(padded_score, 4)
    gain = padded_score / mixed_score if mixed_score > 0 else float("inf")
    if padded_score >= (1 + PADDING_GAIN) * mixed_score:
        trial.advised = True
        trial.why = (f"padded to {edges}, the traffic scores {gain:.2f}x what it scores as it comes ({best_padded.point.label}); padded "
                     "answers, cut back to each request's length, agree within the export's tolerances")
        trial.point = best_padded.point.to_json()
    else:
        trial.why = f"padded to {edges}, the traffic scores {gain:.2f}x what it scores as it comes, under the {PADDING_GAIN:.0%} it must gain"
    return trial


def scores(run: SearchRun, mixed: list[ServedVariant], padded: list[ServedVariant]) -> tuple[float, float, ServedVariant]:
    """The objective's score of the best mixed-traffic variant and of the best padded one, measured on one scale."""
    objective = run.objective
    if objective.robust:
        ratios = robust_ratios({("m", i): v.curve for i, v in enumerate(mixed)} | {("p", i): v.curve for i, v in enumerate(padded)}, run.percentile)
        best_p = max(range(len(padded)), key=lambda i: ratios[("p", i)][0])
        return ratios[("m", 0)][0], ratios[("p", best_p)][0], padded[best_p]
    top_p = max(padded, key=lambda v: (v.meets_budget is not False, v.throughput or 0.0))
    fits = (lambda v: v.meets_budget is not False) if objective.latency_budget_ms is not None else (lambda v: True)
    mixed_t = mixed[0].throughput or 0.0 if fits(mixed[0]) else 0.0
    padded_t = top_p.throughput or 0.0 if fits(top_p) else 0.0
    return mixed_t, padded_t, top_p


def padded_answers(run: SearchRun, name: str, traffic: Traffic, sig: Signature, edges: list[int], fronted: bool) -> str:
    """The loaded variant `name`'s answers to requests of distinct shapes against its answers to them padded ("" when
    they agree, cut back to each request's own shapes)."""
    from optimizer.records.correctness import tolerances_from_json
    from optimizer.triton.measure.answers import accuracy_gate_of

    by_shape = {}
    for req, pad in zip(traffic.requests, traffic.padded(sig, edges).requests):
        key = tuple(a.shape for a in req.values())
        if key not in by_shape and any(a.shape != b.shape for a, b in zip(req.values(), pad.values())):
            by_shape[key] = (req, pad)
    renamed = {} if fronted else {original: served for served, original in run.measurer.renamed.items()}
    pairs = [({renamed.get(k, k): v for k, v in a.items()}, {renamed.get(k, k): v for k, v in b.items()}) for a, b in by_shape.values()]
    if not pairs:
        return ""
    result = run.measurer.result
    gate = accuracy_gate_of(result)
    return run.bench.padded_answers(name, pairs, tolerances_from_json(result.tolerances), gate.cosine if gate is not None else None)
