"""The shared ground truth of a run: correctness feeds, the reference's outputs for them, the profiling feeds, the traffic.

Written once by the parent as .npz files that every candidate's process reads; kept with the
report so `validate` can later send the same samples and the same traffic through Triton.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optimizer.errors import SignatureError
from optimizer.model.reference import run_reference
from optimizer.model.samples import Feed, correctness_points, generate_feed, save_feeds, tile_feed
from optimizer.model.signature import Signature
from optimizer.model.loaded_model import LoadedModel
from optimizer.model.traffic import Traffic, save_traffic
from optimizer.records.reference_set import ReferenceSet


def prepare_reference(model: LoadedModel, signature: Signature, user_feeds: list[Feed], directory: Path, traffic: Traffic | None = None) -> ReferenceSet:
    """Generated feeds at every correctness point, plus the user's samples, run through the reference; the profiling feeds
    are the traffic's median request (the curve), its p90 request (the tail at the peak) and its largest (whether a batch
    fits), each one row. Correctness keeps the min and max of every dynamic axis whatever the traffic."""
    directory.mkdir(parents=True, exist_ok=True)
    feeds: list[Feed] = []
    labels: list[str] = []
    for i, point in enumerate(correctness_points(signature)):
        feeds.append(generate_feed(signature, point, seed=100 + i))
        labels.append(point.label)
    for i, feed in enumerate(user_feeds):
        feeds.append(feed)
        labels.append(f"samples[{i}]")
    outputs = [dict(zip(signature.output_names, run_reference(model, signature.input_names, f))) for f in feeds]
    for label, feed, out in zip(labels, feeds, outputs):
        for name, value in out.items():
            if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                source = "your --samples" if label.startswith("samples") else "generated samples"
                raise SignatureError(
                    f"the model returns NaN or infinity in output {name!r} for {source} ({label}), so nothing can be checked "
                    "against it; give --samples with real data, or a --value-range that keeps the model finite."
                )
    if traffic is not None:
        profile = [traffic.representative(signature, 0.5), traffic.representative(signature, 0.9), traffic.largest(signature)]
    else:
        base = user_feeds[0] if user_feeds else generate_feed(signature, correctness_points(signature)[-1], seed=7)
        profile = [base]
    profile = [tile_feed(f, 1) if signature.batching else f for f in profile]
    paths = ReferenceSet(str(directory / "samples.npz"), str(directory / "reference_outputs.npz"), labels, str(directory / "profile_feed.npz"),
                         str(directory / "traffic.npz") if traffic is not None else None)
    save_feeds(Path(paths.feeds), feeds)
    save_feeds(Path(paths.outputs), outputs)
    save_feeds(Path(paths.profile_feed), profile)
    if traffic is not None:
        save_traffic(Path(paths.traffic), traffic)  # a trace's timestamps beside it
    return paths
