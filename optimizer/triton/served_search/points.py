"""Which operating points the served search tries, in what order, and when one beats another.

Pure functions of the in-process decision and the measurements so far: a coordinate search that
varies one dimension at a time (instance layout, then the batch sizes, then the queue delay),
walks a dimension while it keeps improving, and moves on at the first step that does not. The walk
itself (search._climb) pairs a layout step with no queue delay, the one interaction measured to matter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from optimizer.records.measurements import MaxBatchDecision
from optimizer.records.served_search import OperatingPoint, ServedVariant

THROUGHPUT_NOISE = 0.03
"""perf_analyzer's run-to-run spread on a shared CPU machine: a variant must serve this much more to count as better."""
LATENCY_GAIN = 0.10
"""Within the throughput noise, a variant whose latency is this much lower wins: it answers sooner for the same load."""
LARGER_DELAY_FACTOR = 4
MIN_LARGER_DELAY_US = 500
MAX_LARGER_DELAY_US = 10_000
MAX_INSTANCES = 8
MAX_DEFAULT_CONCURRENCY = 64


@dataclass(frozen=True)
class SearchSpace:
    """What may vary: the largest batch that fit in-process, whether the user fixed the max, the cores, the device kind."""

    largest_fit: int
    fixed_max: bool  # the user asked for this max batch (--max-batch-size N, or the JIT workflow's recorded sizes)
    cores: int
    gpu: bool
    concurrency: int = 0  # the target load: batch-1 requests can never form a preferred batch above it (0: no bound)

    @classmethod
    def of(cls, decision: MaxBatchDecision | None, cores: int, gpu: bool, concurrency: int = 0) -> SearchSpace:
        fixed = decision is not None and decision.decided_by in ("user_cap", "recorded")
        largest = (decision.largest_fit or decision.max_batch_size) if decision is not None else 0
        return cls(largest, fixed, max(1, cores), gpu, concurrency)


def reachable(point: OperatingPoint, concurrency: int) -> OperatingPoint:
    """The point with preferred sizes the target load can form (at most `concurrency` requests wait at once)."""
    if not concurrency or not point.preferred or max(point.preferred) <= concurrency:
        return point
    size = 1 << (concurrency.bit_length() - 1)  # the largest power of two within the load
    return replace(point, preferred=(size,) if size > 1 else ())


def default_concurrency(start: OperatingPoint) -> int:
    """The load the search targets unless --concurrency says: two peak batches in flight per instance, so one forms while one runs."""
    peak = max(start.preferred, default=max(1, start.max_batch_size))
    return max(2, min(MAX_DEFAULT_CONCURRENCY, 2 * peak * start.instances))


def layouts(space: SearchSpace) -> list[tuple[int, int | None]]:
    """Instance layouts in search order: CPU count x threads with count x threads <= cores; GPU 1 or 2 instances."""
    if space.gpu:
        return [(1, None), (2, None)]
    out, count = [], 1
    while count <= min(space.cores, MAX_INSTANCES):
        out.append((count, space.cores // count))
        count *= 2
    return out


def layout_steps(current: OperatingPoint, space: SearchSpace) -> list[OperatingPoint]:
    """The layouts after the current one, in order (walked while each improves)."""
    options = layouts(space)
    here = next((i for i, (n, t) in enumerate(options) if n == current.instances and (t == current.threads or current.threads is None and n == 1)), 0)
    return [replace(current, instances=n, threads=t) for n, t in options[here + 1:]]


def batch_steps(current: OperatingPoint, space: SearchSpace) -> tuple[list[OperatingPoint], list[OperatingPoint]]:
    """(upward, downward) batch variants around the current peak: up to the largest batch that fit, down to 2.

    The first upward step keeps the preferred size and raises only the max (capacity, the issue's "max =
    the largest batch that fits, preferred = the peak"); later ones double the preferred size. With a max
    the user fixed only the preferred size moves.
    """
    if current.max_batch_size <= 0:
        return [], []
    peak = max(current.preferred, default=current.max_batch_size)
    ceiling = current.max_batch_size if space.fixed_max else max(space.largest_fit, current.max_batch_size)
    up: list[OperatingPoint] = []
    if not space.fixed_max and ceiling > current.max_batch_size:
        up.append(replace(current, max_batch_size=ceiling))
    b = peak * 2
    while b <= ceiling and (not space.concurrency or b <= space.concurrency):
        up.append(replace(current, max_batch_size=current.max_batch_size if space.fixed_max else b, preferred=(b,)))
        b *= 2
    down: list[OperatingPoint] = []
    b = peak // 2
    while b >= 2:
        down.append(replace(current, max_batch_size=current.max_batch_size if space.fixed_max else b, preferred=(b,)))
        b //= 2
    return up, down


def delay_steps(current: OperatingPoint) -> list[OperatingPoint]:
    """No queue delay, then a larger one than the rule's (each measured once; the better of the three stays)."""
    if current.max_batch_size <= 1:
        return []
    larger = min(MAX_LARGER_DELAY_US, max(MIN_LARGER_DELAY_US, LARGER_DELAY_FACTOR * current.queue_delay_us))
    return [replace(current, queue_delay_us=d) for d in (0, larger) if d != current.queue_delay_us]


def latency_of(v: ServedVariant, percentile: int) -> float | None:
    """The variant's latency at the percentile the budget uses (perf_analyzer reports p50, p95 and p99 here)."""
    return {50: v.p50_ms, 99: v.p99_ms}.get(percentile, v.p95_ms)


def better(v: ServedVariant, best: ServedVariant | None, budget_ms: float | None, percentile: int = 95, top: float | None = None) -> bool:
    """Whether `v` should replace `best`: within the latency budget first, then throughput beyond the noise,
    then (throughput within the noise of `best` and of `top`, the most any variant served) a clearly lower
    latency; `top` keeps a chain of small losses from adding up."""
    if v.status != "measured" or v.throughput is None:
        return False
    if best is None or best.throughput is None:
        return True
    lat_v, lat_b = latency_of(v, percentile) or 0.0, latency_of(best, percentile) or 0.0
    if budget_ms is not None:
        fits_v, fits_b = lat_v <= budget_ms, lat_b <= budget_ms
        if fits_v != fits_b:
            return fits_v
        if not fits_v:  # neither meets it: the one closer to it
            return lat_v < lat_b * (1 - LATENCY_GAIN)
    if v.throughput > best.throughput * (1 + THROUGHPUT_NOISE):
        return True
    floor = (1 - THROUGHPUT_NOISE) * max(best.throughput, top or 0.0)
    return v.throughput >= floor and lat_v < lat_b * (1 - LATENCY_GAIN)
