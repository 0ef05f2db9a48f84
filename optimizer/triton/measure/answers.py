"""The answer check both the served search and `validate` run: a served model answers the export's samples within the
export's tolerances, or (a bf16 / INT8 model) passes the export's accuracy gate in the same shape order."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from optimizer.errors import PublishError
from optimizer.model.samples import Feed
from optimizer.records.accuracy import AccuracyBudget
from optimizer.records.correctness import CorrectnessCase
from optimizer.task.accuracy_gate import judge, load_check, run_check, server_order
from optimizer.task.correctness import compare_outputs
from optimizer.triton.measure.client import infer_batched, max_batch, wire_dtype
from optimizer.triton.runtime.server import triton_message


@dataclass
class AnswerCheck:
    """The answers over one protocol, compared with the eager reference at every saved sample."""

    protocol: str
    passed: bool
    cases: list[dict[str, Any]] = field(default_factory=list)
    max_abs: float = 0.0
    max_rel: float = 0.0
    error: str = ""
    compared_with: str = "reference"  # "reference" (eager outputs) or "none" (no export report: shapes only)
    accuracy: dict[str, Any] | None = None  # AccuracyReport.to_json(): a bf16 / INT8 model judged by the export's gate


def accuracy_gate_of(result: Any) -> AccuracyBudget | None:
    """The accuracy budget the selected candidate was judged by, if it was (a bf16 or INT8 winner)."""
    try:
        correctness = result.selected_candidate.correctness
    except PublishError:
        return None
    return correctness.accuracy.budget if correctness is not None and correctness.accuracy is not None else None


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


CHECKED_REQUESTS = 8
"""Requests of distinct shapes whose padded answers are compared with their own."""


def answers_agree(server: Any, name: str, served: dict[str, Any], pairs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
                  tolerances: dict[str, Any] | None, cosine: float | None) -> str:
    """"" when every (request, padded request) pair gets the same answers, the padded outputs cut back to the request's own
    output shapes; else which output of which request differed. `cosine` (a reduced-precision model's accuracy budget)
    judges by cosine similarity instead of the elementwise tolerances."""
    from tritonclient.utils import InferenceServerException

    from optimizer.triton.measure import client  # looked up at each call: a test's made-up server replaces client.infer

    outputs = served.get("output", [])
    names = [o["name"] for o in outputs]
    dtypes = [wire_dtype(o["data_type"])[0].name for o in outputs]
    stacked: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {n: ([], []) for n in names}
    for k, (request, padded) in enumerate(pairs[:CHECKED_REQUESTS]):
        shape = "x".join(str(v.shape[1:] if v.ndim > 1 else v.shape) for v in request.values())
        try:
            own, long = client.infer(server, name, served, request), client.infer(server, name, served, padded)
        except InferenceServerException as err:
            return f"request {k} ({shape}): Triton answered {triton_message(err)}"
        cut = []
        for out_name, a, b in zip(names, own, long):
            if a.ndim != b.ndim or any(sb < sa for sa, sb in zip(a.shape, b.shape)):
                return f"output {out_name!r} of request {k} has shape {list(b.shape)} padded against {list(a.shape)}: it cannot be cut back"
            cut.append(b[tuple(slice(0, s) for s in a.shape)])
            stacked[out_name][0].append(a.astype(np.float64).ravel())
            stacked[out_name][1].append(cut[-1].astype(np.float64).ravel())
        if cosine is None:
            case = compare_outputs(f"request {k}", names, dtypes, cut, own, tolerances)
            if not case.passed:
                bad = next(o for o in case.outputs if not o.passed)
                return f"output {bad.name!r} of request {k} differs padded (max abs {bad.max_abs:.3g}, max rel {bad.max_rel:.3g})"
    if cosine is not None:  # a reduced-precision model: every request's answers of one output as one vector, as the gate judges
        for out_name, (own_all, cut_all) in stacked.items():
            x, y = np.concatenate(own_all), np.concatenate(cut_all)
            denom = float(np.linalg.norm(x) * np.linalg.norm(y))
            sim = float(x @ y / denom) if denom > 0 else float(np.array_equal(x, y))
            if sim < cosine:
                return f"output {out_name!r}: cosine {sim:.5f} padded against unpadded over {len(own_all)} requests, below {cosine:g}"
    return ""
