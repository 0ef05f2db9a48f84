"""Measuring beside another job's busy core: the probe leaves that core to it, in-process measurements run on the rest
and what the throughput curve decided is scaled back to every core; the served search runs on every core beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from optimizer.machine import available_cores
from optimizer.records.measurements import BatchProfile, MaxBatchDecision
from optimizer.records.served_search import ServedSearch
from optimizer.task.core_share import PROBE_LONGEST_S, CoreShare, probe
from optimizer.task.cpu_load import Reading
from optimizer.task.load_watch import LoadWatch
from optimizer.task.find_max_batch_size import scaled_for_cores
from optimizer.task.profiling import ContentionMeter
from optimizer.triton.config.model_config import parse
from tests.conftest import run_cli

pytestmark = pytest.mark.serial  # the probe must find the cores as this test leaves them: no other test beside it
needs_two_cores = pytest.mark.skipif(len(available_cores()) < 2, reason="needs two cores: with one there is none to leave to another job")
HALF = CoreShare((1,), (0, 1), 1.0)  # a two-core machine with core 0 kept busy by another job


@contextmanager
def spinning_on(core: int) -> Iterator[None]:
    """Another job: a busy loop pinned to `core`."""
    code = "import os, sys\nos.sched_setaffinity(0, [int(sys.argv[1])])\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(core)])
    time.sleep(0.5)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _share_while_sleeping(seconds: float = 0.5) -> float:
    meter = ContentionMeter()
    time.sleep(seconds)
    return meter.share()


# -- the probe and the meter ---------------------------------------------------------------------------


def _spin(seconds: float, outside: bool) -> subprocess.Popen | None:
    """A busy loop for `seconds`: our own child (as tritonserver and perf_analyzer are), or another process's (a shell
    starts it in the background and exits, so it is no descendant of this one)."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    if not outside:
        return subprocess.Popen([sys.executable, "-c", loop])
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 &', loop], check=True)
    return None


def test_the_load_watch_counts_other_processes_and_not_our_own_children():
    child = _spin(1.5, outside=False)
    with LoadWatch() as ours:
        time.sleep(1.5)
    child.wait()
    time.sleep(0.2)
    _spin(1.5, outside=True)
    time.sleep(0.1)
    with LoadWatch() as theirs:
        time.sleep(1.2)
    assert ours.peak is not None and theirs.peak is not None
    assert ours.peak < 0.4, f"our own child's busy loop was counted as other processes' load ({ours.peak} cores)"
    assert theirs.peak >= 0.7, f"another process's busy loop was not seen ({theirs.peak} cores)"


def _watched(monkeypatch, reads: list[tuple[float, int, int]]) -> LoadWatch:
    """A LoadWatch fed these readings (time, the machine's busy ticks, our tree's ticks), one per sample."""
    it = iter(Reading(*r) for r in reads)
    watch = LoadWatch()
    monkeypatch.setattr(watch, "_read", lambda: next(it))
    watch._last = watch._read()
    for _ in reads[1:]:
        watch._sample()
    return watch


def test_a_child_that_ended_unreaped_is_not_read_as_other_processes_load(monkeypatch):
    """Between a descendant's exit and its reaping its CPU is in no live process's account: our tree's ticks drop for
    one sample. Read as is, that drop would look like many cores of others' load (more than the machine has), and a
    measurement would be taken again for nothing."""
    hz = os.sysconf("SC_CLK_TCK")
    # (time, busy ticks of the machine, ticks of our tree): both cores ours throughout; at 0.5 s a child ended unreaped
    watch = _watched(monkeypatch, [(0.0, 0, 0), (0.25, hz // 2, hz // 2), (0.5, hz, hz // 10), (0.75, 3 * hz // 2, 3 * hz // 2),
                                   (1.0, 2 * hz, 2 * hz)])
    assert watch.samples and max(watch.samples) < 0.1, watch.samples
    assert watch.peak is not None and watch.peak < 0.1


def test_an_interval_too_short_to_judge_is_not_read_as_other_processes_load(monkeypatch):
    """The sample taken as a watched block ends can come a millisecond after the watch thread's last one: a tick of
    rounding over that millisecond read as tens of cores of others' load (28.4 on two cores, in a settle round)."""
    hz = os.sysconf("SC_CLK_TCK")
    # (time, busy ticks of the machine, ticks of our tree): both cores ours throughout, the machine's count a tick ahead
    watch = _watched(monkeypatch, [(0.0, 0, 0), (0.25, hz // 2, hz // 2), (0.251, hz // 2 + 1, hz // 2), (0.5, hz + 1, hz)])
    assert watch.samples and max(watch.samples) < 0.1, watch.samples
    assert len(watch.samples) == 2  # the millisecond is judged with the quarter second after it


@needs_two_cores
def test_the_probe_leaves_a_core_another_job_keeps_busy_to_it():
    busy = available_cores()[0]
    with spinning_on(busy):
        share = probe(0.5)
    assert share.reduced and busy not in share.cores and share.pin == sorted(share.cores)
    assert share.others_busy >= 0.6
    assert "kept 1.0 of" in share.summary() or "kept 0.9 of" in share.summary()


@needs_two_cores
def test_a_probe_that_lands_in_a_burst_waits_for_its_pause_and_keeps_every_core():
    busy = available_cores()[0]
    code = ("import os, sys, time\nos.sched_setaffinity(0, [int(sys.argv[1])])\nwhile True:\n"
            "    end = time.monotonic() + 2.0\n    while time.monotonic() < end:\n        pass\n    time.sleep(2.0)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(busy)])  # another job: 2 s on, 2 s off
    try:
        time.sleep(0.5)  # inside its first burst: a one-second look sees one core busy throughout
        t0 = time.monotonic()
        share = probe()
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert took >= 1.4, f"the probe stopped after {took:.1f} s: it did not see the burst it started in"
    assert not share.reduced, f"a load that pauses took a core for the whole run: {share.summary()}"
    assert took <= PROBE_LONGEST_S + 0.6


@needs_two_cores
def test_a_quiet_machine_is_measured_on_every_core():
    share = probe()
    assert not share.reduced and share.pin is None and share.cores == available_cores()


@needs_two_cores
def test_contention_counts_only_the_cores_a_measurement_runs_on():
    cores = available_cores()
    before = os.sched_getaffinity(0)
    with spinning_on(cores[0]):
        everywhere = _share_while_sleeping()
        os.sched_setaffinity(0, [cores[1]])
        try:
            away = _share_while_sleeping()
        finally:
            os.sched_setaffinity(0, before)
    assert everywhere > 0.3  # one of two cores busy: the report's "others' CPU" column says so
    assert away < 0.2  # pinned to the other core: the spinner does not disturb the measurement


# -- scaling what fewer threads decided -----------------------------------------------------------------


def _decision(decided_by: str, max_batch: int) -> MaxBatchDecision:
    profiles = [BatchProfile(b, 1, 1, 1, 1, 1, 100.0 * b ** 0.1, 10, 3, True, 0.02, 0.0) for b in (1, 2, 4, 8)]
    return MaxBatchDecision(profiles, max_batch, 2, 8, decided_by, peak=max_batch, largest_fit=8, search_stop="saturation")


def test_batches_scale_by_the_share_of_cores_measured_in_powers_of_two():
    assert (HALF.factor, HALF.to_all_cores(2), HALF.to_all_cores(1), HALF.to_measured_cores(4), HALF.to_measured_cores(1)) == (2, 4, 2, 2, 1)
    six_of_eight = CoreShare((2, 3, 4, 5, 6, 7), tuple(range(8)), 2.0)
    assert six_of_eight.to_all_cores(4) == 4 and six_of_eight.to_all_cores(8) == 8  # x1.33 rounds to the same power of two
    quiet = CoreShare((0, 1), (0, 1), 0.0)
    assert quiet.to_all_cores(4) == 4 and quiet.to_measured_cores(4) == 4


def test_a_searched_max_measured_on_half_the_cores_is_doubled_and_says_so():
    d = scaled_for_cores(_decision("peak", 2), HALF, 256)
    assert (d.max_batch_size, d.measured_max, d.scaled_by) == (4, 2, 2)
    assert d.peak == 4  # the preferred size moves with the max: never max 2p with preferred [p]
    assert "where the max was 2" in d.explanation and "scaled x2" in d.explanation
    assert MaxBatchDecision.from_json(json.loads(json.dumps(d.to_json()))).measured_max == 2
    assert scaled_for_cores(_decision("saturation", 8), HALF, 8).max_batch_size == 8  # never past the cap


def test_a_scaled_max_never_passes_the_largest_batch_that_fit():
    d = _decision("peak", 8)  # the largest batch that fit in-process is 8 (memory ended the growth there)
    d.search_stop = "memory"
    scaled = scaled_for_cores(d, HALF, 256)
    assert scaled.max_batch_size == 8 and scaled.measured_max == 0  # 16 was never measured: not published


@pytest.mark.parametrize("decided_by", ["memory", "latency_budget", "user_cap", "recorded", "no_batching"])
def test_limits_that_are_not_the_throughput_curve_are_not_scaled(decided_by: str):
    d = scaled_for_cores(_decision(decided_by, 4), HALF, 256)
    assert (d.max_batch_size, d.measured_max) == (4, 0)


def test_nothing_is_scaled_on_a_quiet_machine():
    assert scaled_for_cores(_decision("peak", 2), CoreShare((0, 1), (0, 1), 0.0), 256).max_batch_size == 2


# -- end to end ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_two_cores
def test_an_export_beside_a_busy_core_measures_in_process_on_the_free_one_and_serves_on_every_core(in_tmp: Path):
    busy = available_cores()[0]
    with spinning_on(busy):
        r = run_cli("export", "tests.fixtures.models:mlp", "--backend", "onnxruntime", "--eager-gate", "disabled", "--concurrency", "4",
                    "--serve-search-seconds", "25", cwd=in_tmp, serve_search=True)
    assert r.returncode == 0, r.stderr
    assert "kept" in r.stderr and "scaled" in r.stderr  # the user is told, in the run and in the report
    assert "the server runs on every core beside them" in r.stderr
    doc = json.loads((in_tmp / "aitune-reports" / "mlp" / "report.json").read_text())
    result = doc["result"]
    assert busy not in result["measured_on"]["cores"] and len(result["measured_on"]["cores"]) < len(result["measured_on"]["available"])
    decision = next(c for c in result["candidates"] if c["name"] == result["selected"])["decision"]
    assert all(p["others_cpu_share"] < 0.25 for p in decision["profiles"])  # pinned away from the spinner
    search = ServedSearch.from_json(doc["published"]["served_search"])
    assert search.status == "searched", search.reason
    assert search.beside_load and search.measured_on["others_busy"] >= 0.6
    cores = len(available_cores())
    # one layout for every core was measured beside the spinner (not one instance on the free core only), the rules' own:
    # the load slows layouts unalike, so they are not compared there, and the report says so
    start = search.start
    assert start is not None and start.instances * start.threads == cores
    assert {(v.point.instances, v.point.threads) for v in search.variants} == {(start.instances, start.threads)}
    assert len({v.point.max_batch_size for v in search.variants}) > 1  # the batcher was still searched
    assert search.held_layout
    chosen = search.chosen_variant
    assert chosen is not None and chosen.point == search.chosen  # published as measured
    text = (in_tmp / "model_repository" / "mlp" / "config.pbtxt").read_text()
    config = parse(text)
    assert (config.max_batch_size, config.instance_group[0].count) == (search.chosen.max_batch_size, search.chosen.instances)
    assert config.max_batch_size <= max(decision["largest_fit"], decision["measured_max"])  # the batches measured in-process bound it
    assert "on every core while other processes kept" in text  # the config says how it was measured
    report_md = (in_tmp / "aitune-reports" / "mlp" / "report.md").read_text()
    assert "ran on every core beside them" in report_md and "Instance layouts were not compared" in report_md  # and the report


def test_a_scaled_max_never_passes_the_batches_profiled_when_larger_ones_were_only_run_once():
    d = _decision("peak", 4)
    d.largest_fit, d.fit_checked = 32, [16, 32]  # past the saturation at 8, run once each: not measured
    assert scaled_for_cores(d, CoreShare((0,), (0, 1, 2, 3), 3.0), 256).max_batch_size == 8
