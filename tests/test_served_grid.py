"""benchmarks/served_grid.py's interval math: the ratio emitted/best it prints with ratio_lo= and ratio_hi= (cheap, no server)."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from tests.conftest import ROOT


def _served_grid():
    spec = importlib.util.spec_from_file_location("served_grid", ROOT / "benchmarks" / "served_grid.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["served_grid"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_interval_is_students_t_at_90_percent_over_the_log_ratios():
    """Four rounds whose log ratios are +-0.1: mean 0, s = 0.11547, t(0.95, 3 df) = 2.353 from the textbook table,
    so the interval is exp(+-2.353 * 0.11547 / 2) = 0.8730..1.1455 around 1."""
    grid = _served_grid()
    up, down = math.exp(0.1), math.exp(-0.1)
    ratio, lo, hi = grid.paired_ratio([100 * up, 100 * down, 100 * up, 100 * down], [100.0] * 4)
    assert ratio == pytest.approx(1.0)
    assert lo == pytest.approx(0.8730, abs=5e-4)
    assert hi == pytest.approx(1.1455, abs=5e-4)


def test_drift_that_moves_both_configs_of_a_round_leaves_the_ratio_and_interval_unchanged():
    """The point of pairing: a busy round slows emitted and best alike, so only their ratio within each round counts."""
    grid = _served_grid()
    emitted, best = [90.0, 96.0, 93.0, 91.0, 95.0, 92.0], [100.0, 101.0, 99.0, 102.0, 98.0, 100.0]
    drift = [1.0, 0.6, 1.3, 0.8, 1.1, 0.7]
    quiet = grid.paired_ratio(emitted, best)
    busy = grid.paired_ratio([e * d for e, d in zip(emitted, drift)], [b * d for b, d in zip(best, drift)])
    assert busy == pytest.approx(quiet)
    assert quiet[1] < quiet[0] < quiet[2] < 1.0  # emitted is slower in every round: the whole interval is below 1


def test_the_printed_means_give_the_printed_ratio_and_more_rounds_narrow_the_interval():
    grid = _served_grid()
    emitted, best = [90.0, 96.0, 93.0, 91.0], [100.0, 101.0, 99.0, 102.0]
    ratio, lo, hi = grid.paired_ratio(emitted, best)
    assert grid.geometric_mean(emitted) / grid.geometric_mean(best) == pytest.approx(ratio)
    _, lo8, hi8 = grid.paired_ratio(emitted * 2, best * 2)  # the same spread over twice the rounds
    assert lo < lo8 < ratio < hi8 < hi


def test_one_round_or_a_failed_side_gives_no_bounded_interval():
    grid = _served_grid()
    assert grid.paired_ratio([95.0, 0.0], [100.0, 100.0]) == (pytest.approx(0.95), 0.0, math.inf)  # the failed round is left out
    with pytest.raises(ValueError, match="no paired round"):
        grid.paired_ratio([0.0], [100.0])
