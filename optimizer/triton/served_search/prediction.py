"""Predicting the served throughput at loads the search did not measure, from the published variant's curve.

validate sweeps concurrencies the search never ran; a prediction there is a claim that can fail, unlike a second
measurement of the same config at the same load (repeatability, reported on its own). The model is Little's law
in a closed loop: with c requests in flight, throughput = c / latency, and the mean latency of a server that
serves requests one batch after another grows linearly with c (mean value analysis of one queue). So between two
measured loads the latency is interpolated linearly and the throughput follows from it; below the first measured
load the latency of one request at a time (measured, else the server's cost per request plus the in-process time of a
batch of one) anchors the line; past the last measured load the config is saturated and throughput stays flat.
"""

from __future__ import annotations

from optimizer.records.served_search import LoadLevel


def predict_throughput(curve: list[LoadLevel], concurrency: int, single_request_ms: float | None = None) -> float | None:
    """Inferences/s the variant serves at `concurrency` (None without a curve)."""
    points = sorted((lv.concurrency, lv.concurrency * 1000.0 / lv.throughput) for lv in curve if lv.throughput)  # (c, mean latency ms)
    if not points or concurrency < 1:
        return None
    if concurrency > points[-1][0]:  # saturated: never extrapolated upward
        return max(lv.throughput for lv in curve if lv.throughput)
    if concurrency < points[0][0]:
        c0, r0 = points[0]
        r1 = min(single_request_ms, r0) if single_request_ms and single_request_ms > 0 else r0  # unknown: the latency stays as measured
        points.insert(0, (1, r1))
    for (c0, r0), (c1, r1) in zip(points, points[1:]):
        if c0 <= concurrency <= c1:
            latency = r0 if c1 == c0 else r0 + (r1 - r0) * (concurrency - c0) / (c1 - c0)
            return concurrency * 1000.0 / latency
    return concurrency * 1000.0 / points[0][1]
