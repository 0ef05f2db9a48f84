"""The cores measurements run on: those another job's steady load leaves free, found by a short probe.

Beside another job's steady load, candidates using every core wait at each parallel region for the
thread that shares a core with it, each backend by a different factor, so the load would pick the
backend and the max batch. On the free cores, one thread each, every candidate slows alike and the
ranking holds (benchmarks/noisy_choice.py and its record in benchmarks/results/). So before the first measurement the machine is watched for PROBE_S (up to
PROBE_LONGEST_S while the load seen has not paused); the cores others kept busy are left to
them and every measurement of the run (each candidate, eager, the paired comparison) is pinned
to the rest, with one thread per core. The cores are chosen once per run: candidates measured
on different cores could not be compared.

Fewer threads flatten the batch curve, because each thread's share of a batch is what amortizes
the cost of splitting work. So a searched max batch measured on k of n cores is scaled
by n/k (to a power of two) for the n-core server the config is written for; the report says so.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from optimizer.machine import available_cores
from optimizer.task.cpu_load import clock_ticks, own_ticks, read_cpu_busy

log = logging.getLogger(__name__)

PROBE_S = 1.0
PROBE_LONGEST_S = 3.0
"""How long a load seen at first is watched for a pause. Real load comes and goes, and a one-second look can land in a
burst and put the whole run on fewer cores; a 2 s burst leaves a quiet half second within 3 s, so longer load counts as
steady."""
STRETCH_S = 0.5
"""The probe's unit of judgement, as load_watch's: a steady job keeps every half second busy, bursts leave some idle."""
TAKEN = 0.6
"""Others' CPU, in cores, from which a core counts as taken: a spinning process reads close to 1.0, so 0.6 is clear of
both it and a quiet machine's noise."""


@dataclass(frozen=True)
class CoreShare:
    """The cores this run measures on, out of the ones it may use, and the load that decided it."""

    cores: tuple[int, ...]
    available: tuple[int, ...]
    others_busy: float  # cores' worth of CPU other processes used during the probe

    @property
    def reduced(self) -> bool:
        return len(self.cores) < len(self.available)

    @property
    def pin(self) -> list[int] | None:
        """The cores a measuring child is pinned to; None when it may use every available one."""
        return sorted(self.cores) if self.reduced else None

    @property
    def factor(self) -> float:
        """Available cores per measured core: how much more of a batch each thread gets here than on all of them."""
        return len(self.available) / len(self.cores)

    def to_all_cores(self, batch: int) -> int:
        """A batch measured here, as the batch (a power of two) giving each thread the same share on every available core."""
        return batch if not self.reduced or batch <= 0 else 1 << round(math.log2(batch * self.factor))

    def to_measured_cores(self, batch: int) -> int:
        """The inverse of to_all_cores: the batch to measure here for `batch` on every available core."""
        return batch if not self.reduced or batch <= 0 else 1 << max(0, round(math.log2(batch / self.factor)))

    def summary(self, what: str = "candidate") -> str:
        """One sentence for the warning and the progress line; `what` names the things measured."""
        return (f"other processes kept {self.others_busy:.1f} of {len(self.available)} cores busy when measuring began, so every "
                f"{what} was measured on {len(self.cores)} core(s) ({', '.join(map(str, sorted(self.cores)))}) with as many "
                f"threads: throughputs are below what an idle machine gives, the comparison between {what}s holds, and a "
                f"searched max batch is scaled x{self.factor:g} for all {len(self.available)} cores")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cores"], d["available"] = list(self.cores), list(self.available)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CoreShare:
        return cls(tuple(d["cores"]), tuple(d["available"]), float(d["others_busy"]))


def _taken(others: float, available: int) -> int:
    return min(int(others + (1.0 - TAKEN)), available - 1)


def probe(seconds: float = PROBE_S, longest: float = PROBE_LONGEST_S) -> CoreShare:
    """Watch the machine (this process sleeping) in half-second stretches and leave the cores others kept busy to them.

    Load seen in the first `seconds` is watched up to `longest`: only a load that never lets up takes cores. One that
    pauses (bursts) is judged by its quietest stretch, so a probe that lands in a burst does not put the whole run
    on fewer cores; the measurements the bursts then reach are taken again (in-process: profiling.measure_settled;
    served: load_watch)."""
    available = available_cores()
    if len(available) < 2:
        return CoreShare(available, available, 0.0)
    t0 = time.monotonic()
    last = (read_cpu_busy(), own_ticks(), t0)
    quietest: tuple[float, dict[int, float]] | None = None
    while True:
        time.sleep(STRETCH_S)
        now = (read_cpu_busy(), own_ticks(), time.monotonic())
        if last[0] is None or now[0] is None:
            return CoreShare(available, available, 0.0)
        ticks = (now[2] - last[2]) * clock_ticks()
        busy = {c: max(0.0, min(1.0, (now[0].get(c, 0) - last[0].get(c, 0)) / ticks)) for c in available}
        others = max(0.0, sum(busy.values()) - ((now[1] or 0) - (last[1] or 0)) / ticks)
        if quietest is None or others < quietest[0]:
            quietest = (others, busy)
        last = now
        elapsed = now[2] - t0
        if elapsed >= seconds and (_taken(quietest[0], len(available)) == 0 or elapsed >= longest):
            break
    others, busy = quietest
    taken = _taken(others, len(available))
    cores = tuple(sorted(sorted(available, key=lambda c: (busy[c], c))[: len(available) - taken]))
    share = CoreShare(cores, available, round(others, 2))
    if share.reduced:
        log.info("measuring on cores %s: %s", list(cores), share.summary())
    return share


def pin_to(cores: list[int] | None) -> None:
    """Run this process (and the threads it starts from now on) on `cores` only."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
