"""Accuracy-gate records: the budget a reduced-precision candidate is judged by, and the figures that judged it.

Kept apart from the elementwise tolerances (records/correctness.py): fp32 candidates are judged by those,
bf16 and INT8 candidates by this gate, and a candidate that fails keeps its figures in the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class AccuracyBudget:
    """--accuracy-budget and --accuracy-check: the least cosine similarity and top-1 agreement a candidate may show
    against fp32 eager, or the user's own check (`module:function`), which then decides instead."""

    cosine: float = 0.999
    top1: float = 0.99
    check: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> AccuracyBudget:
        return cls(**d) if d else cls()


@dataclass
class OutputAccuracy:
    """One output over every run of the check: the least cosine similarity of a run, the largest absolute error,
    and for class-score outputs ([batch, classes]) the share of rows whose arg-max agrees with the reference.
    An integer or boolean output (`exact`: class indices, token ids, masks) is judged by the share of its values that
    equal the reference's, held in `cosine` and `top1` alike and measured against the top-1 budget."""

    name: str
    cosine: float
    max_abs: float
    top1: float | None = None
    passed: bool = True
    note: str = ""
    exact: bool = False


@dataclass
class AccuracyReport:
    """The gate's verdict: per-output figures, the order the shapes were run in, and the user's check if any."""

    budget: AccuracyBudget
    outputs: list[OutputAccuracy] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # correctness points in the order one loaded model ran them
    check_score: float | None = None
    check_passed: bool | None = None

    @property
    def passed(self) -> bool:
        if any("NaN" in o.note for o in self.outputs):  # no user check accepts a NaN the reference does not have
            return False
        if self.check_passed is not None:
            return self.check_passed
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    @property
    def cosine(self) -> float:
        """The least cosine similarity of any floating-point output."""
        return min((o.cosine for o in self.outputs if not o.exact), default=1.0)

    @property
    def agreement(self) -> float | None:
        """The least share of equal values of any integer or boolean output; None when there is none."""
        return min((o.cosine for o in self.outputs if o.exact), default=None)

    def summary(self) -> str:
        """What report lines show: "cosine X", plus the integer outputs' agreement when there are any."""
        agree = self.agreement
        parts = [f"cosine {self.cosine:.6f}"] if any(not o.exact for o in self.outputs) or agree is None else []
        return ", ".join(parts + ([f"integer outputs agree {agree:.6f}"] if agree is not None else []))

    @property
    def reason(self) -> str:
        """Why it failed, with the figures; empty when it passed."""
        if self.passed:
            return ""
        nan = next((o for o in self.outputs if "NaN" in o.note), None)
        if nan is not None:
            return f"accuracy gate: output {nan.name!r} {nan.note} (shapes run in the order {' -> '.join(self.order)})"
        if self.check_passed is False:
            return f"accuracy gate: --accuracy-check {self.budget.check} rejected it (score {self.check_score:.6g})"
        bad = next(o for o in self.outputs if not o.passed)
        if bad.exact:
            return (f"accuracy gate: output {bad.name!r} equals the reference in {bad.cosine:.4f} of its integer values "
                    f"(needs >= {self.budget.top1:g}, the top-1 budget), max abs error {bad.max_abs:.3g}")
        top1 = f", top-1 agreement {bad.top1:.4f} (needs >= {self.budget.top1:g})" if bad.top1 is not None else ""
        return (f"accuracy gate: output {bad.name!r} cosine {bad.cosine:.6f} (needs >= {self.budget.cosine:g}){top1}, "
                f"max abs error {bad.max_abs:.3g}")

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "budget": self.budget.to_json(), "order": list(self.order),
                "outputs": [asdict(o) for o in self.outputs], "check_score": self.check_score, "check_passed": self.check_passed}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AccuracyReport:
        return cls(AccuracyBudget.from_json(d.get("budget")), [OutputAccuracy(**o) for o in d.get("outputs", [])],
                   list(d.get("order", [])), d.get("check_score"), d.get("check_passed"))
