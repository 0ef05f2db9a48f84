"""Predicting the served throughput at loads the search did not measure, from the published variant's curve.

validate sweeps concurrencies the search never ran; a prediction there is a claim that can fail, unlike a second
measurement of the same config at the same load (repeatability, reported on its own). The model is Little's law
in a closed loop: with c requests in flight, throughput = c / latency, and the mean latency of a server that
serves requests one batch after another grows linearly with c (mean value analysis of one queue). So between two
measured loads the latency is interpolated linearly and the throughput follows from it; past the last measured load
the config is saturated and throughput stays flat.

Below the first measured load the latency line is extrapolated from the two lowest measured loads (one request's
cost bounds it from below when known), and kept between what Little's law allows: one request at a time is no slower
than c0 in flight, and throughput does not fall as the load grows, so r(1) lies in [r(c0) / c0, r(c0)] (both without
the batcher's wait, which alone makes a lone request slower than a full batch).

The dynamic batcher adds a wait the line does not carry: with fewer requests in flight than the largest batch (and no
preferred size they can form), a batch cannot fill and leaves only when its oldest request has waited the queue delay.
Closed-loop clients arrive together, so at such a load every request waits the whole delay; at a load that fills
batches none does. The wait is taken out of each measured latency before the line is drawn and put back at the load
predicted (a lone request to a batcher with a 300 us delay waits 300 us, which no in-process time shows).

A backend that pads (openvino: every execution computes max_batch_size rows) serves c requests in flight above the
max batch as ceil(c / max) full executions: c = 5 at max 4 costs what 8 do, so it serves throughput(8) * 5 / 8 (the
same rule the padding backend's max batch is chosen by, find_max_batch_size.every_load_max). Unless the queue delay
outlasts one execution of a full batch (the latency at c = max): then the requests left over wait for the others to
come back and every batch is full, so the latency line holds as for a backend that does not pad, and ceil(c / max)
executions would predict far less than such a config serves.
"""

from __future__ import annotations

from optimizer.records.served_search import LoadLevel, OperatingPoint


def batcher_wait_ms(point: OperatingPoint | None, concurrency: int) -> float:
    """The queue delay every request waits at `concurrency` when batches cannot fill there (0 when they can, or unknown)."""
    if point is None or not point.queue_delay_us or point.max_batch_size <= 1 or concurrency >= point.max_batch_size:
        return 0.0
    if any(p <= concurrency for p in point.preferred):  # a preferred size the requests in flight can form leaves at once
        return 0.0
    return point.queue_delay_us / 1000.0


def predict_throughput(curve: list[LoadLevel], concurrency: int, single_request_ms: float | None = None,
                       point: OperatingPoint | None = None, pads: bool = False) -> float | None:
    """Inferences/s the variant serves at `concurrency` (None without a curve); `point` is the variant's batcher, `pads`
    whether its backend computes a full batch for every execution."""
    if (pads and point is not None and concurrency > point.max_batch_size > 1 and concurrency % point.max_batch_size
            and not delay_fills(curve, point, single_request_ms)):
        rows = point.max_batch_size * -(-concurrency // point.max_batch_size)  # what ceil(c / max) full executions compute
        full = predict_throughput(curve, rows, single_request_ms, point)
        return full * concurrency / rows if full is not None else None
    measured = sorted((lv.concurrency, lv.concurrency * 1000.0 / lv.throughput) for lv in curve if lv.throughput)  # (c, mean ms)
    if not measured or concurrency < 1:
        return None
    if concurrency > measured[-1][0]:  # saturated: never extrapolated upward
        return max(lv.throughput for lv in curve if lv.throughput)
    line = [(c, max(r - batcher_wait_ms(point, c), 1e-6)) for c, r in measured]  # the latency without the batcher's wait
    if concurrency < line[0][0]:
        line.insert(0, (1, _first_latency(line, single_request_ms)))
    for (c0, r0), (c1, r1) in zip(line, line[1:]):
        if c0 <= concurrency <= c1:
            latency = r0 if c1 == c0 else r0 + (r1 - r0) * (concurrency - c0) / (c1 - c0)
            return concurrency * 1000.0 / (latency + batcher_wait_ms(point, concurrency))
    return concurrency * 1000.0 / (line[0][1] + batcher_wait_ms(point, concurrency))


def delay_fills(curve: list[LoadLevel], point: OperatingPoint, single_request_ms: float | None) -> bool:
    """Whether the queue delay outlasts one execution of a full batch (the latency at c = max, a load whose batches
    fill): a request left over then waits for the others to come back instead of going alone."""
    if not point.queue_delay_us:
        return False
    full = predict_throughput(curve, point.max_batch_size, single_request_ms, point)
    return bool(full) and point.queue_delay_us / 1000.0 >= point.max_batch_size * 1000.0 / full


def _first_latency(line: list[tuple[int, float]], single_request_ms: float | None) -> float:
    """The latency line (the batcher's wait taken out) at one request in flight, within Little's bounds on r(1)."""
    c0, r0 = line[0]
    if len(line) > 1:
        c1, r1 = line[1]
        guess = r0 - (r1 - r0) * (c0 - 1) / (c1 - c0)
        if single_request_ms and single_request_ms > 0:
            guess = max(guess, single_request_ms)
    else:  # one measured load: one request's cost, else the latency as measured
        guess = single_request_ms if single_request_ms and single_request_ms > 0 else r0
    return min(max(guess, r0 / c0), r0)
