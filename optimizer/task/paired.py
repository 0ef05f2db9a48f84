"""Close calls settled by paired, interleaved measurement: noise must not pick the backend.

Candidates are measured one after another, minutes apart, so background load that comes and goes can
put any of them ahead. The leader and every candidate within CLOSE_MARGIN of it are loaded into one
fresh process and timed alternately at their own peak batch, in short rounds (the order flips every
round). Each round gives throughput ratios taken under the same load.

Speed decides: the contender with the highest median per-round ratio is the faster one and is kept, also
inside a tie (an interval that includes 1). A slower contender is published instead only for a stated
reason the report shows (PREFERENCES: a backend that is cheaper to load and serve), and only when the
paired rounds show it within PREFERENCE_MARGIN of the faster one: its median ratio and the low end of its
95% interval both at least 0.95. An interval that straddles that bound is too wide to tell: the child
measures more rounds, up to MAX_ROUNDS; still too wide there, the faster one is kept. The order of
PREFERENCES never decides on its own.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from optimizer.records.candidate import Candidate

log = logging.getLogger(__name__)

CLOSE_MARGIN = 0.25
"""Candidates whose measured throughput is within 25% of the leader's are re-measured against it."""
ROUNDS = 6
MAX_ROUNDS = 18
"""A wide interval means more rounds (two at a time, so the order stays balanced), at most this many in all."""
WINDOW_S = 0.3
PREFERENCE_MARGIN = 0.05
"""A preferred contender may be published over a faster one only when the paired rounds show it at most 5% slower."""
PREFERENCES = MappingProxyType({
    "tensorrt": "Triton's TensorRT backend runs the engine natively, without torch in the server",
    "onnxruntime-trt": "Triton's ONNX Runtime backend loads it in a fraction of a second and keeps torch out of the server",
    "onnxruntime": "Triton's ONNX Runtime backend loads it in a fraction of a second and keeps torch out of the server",
    "openvino": "Triton's OpenVINO backend serves it without torch in the server",
    "torchscript": "pytorch_libtorch is a released platform of the PyTorch backend, while torch_aoti is Beta or unconfirmed in "
                   "Triton's sources and needs the server's libtorch to match the torch that compiled it",
})
"""Backend -> why it is preferred over every backend after it (earlier first; torch-aoti has no reason to be preferred).
The reason is quoted in the selection reason whenever it decides."""
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16,
         14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11}
"""Student's t at 97.5% by degrees of freedom (a 95% two-sided interval); 1.96 beyond."""


@dataclass
class PairedComparison:
    """Per-round throughputs of each contender and what they decided."""

    leader: str
    batches: dict[str, int]
    rounds: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)  # challenger -> [geometric mean, ci low, ci high] against the leader
    winner: str = ""
    verdict: str = ""  # "leader", "challenger" (the faster one is kept) or "preferred" (a stated reason, within 5%)
    summary: str = ""
    seconds: float = 0.0
    fastest: str = ""  # the contender with the highest median ratio
    preference: dict[str, Any] = field(default_factory=dict)  # the preferred contender weighed against the fastest, when there was one

    def above_leader(self, name: str) -> bool:
        """Whether `name`'s whole interval against the leader lies above 1: faster beyond the noise, not a tie."""
        return (self.ratios.get(name) or [0.0] * 3)[1] > 1.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Against:
    """One contender's paired rounds against another's: median and geometric mean of the per-round ratios, 95% interval."""

    median: float
    mean: float
    low: float
    high: float
    rounds: int

    def shown(self) -> str:
        return f"{self.median:.3f}x (median of {self.rounds} paired rounds; 95% interval [{self.low:.3f}, {self.high:.3f}])"


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


def against(rounds: dict[str, list[float]], name: str, other: str) -> Against:
    """`name`'s rounds against `other`'s, round by round (both were timed in the same rounds)."""
    ratios = [a / b for a, b in zip(rounds[name], rounds[other]) if a > 0 and b > 0]
    mean, low, high = ratio_interval(rounds[name], rounds[other])
    return Against(statistics.median(ratios) if ratios else 0.0, mean, low, high, len(ratios))


def fastest_of(rounds: dict[str, list[float]], leader: str) -> str:
    """The contender with the highest median per-round ratio against the leader (the leader on an exact tie)."""
    return max(rounds, key=lambda n: (1.0 if n == leader else against(rounds, n, leader).median, n == leader))


def _rank(backend: str) -> int:
    order = list(PREFERENCES)
    return order.index(backend) if backend in PREFERENCES else len(order)


def _preferred(rounds: dict[str, list[float]], fastest: str, backends: dict[str, str]) -> list[str]:
    """Contenders preferred over the fastest for a stated reason, best reason first."""
    mine = _rank(backends.get(fastest, ""))
    named = [n for n in rounds if n != fastest and _rank(backends.get(n, "")) < mine]
    return sorted(named, key=lambda n: (_rank(backends.get(n, "")), list(rounds).index(n)))


def _standing(a: Against) -> str:
    """Whether the rounds show a contender within PREFERENCE_MARGIN of the fastest: "within", "slower" or "unclear"."""
    bound = 1.0 - PREFERENCE_MARGIN
    if a.median >= bound and a.low >= bound:
        return "within"
    if a.high < bound or (a.median < bound and a.rounds >= MAX_ROUNDS):
        return "slower"
    return "unclear"


def needs_more_rounds(rounds: dict[str, list[float]], leader: str, backends: dict[str, str]) -> bool:
    """True while a preferred contender's interval against the fastest straddles the 5% bound (and rounds are left)."""
    if not rounds or len(rounds[leader]) >= MAX_ROUNDS:
        return False
    fastest = fastest_of(rounds, leader)
    for name in _preferred(rounds, fastest, backends):
        standing = _standing(against(rounds, name, fastest))
        if standing == "within":
            return False  # the best-ranked one that qualifies decides; lower-ranked ones do not matter
        if standing == "unclear":
            return True
    return False


def decide(comparison: PairedComparison, backends: dict[str, str]) -> PairedComparison:
    """Fill in the verdict: the fastest contender (highest median per-round ratio) is kept, unless a contender preferred
    for a stated reason is shown within 5% of it; `backends` maps contender names to backend names."""
    leader, rounds = comparison.leader, comparison.rounds
    for name in rounds:
        if name != leader:
            ratio, low, high = ratio_interval(rounds[name], rounds[leader])
            comparison.ratios[name] = [round(ratio, 4), round(low, 4), round(high, 4)]
    parts = [f"{n} {r[0]:.2f}x [{r[1]:.2f}, {r[2]:.2f}]" for n, r in comparison.ratios.items()]
    n_rounds = len(rounds[leader])
    measured = f"paired re-measurement ({n_rounds} interleaved rounds; against {leader}: {', '.join(parts)})"
    fastest = comparison.fastest = fastest_of(rounds, leader)
    comparison.winner, comparison.verdict = fastest, "leader" if fastest == leader else "challenger"
    if fastest == leader:
        comparison.summary = f"{leader} stays the fastest in a {measured}"
    else:
        low = comparison.ratios[fastest][1]
        tie = " (its interval includes 1; the faster one is kept)" if low <= 1.0 else ""
        comparison.summary = f"{fastest} is faster than {leader} in a {measured}{tie}"
    passed_over = []
    for name in _preferred(rounds, fastest, backends):
        a = against(rounds, name, fastest)
        standing = _standing(a)
        reason = PREFERENCES[backends[name]]
        comparison.preference = {"candidate": name, "reason": reason, "against": fastest, "median": round(a.median, 4),
                                 "interval": [round(a.low, 4), round(a.high, 4)], "rounds": a.rounds, "standing": standing}
        if standing == "within":
            comparison.winner, comparison.verdict = name, "preferred"
            comparison.summary = (f"{name} is published although {fastest} measured faster: it runs at {a.shown()} of {fastest}'s speed, "
                                  f"within {PREFERENCE_MARGIN:.0%}, and {reason}; in a {measured}")
            return comparison
        passed_over.append(f"the preference for {name} ({reason}) does not apply: it runs at {a.shown()} of {fastest}'s speed, "
                           + ("more than 5% slower" if standing == "slower" else f"not shown within 5% in {a.rounds} rounds"))
    if passed_over:
        comparison.summary += "; " + "; ".join(passed_over)
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
        names = {c.name: c.backend for c in cands}
        window_s = float(payload.get("window_s", WINDOW_S))

        def one_round(r: int) -> None:
            for name in order if r % 2 == 0 else list(reversed(order)):
                rounds[name].append(_window(runners[name], feeds[name], batches[name] if signature.batching else 1, window_s))

        planned = int(payload.get("rounds", ROUNDS))
        for r in range(planned):
            one_round(r)
        while needs_more_rounds(rounds, order[0], names):  # a wide interval: two more rounds (one each way), bounded by MAX_ROUNDS
            one_round(planned)
            one_round(planned + 1)
            planned += 2
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
