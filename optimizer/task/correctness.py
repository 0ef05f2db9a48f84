"""Compare a candidate's outputs with the reference: names, then shapes, then values, per-dtype tolerances.

Every output's max absolute and relative error is reported before deciding, so a rejection
always says by how much it missed.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Sequence

import numpy as np

from optimizer.records.correctness import CorrectnessCase, OutputError, Tolerance

DEFAULT_TOLERANCES: MappingProxyType[str, Tolerance] = MappingProxyType(
    {
        "float32": Tolerance(1e-4, 1e-4),
        "float64": Tolerance(1e-7, 1e-7),
        "float16": Tolerance(1e-2, 1e-2),
        "bfloat16": Tolerance(5e-2, 5e-2),
    }
)
"""fp32 backends agree with eager PyTorch far inside these bounds (they differ only in the order of operations); the bounds
leave room for fused kernels yet reject real bugs."""

EXACT = Tolerance(0.0, 0.0)
"""Integer and boolean outputs must match exactly."""


SCALE_SHARE = 0.1
"""An output whose every reference value is below the default atol passes any answer of that size (a randomly initialised
network can answer orders of magnitude below fp32's atol): there, the largest error must also stay under this share of
the output's largest |reference| value. A wrong answer misses by about its whole scale, fp32 reordering by a tiny
fraction of it. A tolerance the user gives, or a reduced precision's, is applied as given."""


REDUCED_PRECISION_DTYPE = MappingProxyType({"fp16": "float16", "bf16": "bfloat16"})
"""The dtype whose tolerance applies to float outputs of a candidate built at a reduced --precision."""


def precision_tolerances(signature: Any, precision: str, overrides: dict[str, Tolerance] | None = None) -> dict[str, Tolerance]:
    """Tolerance overrides for a candidate that computes in `precision` but returns float32.

    Its float outputs are judged like outputs of the reduced dtype (fp16: atol/rtol 1e-2), integer
    outputs stay exact; the user's own overrides (per output, or "" for all) always win.
    """
    overrides = dict(overrides or {})
    if precision not in REDUCED_PRECISION_DTYPE or "" in overrides:
        return overrides
    loose = DEFAULT_TOLERANCES[REDUCED_PRECISION_DTYPE[precision]]
    reduced = {t.name: loose for t in signature.outputs if t.dtype.name in ("float32", "float64")}
    return {**reduced, **overrides}


def parse_tolerances(specs: list[str]) -> dict[str, Tolerance]:
    """--tolerance values: "ATOL[,RTOL]" for every output (key ""), "NAME=ATOL[,RTOL]" for one; RTOL defaults to ATOL."""
    from optimizer.errors import SettingsError

    out: dict[str, Tolerance] = {}
    for spec in specs:
        name, _, numbers = spec.rpartition("=")
        try:
            values = [float(v) for v in numbers.split(",")]
            if not 1 <= len(values) <= 2 or any(v < 0 or v != v for v in values):
                raise ValueError
        except ValueError:
            raise SettingsError(f"--tolerance {spec!r} is not [NAME=]ATOL[,RTOL] with non-negative numbers; e.g. 1e-3 or logits=1e-3,1e-2.") from None
        out[name.strip()] = Tolerance(values[0], values[-1])
    return out


def tolerance_for(dtype: str, name: str, overrides: dict[str, Tolerance] | None = None) -> Tolerance:
    """Per-output override first (key = output name), then the "" default override, then the per-dtype default."""
    overrides = overrides or {}
    if name in overrides:
        return overrides[name]
    if "" in overrides:
        return overrides[""]
    return DEFAULT_TOLERANCES.get(dtype, EXACT)


def compare_outputs(
    point: str,
    names: Sequence[str],
    dtypes: Sequence[str],
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    overrides: dict[str, Tolerance] | None = None,
) -> CorrectnessCase:
    """One case: names (count), then shapes, then values; NaN where the reference has none fails."""
    results = []
    if len(actual) != len(expected):
        return CorrectnessCase(
            point,
            [OutputError("*", False, float("inf"), float("inf"), 0, 0, False, f"{len(actual)} outputs, expected {len(expected)}")],
        )
    for name, dtype, a, e in zip(names, dtypes, actual, expected):
        tol = tolerance_for(dtype, name, overrides)
        a = np.asarray(a)
        e = np.asarray(e)
        if a.shape != e.shape:
            results.append(OutputError(name, False, float("inf"), float("inf"), tol.atol, tol.rtol, False, f"shape {list(a.shape)}, expected {list(e.shape)}"))
            continue
        if a.size == 0:
            results.append(OutputError(name, True, 0.0, 0.0, tol.atol, tol.rtol, True))
            continue
        af = a.astype(np.float64)
        ef = e.astype(np.float64)
        nan_mismatch = bool(np.any(np.isnan(af) != np.isnan(ef)))
        finite = ~(np.isnan(af) | np.isnan(ef))
        with np.errstate(invalid="ignore"):
            diff = np.where(af == ef, 0.0, np.abs(af - ef))[finite] if finite.any() else np.zeros(1)
        rel = diff / np.maximum(np.abs(ef[finite]), 1e-12) if finite.any() else np.zeros(1)
        inf_mismatch = bool(np.any(np.isinf(af[finite]) & (af[finite] != ef[finite]))) if finite.any() else False
        with np.errstate(invalid="ignore"):
            ok = bool(np.all(diff <= tol.atol + tol.rtol * np.abs(ef[finite]))) if finite.any() else True
        max_abs = float(np.nan_to_num(diff.max(), nan=np.inf)) if diff.size else 0.0
        max_rel = float(np.nan_to_num(rel.max(), nan=np.inf)) if rel.size else 0.0
        note = "NaN where the reference has a number (or the reverse)" if nan_mismatch else ("infinity mismatch" if inf_mismatch else "")
        scale = float(np.abs(ef[finite]).max()) if finite.any() else 0.0
        chosen = bool(overrides) and (name in overrides or "" in overrides)  # a --tolerance the user gave is theirs to loosen
        if ok and not chosen and 0.0 < scale < tol.atol and max_abs > SCALE_SHARE * scale:
            ok = False
            note = (f"every reference value is below atol {tol.atol:g} (largest {scale:.3g}), and the answer misses by "
                    f"{max_abs / scale:.3g} of that scale (at most {SCALE_SHARE:g})")
        results.append(OutputError(name, True, max_abs, max_rel, tol.atol, tol.rtol, ok and not nan_mismatch and not inf_mismatch, note))
    return CorrectnessCase(point, results)
