"""Strategy semantics with fake measurements: candidate lists, workflows, each strategy's choice, the eager gate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from optimizer.backend import backend_named
from optimizer.errors import NoCandidateError, SettingsError
from optimizer.model.source import load_model
from optimizer.records.candidate import Candidate
from optimizer.records.measurements import BatchProfile, MaxBatchDecision
from optimizer.records.reference_set import ReferenceSet
from optimizer.task.context import TuneContext
from optimizer.task.find_max_batch_size import knee_of
from optimizer.tune_strategy import (
    STRATEGIES,
    FirstWinsStrategy,
    LatencyBudgetStrategy,
    MaxThroughputStrategy,
    MinLatencyStrategy,
    MultiBackendStrategy,
    OneBackendStrategy,
)


def prof(batch: int, throughput: float, p95_ms: float) -> BatchProfile:
    p50 = batch * 1000.0 / throughput
    return BatchProfile(batch, p50, p50, p95_ms, p95_ms, p50, throughput, 10, 3, True, 0.01, 0.0)


def cand(name: str, points: list[tuple[int, float, float]], status: str = "passed") -> Candidate:
    profiles = [prof(*p) for p in points]
    best = max(profiles, key=lambda p: p.throughput)
    decision = MaxBatchDecision(profiles, profiles[-1].batch_size, knee_of(profiles, 0.05), best.batch_size, "saturation")
    return Candidate(f"{name}[cpu]", name, "cpu", status=status, decision=decision)


# batch 1 latency: TorchScript 0.5 ms (best), ORT 1.0 ms; throughput: ORT 3000/s at batch 8 (best), TorchScript 2100/s
TS = cand("torchscript", [(1, 2000, 0.6), (8, 2100, 14.0)])
ORT = cand("onnxruntime", [(1, 1000, 1.2), (8, 3000, 9.5)])
EAGER_SLOW = cand("torch-eager", [(1, 500, 2.5), (8, 600, 15.0)])
EAGER_FAST = cand("torch-eager", [(1, 5000, 0.3), (8, 5000, 2.0)])


def test_each_strategy_picks_by_its_own_metric():
    best, why = MaxThroughputStrategy()._select([TS, ORT], EAGER_SLOW, [])
    assert best is ORT and "highest throughput" in why and "beats eager" in why
    best, _ = MinLatencyStrategy()._select([TS, ORT], EAGER_SLOW, [])
    assert best is TS
    # within 10 ms at p95: ORT's batch 8 (9.5 ms, 3000/s) fits; TorchScript's batch 8 (14 ms) does not
    best, why = LatencyBudgetStrategy(budget_ms=10.0)._select([TS, ORT], EAGER_SLOW, [])
    assert best is ORT and "p95 <= 10 ms" in why
    # within 1 ms only TorchScript's batch 1 (0.6 ms) fits
    best, _ = LatencyBudgetStrategy(budget_ms=1.0)._select([TS, ORT], EAGER_SLOW, [])
    assert best is TS
    best, why = FirstWinsStrategy()._select([TS, ORT], EAGER_SLOW, [])
    assert best is TS and "first candidate in order" in why


def test_first_wins_skips_candidates_that_do_not_beat_eager():
    eager = cand("torch-eager", [(1, 2500, 0.5), (8, 2500, 4.0)])
    best, _ = FirstWinsStrategy()._select([TS, ORT], eager, [])
    assert best is ORT  # TorchScript's 2100/s does not beat eager's 2500/s; ORT's 3000/s does
    best, why = FirstWinsStrategy(eager_gate="diagnostic")._select([TS, ORT], eager, [])
    assert best is TS and "does not beat eager" in why


def test_gate_enabled_falls_back_with_a_warning_when_eager_is_faster():
    warnings: list[str] = []
    best, _ = MaxThroughputStrategy()._select([TS, ORT], EAGER_FAST, warnings)
    assert best is ORT
    assert len(warnings) == 1 and "eager PyTorch was faster" in warnings[0] and "onnxruntime[cpu]" in warnings[0]


def test_gate_diagnostic_reports_only_and_disabled_does_not_measure_eager():
    warnings: list[str] = []
    best, why = MaxThroughputStrategy(eager_gate="diagnostic")._select([TS, ORT], EAGER_FAST, warnings)
    assert best is ORT and warnings == [] and "does not beat eager" in why
    with pytest.raises(SettingsError, match="eager gate"):
        MaxThroughputStrategy(eager_gate="sometimes")


def _ctx(tmp_path: Path, module=None) -> TuneContext:
    model = load_model("optimizer.examples.cnn:build")
    if module is not None:
        model.module = module
    ref = ReferenceSet("", "", [], "")
    return TuneContext(model=model, signature=None, reference=ref, workdir=tmp_path)  # type: ignore[arg-type]


def test_explicit_empty_list_is_a_clear_error_not_an_eager_fallback(tmp_path):
    strategy = MaxThroughputStrategy(backends=[])
    assert strategy._candidate_backends(_ctx(tmp_path)) == []
    with pytest.raises(NoCandidateError, match="no candidate backends"):
        strategy.tune(_ctx(tmp_path))


def test_explicit_lists_win_and_defaults_follow_the_workflow(tmp_path):
    ctx = _ctx(tmp_path)
    assert [b.name for b in MaxThroughputStrategy(backends=["onnxruntime"])._candidate_backends(ctx)] == ["onnxruntime"]
    ort = backend_named("onnxruntime", graph_level="basic")
    got = MaxThroughputStrategy(backends=[ort])._candidate_backends(ctx)
    assert got[0] is ort
    aot = [b.name for b in MaxThroughputStrategy()._candidate_backends(ctx)]
    assert "onnxruntime" in aot and "torchscript" in aot
    assert all(b.name != "torch-eager" for b in MaxThroughputStrategy()._candidate_backends(ctx))
    with pytest.raises(ValueError, match="'aot' or 'jit'"):
        MaxThroughputStrategy(workflow="eager")


def test_one_backend_strategy(tmp_path):
    assert [b.name for b in OneBackendStrategy("torchscript")._candidate_backends(_ctx(tmp_path))] == ["torchscript"]


def test_for_aot_matches_the_constructor_and_for_jit_skips_discovery():
    aot = MaxThroughputStrategy.for_aot(max_batch_size=16)
    plain = MaxThroughputStrategy(max_batch_size=16)
    assert aot.workflow == plain.workflow == "aot"
    assert aot.batch_policy() == plain.batch_policy()
    jit = MaxThroughputStrategy.for_jit()
    assert jit.workflow == "jit" and not jit.find_max_batch_size
    policy = jit.batch_policy(recorded_batch_sizes=[4, 1, 4, 16])
    assert policy.batch_sizes == (1, 4, 16)
    assert MaxThroughputStrategy(workflow="jit").batch_policy([2]).batch_sizes == (2,)


@pytest.fixture
def gloo_group():
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_reuse_across_distributed_and_ordinary_modules(tmp_path, gloo_group):
    from torch.nn.parallel import DistributedDataParallel

    plain = torch.nn.Linear(4, 4)
    ddp = DistributedDataParallel(torch.nn.Linear(4, 4))
    strategy = MaxThroughputStrategy()
    names = lambda m: [b.name for b in strategy._candidate_backends(_ctx(tmp_path, m))]  # noqa: E731
    ordinary = names(plain)
    assert "onnxruntime" in ordinary
    distributed = names(ddp)
    assert "onnxruntime" not in distributed and "tensorrt" not in distributed and distributed
    assert names(plain) == ordinary, "defaults must be rebuilt when the module changes back"
    explicit = MaxThroughputStrategy(backends=["onnxruntime"])
    assert [b.name for b in explicit._candidate_backends(_ctx(tmp_path, ddp))] == ["onnxruntime"], "user lists are kept"


def test_concrete_strategies_must_define_their_defaults(tmp_path):
    """As in AITune, the default lists are abstract: a strategy that forgets them cannot even be created."""
    import inspect

    class Incomplete(MultiBackendStrategy):
        name = "incomplete"

        def _metric(self, cand):
            return None

    assert inspect.isabstract(MultiBackendStrategy) and inspect.isabstract(Incomplete)
    with pytest.raises(TypeError, match="_default_aot_backends"):
        Incomplete()
    assert not any(inspect.isabstract(cls) for cls in STRATEGIES.values())
