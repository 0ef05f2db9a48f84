"""Close calls settled by paired, interleaved measurement: noise must not pick the backend.

Candidates are measured one after another, minutes apart, so background load that comes and goes can
put any of them ahead. The leader and every candidate within CLOSE_MARGIN of it are loaded into one
fresh process and timed alternately at their own peak batch, in short rounds (the order flips every
round). Each round gives a throughput ratio against the leader taken under the same load; their
geometric mean and a 95% confidence interval decide. When the interval straddles 1 it is a tie, and
the tie rule decides: TIE_ORDER, a documented preference for what is cheaper to load and serve.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optimizer.records.candidate import Candidate

log = logging.getLogger(__name__)

CLOSE_MARGIN = 0.25
"""Candidates whose measured throughput is within 25% of the leader's are re-measured against it."""
ROUNDS = 6
WINDOW_S = 0.3
TIE_ORDER = ("tensorrt", "onnxruntime-trt", "onnxruntime", "openvino", "torchscript", "torch-aoti")
"""The tie rule, earlier first: ONNX-based runtimes load in a fraction of a second and keep torch out of the server;
OpenVINO next; TorchScript before torch_aoti, which Triton calls Beta and which needs the server's libtorch to match
the torch that compiled it."""
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}
"""Student's t at 97.5% by degrees of freedom (a 95% two-sided interval); 1.96 beyond."""


@dataclass
class PairedComparison:
    """Per-round throughputs of each contender and what they decided."""

    leader: str
    batches: dict[str, int]
    rounds: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)  # challenger -> [geometric mean, ci low, ci high] against the leader
    winner: str = ""
    verdict: str = ""  # "leader", "challenger" or "tie"
    summary: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def close_contenders(passed: list[Candidate], leader: Candidate) -> list[Candidate]:
    """The leader first, then every other passed candidate within CLOSE_MARGIN of its throughput."""
    best = leader.best_throughput
    return [leader] + [c for c in passed if c is not leader and c.best_throughput >= (1 - CLOSE_MARGIN) * best]


def ratio_interval(challenger: list[float], leader: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the per-round ratios challenger/leader and its 95% confidence interval."""
    logs = [math.log(c / l) for c, l in zip(challenger, leader) if c > 0 and l > 0]
    if not logs:
        return 0.0, 0.0, 0.0
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1)) if n > 1 else float("inf")
    half = _T975.get(n - 1, 1.96) * sd / math.sqrt(n) if n > 1 else float("inf")
    return math.exp(mean), math.exp(mean - half) if math.isfinite(half) else 0.0, math.exp(mean + half) if math.isfinite(half) else float("inf")


def decide(comparison: PairedComparison, backends: dict[str, str]) -> PairedComparison:
    """Fill in the verdict: a challenger whose interval lies above 1 wins (the largest ratio); else those whose
    interval straddles 1 tie with the leader and TIE_ORDER picks among them."""
    leader = comparison.leader
    above, tied = [], [leader]
    for name, rounds in comparison.rounds.items():
        if name == leader:
            continue
        ratio, low, high = ratio_interval(rounds, comparison.rounds[leader])
        comparison.ratios[name] = [round(ratio, 4), round(low, 4), round(high, 4)]
        if low > 1.0:
            above.append((ratio, name))
        elif high >= 1.0:
            tied.append(name)
    parts = [f"{n} {r[0]:.2f}x [{r[1]:.2f}, {r[2]:.2f}]" for n, r in comparison.ratios.items()]
    measured = f"paired re-measurement ({len(comparison.rounds[leader])} interleaved rounds; against {leader}: {', '.join(parts)})"
    if above:
        comparison.winner, comparison.verdict = max(above)[1], "challenger"
        comparison.summary = f"{comparison.winner} is faster than {leader} in a {measured}"
    elif len(tied) > 1:
        rank = {b: i for i, b in enumerate(TIE_ORDER)}
        comparison.winner = min(tied, key=lambda n: (rank.get(backends.get(n, ""), len(rank)), tied.index(n)))
        comparison.verdict = "tie"
        comparison.summary = (f"{', '.join(tied)} tie in a {measured}: the interval includes 1, so the tie rule decides "
                              f"({comparison.winner}: the cheaper one to load and serve)")
    else:
        comparison.winner, comparison.verdict = leader, "leader"
        comparison.summary = f"{leader} stays ahead in a {measured}"
    return comparison


def compare_candidates(payload: dict[str, Any]) -> dict[str, Any]:
    """Child entry point: load every contender, then time them alternately at their batches, ROUNDS times."""
    from optimizer.backend import backend_named
    from optimizer.model.samples import load_feeds, tile_feed
    from optimizer.model.signature import Signature
    from optimizer.task.evaluation import _load_model

    cands = [Candidate.from_json(c) for c in payload["candidates"]]
    batches: dict[str, int] = payload["batches"]
    signature = Signature.from_json(payload["signature"])
    base = load_feeds(Path(payload["profile_feed"]))[0]
    backends = {c.name: backend_named(c.backend, **payload["backend_settings"].get(c.name, {})) for c in cands}
    model = _load_model(payload["source"], payload.get("state_dict")) if any(b.needs_source_model for b in backends.values()) else None
    runners, feeds = {}, {}
    try:
        for c in cands:
            assert c.artifact is not None
            runners[c.name] = backends[c.name].load(c.artifact, c.device, model).__enter__()
            feeds[c.name] = tile_feed(base, batches[c.name]) if signature.batching else base
            for _ in range(3):
                runners[c.name].infer(feeds[c.name])
        rounds: dict[str, list[float]] = {c.name: [] for c in cands}
        order = [c.name for c in cands]
        for r in range(int(payload.get("rounds", ROUNDS))):
            for name in order if r % 2 == 0 else list(reversed(order)):
                rounds[name].append(_window(runners[name], feeds[name], batches[name] if signature.batching else 1,
                                            float(payload.get("window_s", WINDOW_S))))
        return {"rounds": rounds}
    finally:
        for runner in runners.values():
            runner.__exit__(None, None, None)


def _window(runner: Any, feed: dict[str, Any], batch: int, window_s: float) -> float:
    """Samples per second over one short window (at least three runs)."""
    runs, t0 = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - t0 < window_s:
        runner.run_unchecked(feed)
        runs += 1
    return batch * runs / (time.perf_counter() - t0)
