"""benchmarks/noisy_choice.py's numbers: the ABBA block ratio, a run's ratio and 90% interval, the worst run per load."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "noisy_choice.py"


@pytest.fixture(scope="module")
def noisy():
    spec = importlib.util.spec_from_file_location("noisy_choice", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module


def test_abba_block_cancels_a_linear_drift(noisy):
    # The machine slows by 10 infer/s per measurement; the same config on both sides: the block says 1, where
    # "first A, then B" would say 0.9.
    assert noisy.block_ratio(100, 90, 80, 70) == pytest.approx(1.0)
    # The busy choice truly 20% slower under the same drift: both sides are sampled at the same mean time, so the block
    # is nearer 0.8 than the A-then-B reading (70/100).
    block = noisy.block_ratio(100, 70, 60, 70)
    assert abs(block - 0.8) < abs(70 / 100 - 0.8)


def test_run_ratio_is_the_geometric_mean_with_a_t_interval(noisy):
    ratio, lo, hi = noisy.run_ratio([0.9, 1.0, 1.1])
    logs = [math.log(0.9), 0.0, math.log(1.1)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 2.920 * sd / math.sqrt(3)  # t(0.95, 2 df) from a t table
    assert ratio == pytest.approx(math.exp(mean))
    assert (lo, hi) == (pytest.approx(math.exp(mean - half)), pytest.approx(math.exp(mean + half)))
    assert lo < 0.9 and hi > 1.05  # three blocks this spread do not rule out a 5% loss


def test_identical_blocks_give_a_zero_width_interval_and_one_block_none(noisy):
    assert noisy.run_ratio([0.8, 0.8, 0.8]) == (pytest.approx(0.8), pytest.approx(0.8), pytest.approx(0.8))
    assert noisy.run_ratio([0.97]) == (pytest.approx(0.97), None, None)


def test_more_blocks_narrow_the_interval(noisy):
    _, lo3, hi3 = noisy.run_ratio([0.95, 1.05, 0.95])
    _, lo9, hi9 = noisy.run_ratio([0.95, 1.05, 0.95] * 3)
    assert hi9 - lo9 < (hi3 - lo3) / 2


def test_t_quantile_falls_to_the_normal_one(noisy):
    assert noisy.t_quantile(1) == pytest.approx(6.314)
    assert noisy.t_quantile(30) == pytest.approx(1.697)
    assert noisy.t_quantile(1000) == pytest.approx(1.645)


def test_the_worst_run_and_its_own_interval_summarise_a_load(noisy):
    runs = [(1.01, 0.98, 1.04), (0.91, 0.85, 0.97), (0.99, 0.90, 1.09)]
    assert noisy.summary(runs) == (0.91, 0.85, 0.97)
    assert noisy.summary([(0.0, None, None), (1.0, 0.9, 1.1)]) == (0.0, None, None)  # a failed run is the worst case


def test_same_choice_is_backend_and_max_batch_within_a_power_of_two(noisy, tmp_path):
    quiet = noisy.Run("quiet", tmp_path, backend="onnxruntime", max_batch=8)
    assert noisy.same_choice(noisy.Run("s1", tmp_path, backend="onnxruntime", max_batch=16), quiet)
    assert not noisy.same_choice(noisy.Run("s2", tmp_path, backend="onnxruntime", max_batch=32), quiet)
    assert not noisy.same_choice(noisy.Run("s3", tmp_path, backend="torchscript", max_batch=8), quiet)
    assert not noisy.same_choice(noisy.Run("s4", tmp_path, backend="onnxruntime", max_batch=8, error="export exit 1"), quiet)


def test_url_choice_refuses_bad_arguments_before_starting_anything():
    """benchmarks/url_choice.py (export --url against the local export) reuses these numbers; a bad count is one usage error."""
    import subprocess

    script = SCRIPT.with_name("url_choice.py")
    r = subprocess.run([sys.executable, str(script), "--runs", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--runs, --pairs and --concurrency must be at least 1" in r.stderr
    r = subprocess.run([sys.executable, str(script), "--models", "resnet"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown models ['resnet']" in r.stderr
