"""The checks a served model must pass: right answers on the saved samples, an oversize batch refused, a fitting perf window."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from optimizer.model.samples import Feed, load_feeds, tile_feed
from optimizer.records.accuracy import AccuracyBudget
from optimizer.records.correctness import CorrectnessCase
from optimizer.records.triton_platforms import PLATFORMS
from optimizer.task.accuracy_gate import judge, load_check, run_check, server_order
from optimizer.task.correctness import compare_outputs
from optimizer.triton.perf_analyzer import PerfSettings
from optimizer.triton.server import triton_message
from optimizer.triton.validation.client import infer, infer_batched, max_batch, wire_dtype
from optimizer.triton.validation.expectation import ExportReference
from optimizer.triton.validation.record import AnswerCheck

WINDOW_REQUESTS = 20
"""perf_analyzer windows are sized to hold about this many requests at concurrency 1."""
MAX_WINDOW_MS = 6000


def served_names(reference: ExportReference, served: dict[str, Any]) -> dict[str, str]:
    """Exported tensor name -> the name the served config uses (they differ on positional platforms such as torch_aoti,
    also when the local server serves one through a translated config that names only the backend)."""
    platform = PLATFORMS.get(served.get("platform") or served.get("backend") or "")
    positional = [f"INPUT__{i}" for i in range(len(reference.input_names))]
    by_name = [i.get("name") for i in served.get("input", [])] == positional != reference.input_names
    if not by_name and (platform is None or not platform.positional_io):
        return {}
    return {**{n: f"INPUT__{i}" for i, n in enumerate(reference.input_names)},
            **{n: f"OUTPUT__{i}" for i, n in enumerate(reference.output_names)}}


def reference_feeds(reference: ExportReference | None, served: dict[str, Any]) -> tuple[list[Feed], list[Feed] | None, list[str]]:
    """The export's feeds and reference outputs, or (no report) one feed made from the config's dims."""
    if reference is not None:
        feeds, outputs = load_feeds(reference.feeds), load_feeds(reference.outputs)
        points = reference.points if len(reference.points) == len(feeds) else [f"sample[{i}]" for i in range(len(feeds))]
        rename = served_names(reference, served)
        feeds = [{rename.get(k, k): a for k, a in f.items()} for f in feeds]
        outputs = [{rename.get(k, k): a for k, a in o.items()} for o in outputs]
        return feeds, outputs, points
    batching = max_batch(served) > 0
    rng = np.random.default_rng(0)
    feed = {}
    for spec in served.get("input", []):
        dims = [1 if int(d) < 0 else int(d) for d in spec.get("dims", [])]
        shape = ([1] if batching else []) + dims
        dt, _ = wire_dtype(spec["data_type"])
        if dt == np.dtype(object):  # TYPE_STRING: short UTF-8 text, as a client would send
            feed[spec["name"]] = np.full(shape, b"aitune", dtype=object)
        else:
            feed[spec["name"]] = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt)
    return [feed], None, ["generated from config"]


def check_answers(client: Any, protocol: str, name: str, served: dict[str, Any], feeds: list[Feed],
                  expected: list[Feed] | None, points: list[str], tolerances: dict[str, Any] | None = None,
                  accuracy: AccuracyBudget | None = None) -> AnswerCheck:
    """Send every saved sample and compare with the eager reference (same tolerances as the optimizer). A bf16 or INT8
    model (`accuracy` given) is judged by the export's accuracy gate instead, its samples sent short to long and back
    as the export's check ran them: the served model must not fall into a shape-order trap the export avoided."""
    from tritonclient.utils import InferenceServerException

    outputs = served.get("output", [])
    names = [o["name"] for o in outputs]
    dtypes = [wire_dtype(o["data_type"])[0].name for o in outputs]
    check = AnswerCheck(protocol, True, compared_with="reference" if expected is not None else "none")
    gated = accuracy is not None and expected is not None
    order = server_order([sum(int(a.size) for a in f.values()) for f in feeds]) if gated else list(range(len(feeds)))
    ran, got, wanted_all, seen = [], [], [], set()
    for i in order:
        point = (points[i] if i < len(points) else f"sample[{i}]") + (" (again)" if i in seen else "")
        seen.add(i)
        feed = feeds[i]
        try:
            actual = infer_batched(client, name, served, feed)
        except InferenceServerException as err:
            check.passed, check.error = False, f"at {point}, Triton answered: {triton_message(err)}"
            return check
        if expected is None:
            case = _shape_case(point, names, dtypes, actual, feed, served)
        else:
            missing = [n for n in names if n not in expected[i]]
            if missing:
                check.passed, check.error = False, f"the served outputs {names} are not the exported ones {sorted(expected[i])}"
                return check
            wanted = [as_served(expected[i][o["name"]], o, max_batch(served) > 0) for o in outputs]
            case = compare_outputs(point, names, dtypes, actual, wanted, tolerances)
            ran.append(point)
            got.append(dict(zip(names, actual)))
            wanted_all.append(dict(zip(names, wanted)))
        check.cases.append({"point": case.point, "passed": case.passed, "outputs": [asdict(o) for o in case.outputs]})
        finite = [o for o in case.outputs if o.shape_ok]
        check.max_abs = max([check.max_abs, *(o.max_abs for o in finite)])
        check.max_rel = max([check.max_rel, *(o.max_rel for o in finite)])
        if not gated and not case.passed and check.passed:
            worst = next(o for o in case.outputs if not o.passed)
            detail = worst.note or f"max abs error {worst.max_abs:.3g}, max rel error {worst.max_rel:.3g} (atol {worst.atol:g}, rtol {worst.rtol:g})"
            check.passed, check.error = False, f"output {worst.name!r} at {point}: {detail}"
    if gated:
        verdict = judge(names, ran, wanted_all, got, accuracy, max_batch(served) > 0)
        if accuracy.check:
            verdict.check_score, verdict.check_passed = run_check(load_check(accuracy.check), accuracy.check, wanted_all, got)
        check.accuracy = verdict.to_json()
        if not verdict.passed:
            check.passed, check.error = False, verdict.reason
    return check


def as_served(reference: np.ndarray, spec: dict[str, Any], batching: bool) -> np.ndarray:
    """The reference output in the shape clients receive: an output with `reshape` is produced in the reshape's shape
    and served in the config's dims (a per-sample scalar with `dims: [1] reshape { shape: [] }` arrives as [batch, 1])."""
    if "reshape" not in spec:
        return reference
    dims = [int(d) for d in spec.get("dims", [])]
    shape = ([reference.shape[0]] if batching and reference.ndim else []) + dims
    if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) != reference.size:
        return reference  # dynamic dims or a different element count: compared as is, and the shape check says so
    return reference.reshape(shape)


def _shape_case(point: str, names: list[str], dtypes: list[str], actual: list[np.ndarray], feed: Feed, served: dict[str, Any]) -> CorrectnessCase:
    """Without a reference: every output has the config's dtype and dims (batch axis = the request's)."""
    from optimizer.records.correctness import OutputError

    batch = [next(iter(feed.values())).shape[0]] if max_batch(served) > 0 else []
    results = []
    for spec, name, dtype, arr in zip(served.get("output", []), names, dtypes, actual):
        dims = batch + [int(d) for d in spec.get("dims", [])]
        ok = arr.dtype.name == dtype and len(arr.shape) == len(dims) and all(d < 0 or d == s for d, s in zip(dims, arr.shape))
        note = "" if ok else f"{arr.dtype.name}{list(arr.shape)}, config says {dtype}{dims}"
        results.append(OutputError(name, ok, 0.0, 0.0, 0.0, 0.0, ok, note))
    return CorrectnessCase(point, results)


def check_oversize(client: Any, name: str, served: dict[str, Any], feed: Feed) -> dict[str, Any] | None:
    """A request of max_batch_size + 1 must be refused (None for a model that does not batch)."""
    from tritonclient.utils import InferenceServerException

    mbs = max_batch(served)
    if mbs <= 0:
        return None
    batch = mbs + 1
    try:
        infer(client, name, served, tile_feed(feed, batch))
    except InferenceServerException as err:
        return {"batch": batch, "refused": True, "message": triton_message(err), "note": ""}
    return {"batch": batch, "refused": False, "message": "",
            "note": f"a batch of {batch} was accepted although max_batch_size is {mbs}; the config does not limit what clients may send."}


def window_for(settings: PerfSettings, request_ms: float | None) -> int:
    """A perf_analyzer window long enough for about WINDOW_REQUESTS requests at concurrency 1 (a slow model
    needs longer windows to settle), never shorter than the settings' own, at most MAX_WINDOW_MS."""
    if not request_ms:
        return settings.measurement_interval_ms
    wanted = int(round(WINDOW_REQUESTS * request_ms / 100.0)) * 100
    return max(settings.measurement_interval_ms, min(MAX_WINDOW_MS, wanted))
