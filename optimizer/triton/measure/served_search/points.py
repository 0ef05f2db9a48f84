"""Which operating points the served search measures, in what order, and when one beats another.

Pure functions of the in-process decision, the target load and the measurements so far, used by the search, report.md
and both served benchmarks (one way to build, label and score a variant):
- the coarse pass: every instance layout x max batch (the in-process peak, 2x, 4x, the largest batch that fit; with no
  load given, a max each load of the ladder fills instead of 4x), with no queue delay and no preferred sizes (Model
  Analyzer's batcher defaults, and Triton's guidance to leave preferred sizes unset unless a model serves specific
  sizes best);
- the refinement around the best two, likeliest gain first: a delay long enough for the lightest load to fill the
  batch (when the batcher formed smaller ones there), the max batch halfway to an unmeasured neighbour, the rules'
  queue delay and the rules' preferred size (not for a backend that pads);
- `better`: the objective's comparison (budget first, then throughput beyond the noise, then a clearly lower latency).
The user's --max-batch-size is never changed and the largest batch that fit in-process is never exceeded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from optimizer.records.measurements import MaxBatchDecision
from optimizer.records.served_search import LoadLevel, OperatingPoint, ServedVariant
from optimizer.triton.measure.served_search.objective import ladder

THROUGHPUT_NOISE = 0.03
"""perf_analyzer's spread between windows on a shared CPU machine: a variant must serve this much more to count as better."""
CLOSE = 0.10
"""A best variant within this much of its runner-up is measured again with it, interleaved (A B B A), before it is published:
two measurements of one config minutes apart can differ by about this much on a shared machine."""
LATENCY_GAIN = 0.10
"""Within the throughput noise, a variant whose latency is this much lower wins: it answers sooner for the same load."""
MAX_INSTANCES = 8
COARSE_SIZES = 4
"""The coarse pass measures this many max batch sizes per layout when the caps leave room for them."""
MAX_SEED_CONCURRENCY = 64
FILL_DELAY_SHARE = 0.25
"""A fill delay is this share of a request's median latency at the lightest load: about the time a client's next request
takes to come back round (client, network and the server's request handling), small beside the batch it fills, where
that load cannot fill the max (every batch then waits it out)."""
FILL_FULL_SHARE = 0.75
"""Where the lightest load can fill the max, the fill delay is this share of its median latency: a batch leaves as soon
as it is full, so the delay costs nothing while the clients stay together, and lasting one execution of a full batch it
lets them come together again when they fall into two groups (each group waits for the other's execution, then its own:
half such a load's p50 is one execution). A shorter delay (FILL_DELAY_SHARE) can leave the clients split in two groups
for good, each batch half full (and padded to the max by a backend that pads); this one keeps them together without
costing a heavier load anything (see benchmarks/served_grid.py and its record in benchmarks/results/)."""
SAME_DELAY = 0.25
"""Queue delays within this share of each other are one variant for the refinement: a fill delay is a share of the p50
a variant measured, so variants that differ only in layout or noise propose slightly different delays for what is
one config, and measuring each of them would spend the budget on repeats."""
FILL_DELAY_MAX_US = 20000
PADDED_FIRST = 8
"""With no load given, a backend that pads (openvino) has its maxima up to this measured (and refined) before larger ones:
at the ladder's first load of 4 a max of 16 computes 16 rows for 4 requests, so it cannot hold up at every load. Large
maxima measured first would spend the budget on variants that lose at the light loads and leave the refinement of the
smaller ones (their fill delays) untried."""
HELD_LAYOUT = ("instance layouts were not compared: another process's load does not slow them alike (instances of several threads "
               "lose more than single-thread ones), so the rules' layout for every core was kept and only the batcher was searched on it")
"""Why a search beside other processes' load measures one layout: the other load takes more from an instance of several
threads than from single-thread instances, so beside it the layouts are not compared as an idle machine would compare
them, and a layout chosen there can serve far less once the machine is quiet (see benchmarks/noisy_choice.py and its
record in benchmarks/results/)."""


@dataclass(frozen=True)
class SearchSpace:
    """What may vary: the in-process peak, the largest batch that fit, a max the user fixed, the cores, the device, the load."""

    peak: int  # the in-process peak batch (the rules' preferred size, else their max)
    largest_fit: int  # the largest batch that fit in-process: never exceeded
    fixed_max: int | None  # the user's --max-batch-size (or the JIT workflow's recorded max): never changed
    cores: int
    gpu: bool
    concurrency: int = 0  # the target load: batch-1 requests can never form a batch above it (0: no target)
    rules_delay_us: int = 0
    batching: bool = True  # False: the model does not batch (max_batch_size 0): only the instance layout varies
    layout: tuple[int, int | None] | None = None  # beside other processes' load: the one layout measured (see HELD_LAYOUT)
    pads: bool = False  # the backend computes max_batch_size rows for every execution (openvino): see PADDED_FIRST
    loads: tuple[int, ...] = ()  # the loads a robust objective scores (objective.Objective.loads); () for one load or a budget

    @classmethod
    def of(cls, decision: MaxBatchDecision | None, start: OperatingPoint, cores: int, gpu: bool, concurrency: int = 0,
           user_max: int | None = None, beside_load: bool = False, rules_delay_us: int | None = None, pads: bool = False,
           loads: tuple[int, ...] = ()) -> SearchSpace:
        """The space around the rules' start point; `user_max` is --max-batch-size when the user gave one; `beside_load`:
        other processes kept cores busy as the search began (then the start's layout is held, see HELD_LAYOUT);
        `rules_delay_us`: the rules' queue delay when the start cannot carry one (max 1).

        A start of max 1 (a padding backend's rules for every load, find_max_batch_size.every_load_max) batches nothing,
        but the space still holds the in-process peak (the rules' preferred size) and the rules' delay: without them the
        coarse pass and the refinement would have nothing around the peak to measure."""
        fixed = user_max or (start.max_batch_size if decision is not None and decision.decided_by in ("user_cap", "recorded") else None)
        largest = max(start.max_batch_size, (decision.largest_fit or decision.max_batch_size) if decision is not None else 0)
        if decision is not None and decision.measured_max:  # measured on fewer cores: the batches measured there bound it
            largest = max(decision.largest_fit, decision.measured_max)
        if fixed:
            largest = fixed
        peak = max(start.preferred, default=max(1, start.max_batch_size))
        if pads and not start.preferred and decision is not None and 1 < (decision.peak or 0) < start.max_batch_size:
            peak = decision.peak  # the rules publish no preferred size below a padding backend's max: the peak is still the peak
        delay = start.queue_delay_us
        if start.max_batch_size == 1 and decision is not None and (decision.peak or 0) > 1:
            peak, delay = decision.peak, rules_delay_us or 0
        layout = (start.instances, start.threads) if beside_load and not gpu else None
        return cls(max(1, min(peak, largest)), max(1, largest), fixed, max(1, cores), gpu, concurrency, delay,
                   start.max_batch_size > 0, layout, pads, tuple(loads))


def seed_concurrency(start: OperatingPoint) -> int:
    """Where the first sweep starts when no load is given: two peak batches in flight per instance (a seed, never the load)."""
    peak = max(start.preferred, default=max(1, start.max_batch_size))
    return max(2, min(MAX_SEED_CONCURRENCY, 2 * peak * start.instances))


def layouts(space: SearchSpace) -> list[tuple[int, int | None]]:
    """Instance layouts: CPU count x threads with count x threads <= cores (powers of two); GPU 1 or 2 instances; beside
    other processes' load on a CPU only the start's layout (HELD_LAYOUT says why)."""
    if space.layout is not None:
        return [space.layout]
    if space.gpu:
        return [(1, None), (2, None)]
    out, count = [], 1
    while count <= min(space.cores, MAX_INSTANCES):
        out.append((count, space.cores // count))
        count *= 2
    return out


def max_batches(space: SearchSpace) -> list[int]:
    """The max batch sizes of the coarse pass: the peak, 2x, 4x and the largest that fit, within every cap, ascending.

    A target load N caps them at N: batch-1 requests at concurrency N never form a larger batch. With no load given
    the config must hold up at every load of the ladder, so a max that each load can fill is measured instead of 4x
    the peak: a backend that pads to max_batch_size (openvino) computes a full batch whatever arrives, and with a large
    peak the peak, 2x and the largest fit would leave nothing a light load of the ladder can fill."""
    if not space.batching:
        return [0]
    if space.fixed_max:
        return [space.fixed_max]
    cap = min(space.largest_fit, space.concurrency) if space.concurrency else space.largest_fit
    if not space.concurrency:  # no load given: a max each load of the ladder fills, besides the peak, 2x and the largest
        sizes = {max(1, min(b, cap)) for b in (space.peak, 2 * space.peak, space.largest_fit, *ladder_loads(cap, space.loads))}
        if space.pads:  # and the largest a padding backend measures first (PADDED_FIRST)
            sizes.add(min(PADDED_FIRST, cap))
    else:
        sizes = {max(1, min(b, cap)) for b in (space.peak, 2 * space.peak, 4 * space.peak, space.largest_fit)}
    smaller = min(sizes) // 2
    while len(sizes) < COARSE_SIZES and smaller >= 2:  # the peak is at a cap: smaller maxima, which the server's per-request
        sizes.add(smaller)  # cost can favour, fill the pass instead
        smaller //= 2
    return sorted(sizes)


def ladder_loads(cap: int, loads: tuple[int, ...] = ()) -> list[int]:
    """The objective's ladder (objective.ladder when it has none of its own) up to `cap`."""
    return [c for c in (loads or tuple(ladder())) if c <= cap]


def coarse_grid(space: SearchSpace) -> list[OperatingPoint]:
    """Every layout x max batch with no queue delay and no preferred sizes. With a target load the peak's row first, so a
    short budget has compared every layout before it compares batch sizes; with no load the peak's row last, smaller
    maxima first: the start measured the peak already (with the rules' batcher settings), and a budget spent on a large
    peak's row could leave the small maxima, which the light loads of the ladder favour, unmeasured."""
    sizes = max_batches(space)
    nearest = min(sizes, key=lambda s: abs(s - space.peak))
    sizes.sort(key=lambda b: (b == nearest, b) if not space.concurrency else (b != nearest, b))
    return [OperatingPoint(b, (), 0, n, t) for b in sizes for n, t in layouts(space)]


def padded_later(point: OperatingPoint, space: SearchSpace) -> bool:
    """With no load given, whether a padding backend's max waits until the smaller ones were measured and refined."""
    return space.pads and not space.concurrency and not space.fixed_max and point.max_batch_size > PADDED_FIRST


def refinements(best: OperatingPoint, space: SearchSpace, measured: set[OperatingPoint], fill_delay: int | None = None) -> list[OperatingPoint]:
    """Variants around a good coarse point, likeliest gain first: a delay that fills the batch (`fill_delay_us`), a max
    halfway (in powers of two) to the next measured max when the gap is wider than 2x, the rules' queue delay, and the
    rules' preferred size (with and without the delay).

    Why this order: a budget often ends inside the refinement, so what moves a variant most comes first (a fill delay
    changes how full the batches are; a max between two measured ones can be the most robust; the rules' delay and
    preferred size move it least). A backend that pads (openvino) has no preferred size below its max tried: the
    batcher sends a batch when it reaches a preferred size and the backend computes max_batch_size rows for it, so such
    a variant does the work of a full batch for part of one."""
    fill: list[OperatingPoint] = []
    between: list[OperatingPoint] = []
    tuning: list[OperatingPoint] = []
    if space.batching and best.max_batch_size > 1:
        preferred = _reachable(space.peak, space)
        delay = space.rules_delay_us
        if fill_delay and not delay_tried(replace(best, queue_delay_us=fill_delay), measured):
            fill.append(replace(best, queue_delay_us=fill_delay))
        if delay:
            tuning.append(replace(best, queue_delay_us=delay))
        if 1 < preferred < best.max_batch_size and not space.pads:
            tuning.append(replace(best, preferred=(preferred,)))
            if delay:
                tuning.append(replace(best, preferred=(preferred,), queue_delay_us=delay))
    if space.batching and not space.fixed_max:
        sizes = sorted({p.max_batch_size for p in measured if p.instances == best.instances and p.threads == best.threads})
        above = [b for b in sizes if b > best.max_batch_size]
        below = [b for b in sizes if b < best.max_batch_size]
        if above and above[0] > 2 * best.max_batch_size and 2 * best.max_batch_size <= space.largest_fit:
            between.append(replace(best, max_batch_size=2 * best.max_batch_size))
        if below and below[-1] < best.max_batch_size // 2:
            half = best.max_batch_size // 2
            between.append(replace(best, max_batch_size=half, preferred=tuple(b for b in best.preferred if b <= half)))
    out = fill + between + tuning
    return [p for p in dict.fromkeys(out) if p not in measured and all(1 < b <= p.max_batch_size for b in p.preferred)]


def fill_delay_us(v: ServedVariant, space: SearchSpace) -> int | None:
    """A queue delay that lets the lightest load measured fill the batch, when the batcher formed clearly smaller batches
    there than that load could: a backend that pads every execution to max_batch_size (openvino) pays for a full batch
    either way. None when the batches already filled, or when the delay would not be longer than the variant's.

    Why: the rules' queue delay is sized from in-process timings and can be too short for concurrent clients' requests
    to meet in the server; a delay of a share of the light load's latency lets them. A batch can hold only the requests
    the other instances are not executing, so what a load "could" fill is its concurrency shared among the instances.

    With a target load N, none for a max that holds every one of N's requests (max x instances >= N): each batch would
    fill only with all N clients in it, and at N - 1 every batch waits the delay out, so such a config would serve
    clearly less just below (and above) the target. A smaller max whose batches fill from part of the load holds up
    around N. With no load given the ladder's lightest load is the least it is scored at and heavier loads fill the max
    from the excess, so there the delay stays (report.md says what a lone request pays for it)."""
    light = fill_level(v)
    if not space.batching or v.point.max_batch_size <= 1 or light is None:
        return None
    could = min(v.point.max_batch_size, -(-light.concurrency // v.point.instances))  # c in flight share the instances
    if light.server_batch is None or could <= 1 or light.server_batch >= 0.9 * could:
        return None
    if space.concurrency and v.point.max_batch_size * v.point.instances >= space.concurrency:
        return None  # the batches would fill only with every request of the target load in them (above)
    share = FILL_FULL_SHARE if could == v.point.max_batch_size else FILL_DELAY_SHARE
    delay = min(FILL_DELAY_MAX_US, max(100, 2 * space.rules_delay_us, int(round(light.p50_ms * 1000 * share, -2))))
    return delay if delay > v.point.queue_delay_us else None


def fill_level(v: ServedVariant) -> LoadLevel | None:
    """The lightest level measured where requests could meet in a batch (a lone client never forms one)."""
    return next((lv for lv in v.curve if lv.concurrency >= 2), None)


def delay_tried(point: OperatingPoint, measured: set[OperatingPoint]) -> bool:
    """Whether `point`, or the same config with a queue delay within SAME_DELAY of its own, was measured."""
    d = point.queue_delay_us
    return point in measured or bool(d) and any(
        m.queue_delay_us and abs(m.queue_delay_us - d) <= SAME_DELAY * d and replace(m, queue_delay_us=d) == point for m in measured)


def _reachable(size: int, space: SearchSpace) -> int:
    """A preferred size the target load can form (at most `concurrency` requests wait at once): the largest power of two within it."""
    if space.concurrency and size > space.concurrency:
        return 1 << (space.concurrency.bit_length() - 1)
    return size


def better(v: ServedVariant, best: ServedVariant | None, budget_ms: float | None, percentile: int = 95, top: float | None = None) -> bool:
    """Whether `v` should replace `best`: within the latency budget first, then throughput beyond the noise,
    then (throughput within the noise of `best` and of `top`, the most any variant served) a clearly lower
    latency; `top` keeps a chain of small losses from adding up."""
    if v.status != "measured" or v.throughput is None:
        return False
    if best is None or best.throughput is None:
        return True
    lat_v, lat_b = latency_at(v, percentile), latency_at(best, percentile)
    if budget_ms is not None:
        fits_v, fits_b = v.meets_budget is not False and lat_v <= budget_ms, best.meets_budget is not False and lat_b <= budget_ms
        if fits_v != fits_b:
            return fits_v
        if not fits_v:  # neither meets it: the one closer to it
            return lat_v < lat_b * (1 - LATENCY_GAIN)
    if v.throughput > best.throughput * (1 + THROUGHPUT_NOISE):
        return True
    floor = (1 - THROUGHPUT_NOISE) * max(best.throughput, top or 0.0)
    return v.throughput >= floor and lat_v < lat_b * (1 - LATENCY_GAIN)


def close(a: ServedVariant, b: ServedVariant) -> bool:
    """Whether two measured variants are within the noise of repeated measurement (then they are settled interleaved)."""
    if a.throughput is None or b.throughput is None:
        return False
    return abs(a.throughput - b.throughput) <= CLOSE * max(a.throughput, b.throughput)


def latency_at(v: ServedVariant, percentile: int) -> float:
    """The variant's latency at `percentile` at its scored load."""
    level = v.level(v.concurrency) if v.concurrency is not None else None
    if level is not None:
        return level.latency(percentile)
    return {50: v.p50_ms, 99: v.p99_ms}.get(percentile, v.p95_ms) or 0.0
