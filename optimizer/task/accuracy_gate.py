"""The accuracy gate: who among the bf16 and INT8 candidates may compete, judged against fp32 eager.

Elementwise tolerances say nothing useful about a quantized model (every element moves a little); users
reason about reduced precision in cosine similarity, max abs error and, for classifiers, top-1 agreement.
The gate also runs the shapes in a server-like order (short, long, and back) on ONE loaded model: OpenVINO
2026.2 in bf16 returns NaN at sequence length 128 after the same compiled model ran length 1, and a server
meets shapes in any order. `--accuracy-check module:function` lets a user score outputs their own way.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from optimizer.errors import SettingsError
from optimizer.records.accuracy import AccuracyBudget, AccuracyReport, OutputAccuracy

Outputs = dict[str, np.ndarray]


def parse_budget(text: str | None, check: str | None = None) -> AccuracyBudget:
    """--accuracy-budget COSINE[,TOP1] (each in (0, 1]; TOP1 defaults to 0.99) and --accuracy-check as one budget."""
    default = AccuracyBudget()
    if text is None or str(text).strip() == "":
        return AccuracyBudget(default.cosine, default.top1, check or None)
    parts = str(text).split(",")
    try:
        values = [float(p) for p in parts]
        if not 1 <= len(values) <= 2:
            raise ValueError
    except ValueError:
        raise SettingsError(f"--accuracy-budget {text!r} is not COSINE[,TOP1]; e.g. 0.999 or 0.995,0.98.") from None
    bad = [v for v in values if not 0 < v <= 1]
    if bad:
        raise SettingsError(f"--accuracy-budget {text!r}: {bad[0]:g} is outside (0, 1]; cosine similarity and top-1 agreement "
                            "are fractions, e.g. 0.999 or 0.995,0.98.")
    return AccuracyBudget(values[0], values[1] if len(values) == 2 else default.top1, check or None)


def server_order(sizes: Sequence[int]) -> list[int]:
    """Indices of the points from the smallest to the largest and back down: the shape order that exposes a runtime
    whose state from a short input spoils a long one (and the reverse)."""
    up = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    return up + up[-2::-1]


def is_class_scores(ref: np.ndarray, batching: bool) -> bool:
    """A float output of shape [batch, classes >= 2]: top-1 agreement means something for it."""
    return batching and ref.dtype.kind == "f" and ref.ndim == 2 and ref.shape[1] >= 2


def load_check(spec: str) -> Callable[[list[Outputs], list[Outputs]], Any]:
    """The user's `module:function` (or path/to/file.py:function); one SettingsError line when it cannot be imported."""
    from optimizer.errors import ModelLoadError
    from optimizer.model.source import import_target

    target, _, attr = str(spec).rpartition(":")
    if not target or not attr:
        raise SettingsError(f"--accuracy-check {spec!r} is not module:function or path/to/file.py:function.")
    try:
        module = import_target(target, spec)
    except ModelLoadError as err:
        raise SettingsError(f"--accuracy-check {spec!r}: {err}") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SettingsError(f"--accuracy-check {spec!r}: {target} has no function {attr!r}.")
    return fn


def check_on_reference(spec: str, reference_outputs: list[Outputs], names: list[str]) -> None:
    """Call the user's --accuracy-check with the reference as both arguments: one that raises or returns garbage
    is a SettingsError (exit 2) before anything is built."""
    outputs = [{n: o[n] for n in names} for o in reference_outputs]
    run_check(load_check(spec), spec, outputs, [dict(o) for o in outputs])


def run_check(fn: Callable[..., Any], spec: str, reference: list[Outputs], candidate: list[Outputs]) -> tuple[float, bool]:
    """Call the user's check; it must return (number, bool). Raising or returning anything else is a SettingsError
    that names the check and what it did (the run stops: a broken check cannot judge anything)."""
    try:
        value = fn(reference, candidate)
    except Exception as err:
        raise SettingsError(f"--accuracy-check {spec} raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}; "
                            "it gets (reference, candidate), two lists of {output name: array}, and returns (score, passed).") from err
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], (bool, np.bool_)) \
        and isinstance(value[0], (int, float, np.number)) and not isinstance(value[0], bool) and math.isfinite(float(value[0]))
    if not ok:
        raise SettingsError(f"--accuracy-check {spec} returned {value!r:.80}; it must return (score, passed): a finite number "
                            "and a bool, e.g. (0.9991, True).")
    return float(value[0]), bool(value[1])


def judge(names: Sequence[str], order: Sequence[str], reference: list[Outputs], candidate: list[Outputs],
          budget: AccuracyBudget, batching: bool) -> AccuracyReport:
    """The gate's verdict over every run (in the order they ran): per output the least cosine similarity of a run,
    the largest absolute error, and top-1 agreement over all rows of class-score outputs."""
    report = AccuracyReport(budget, order=list(order))
    for name in names:
        refs = [r[name] for r in reference]
        outs = [np.asarray(c[name]) for c in candidate]
        nan = any(bool(np.any(np.isnan(o.astype(np.float64)) != np.isnan(r.astype(np.float64)))) for o, r in zip(outs, refs))
        if any(r.dtype.kind not in "fc" for r in refs):  # integer / boolean outputs: agreement is all there is
            agree = float(np.mean(np.concatenate([(o == r).ravel() for o, r in zip(outs, refs)]))) if refs else 1.0
            report.outputs.append(OutputAccuracy(name, agree, _max_abs(outs, refs), agree, agree >= budget.top1, exact=True))
            continue
        cosine = min((_cosine(o, r) for o, r in zip(outs, refs)), default=1.0)
        top1 = None
        if refs and all(is_class_scores(r, batching) for r in refs):
            hits = np.concatenate([np.argmax(o, axis=1) == np.argmax(r, axis=1) for o, r in zip(outs, refs)])
            top1 = float(np.mean(hits))
        passed = cosine >= budget.cosine and (top1 is None or top1 >= budget.top1) and not nan
        note = "is NaN where the reference has a number" if nan else ""
        report.outputs.append(OutputAccuracy(name, cosine, _max_abs(outs, refs), top1, passed, note))
    return report


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors as flat vectors (NaN counts as 0.0: it fails any budget)."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    if x.shape != y.shape:
        return 0.0
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0 or not (math.isfinite(nx) and math.isfinite(ny)):
        return 0.0
    value = float(np.dot(x, y) / (nx * ny))
    return value if math.isfinite(value) else 0.0


def _max_abs(outs: list[np.ndarray], refs: list[np.ndarray]) -> float:
    worst = 0.0
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            return math.inf
        d = np.abs(o.astype(np.float64) - r.astype(np.float64))
        worst = max(worst, float(np.nan_to_num(d.max(), nan=math.inf)) if d.size else 0.0)
    return worst
