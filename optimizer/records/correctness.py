"""Correctness records: a tolerance, how each output compared at each shape point, and the verdict.

Thresholds (`Tolerance`) are kept apart from results, so a stored result can be judged again
without re-running; a report is truthy when it passed. One JSON form for tolerances
(`{output or "": [atol, rtol]}`) serves the build jobs, the report and validation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from optimizer.records.accuracy import AccuracyReport


@dataclass(frozen=True)
class Tolerance:
    """Pass when |actual - expected| <= atol + rtol * |expected| everywhere."""

    atol: float
    rtol: float

    def to_json(self) -> list[float]:
        return [self.atol, self.rtol]


def tolerances_to_json(tolerances: Mapping[str, Tolerance]) -> dict[str, list[float]]:
    """{output (or "" for all): [atol, rtol]}: the one serialized form of tolerance overrides."""
    return {name: t.to_json() for name, t in tolerances.items()}


def tolerances_from_json(data: Mapping[str, Any] | None) -> dict[str, Tolerance]:
    """The inverse of tolerances_to_json."""
    return {name: Tolerance(float(pair[0]), float(pair[1])) for name, pair in (data or {}).items()}


@dataclass
class OutputError:
    """How one output compared at one shape point."""

    name: str
    shape_ok: bool
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool
    note: str = ""


@dataclass
class CorrectnessCase:
    """All outputs at one shape point."""

    point: str
    outputs: list[OutputError]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


@dataclass
class CorrectnessReport:
    """Every case; truthy when all passed. `reason` names the worst failure. A reduced-precision candidate carries
    `accuracy`, the gate's verdict, which then decides instead of the cases' elementwise tolerances."""

    cases: list[CorrectnessCase] = field(default_factory=list)
    error: str = ""
    accuracy: AccuracyReport | None = None

    @property
    def passed(self) -> bool:
        if self.accuracy is not None:
            return not self.error and bool(self.cases) and self.accuracy.passed
        return not self.error and bool(self.cases) and all(c.passed for c in self.cases)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for c in self.cases for o in c.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for c in self.cases for o in c.outputs), default=0.0)

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        if self.accuracy is not None:
            return self.accuracy.reason
        for c in self.cases:
            for o in c.outputs:
                if not o.passed:
                    detail = o.note or f"max abs error {o.max_abs:.3g}, max rel error {o.max_rel:.3g} (atol {o.atol:g}, rtol {o.rtol:g})"
                    return f"output {o.name!r} differs from the reference at {c.point}: {detail}"
        return ""

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "error": self.error,
            "cases": [{"point": c.point, "outputs": [asdict(o) for o in c.outputs]} for c in self.cases],
            **({"accuracy": self.accuracy.to_json()} if self.accuracy is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CorrectnessReport:
        cases = [CorrectnessCase(c["point"], [OutputError(**o) for o in c["outputs"]]) for c in d.get("cases", [])]
        accuracy = AccuracyReport.from_json(d["accuracy"]) if d.get("accuracy") else None
        return cls(cases, d.get("error", ""), accuracy)
